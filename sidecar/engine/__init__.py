"""The engine: runs generation requests on a llama.cpp context and streams events back."""

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.contract import BackendSnapshot
from sidecar.engine.engine import Engine
from sidecar.backend.phase import EnginePhase
from sidecar.backend.requests import (
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
from sidecar.backend.sampling import SamplingConfig
from sidecar.native.grammar import json_schema_grammar

__all__ = [
    "Engine",
    "EngineConfig",
    "EnginePhase",
    "BackendSnapshot",
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
