"""What a remote server says about the model it serves (GET /models), as the status RPC shows it."""

from __future__ import annotations

from sidecar.backend.contract import ModelFacts

# The architecture the status RPC reports in remote mode: the model is not ours to inspect.
REMOTE_ARCHITECTURE = "remote"


def remote_model_facts(url: str, models: object, wanted: str | None) -> ModelFacts:
    """ModelFacts for the model `wanted` (or the server's first one) from a /models answer.

    `path` is the server's URL, so status tells where generation runs. Sizes come from what the
    server volunteers: llama.cpp's server adds a `meta` object (parameters, bytes, trained context),
    vLLM a `max_model_len`; anything unsaid is 0.
    """
    entries = models.get("data") if isinstance(models, dict) else None
    entries = [e for e in entries or [] if isinstance(e, dict) and isinstance(e.get("id"), str)]
    entry = next((e for e in entries if wanted is None or e["id"] == wanted), None)
    if entry is None:
        return unknown_model_facts(url, wanted)
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    return ModelFacts(
        path=url,
        name=entry["id"],
        architecture=REMOTE_ARCHITECTURE,
        parameters=_int(meta.get("n_params")),
        file_bytes=_int(meta.get("size")),
        trained_context=_int(meta.get("n_ctx_train")) or _int(entry.get("max_model_len")),
        layers=0,
        experts=0,
        chat_template="",
    )


def unknown_model_facts(url: str, name: str | None) -> ModelFacts:
    """Facts for a server that did not answer /models (yet): its URL and the name we were told."""
    return ModelFacts(url, name or "", REMOTE_ARCHITECTURE, 0, 0, 0, 0, 0, "")


def _int(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0
