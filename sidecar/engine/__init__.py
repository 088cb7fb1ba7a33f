"""The engine: runs generation requests on a llama.cpp context and streams events back."""

from sidecar.engine.config import EngineConfig
from sidecar.engine.engine import Engine, EngineSnapshot
from sidecar.engine.phase import EnginePhase
from sidecar.engine.requests import (
    Event,
    Finished,
    FinishReason,
    GenerationSpec,
    Job,
    Prompt,
    TextDelta,
    Timings,
    Usage,
)
from sidecar.engine.sampling import SamplingConfig, json_schema_grammar

__all__ = [
    "Engine",
    "EngineConfig",
    "EnginePhase",
    "EngineSnapshot",
    "Event",
    "Finished",
    "FinishReason",
    "GenerationSpec",
    "Job",
    "Prompt",
    "SamplingConfig",
    "TextDelta",
    "Timings",
    "Usage",
    "json_schema_grammar",
]
