"""The HTTP calls on the model that are not generations: OpenAI's /v1/embeddings, and llama-server's
/tokenize, /detokenize and /props, which plugins written against llama-server call to count
tokens before sending and to learn the context size.

They run on the engine thread between passes (model_calls.py), as gRPC's Embed and Tokenize do.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import Field

from sidecar.api import pb
from sidecar.backend.contract import local_model
from sidecar.errors import InvalidArgument
from sidecar.service.core import SidecarService
from sidecar.service.openai_http.request_models import TokenIds, _Body

EmbeddingInput = Union[str, Annotated[list[str], Field(min_length=1)], TokenIds, Annotated[list[TokenIds], Field(min_length=1)]]


class EmbeddingRequest(_Body):
    input: EmbeddingInput
    model: str | None = None
    # The official Python client asks for base64 unless told otherwise, and decodes it itself.
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[Annotated[int, Field(ge=0, le=2**31 - 1)]]


def _inputs(body: EmbeddingRequest) -> list[str | list[int]]:
    value = body.input
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [list(value)]
    return [v if isinstance(v, str) else list(v) for v in value]


async def embeddings(core: SidecarService, body: EmbeddingRequest, model_id: str) -> dict:
    inputs = _inputs(body)
    vectors, tokens = await core.call_model(lambda m: m.embed(inputs))
    width = len(vectors[0]) if vectors else 0
    if body.dimensions is not None and body.dimensions != width:
        raise InvalidArgument(f"dimensions: this model's embeddings have {width}; it cannot shorten them")
    data = []
    for i, vector in enumerate(vectors):
        value: object = vector
        if body.encoding_format == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


async def tokenize(core: SidecarService, body: TokenizeRequest) -> dict:
    reply = await core.tokenize(pb.TokenizeRequest(text=body.content, add_special=body.add_special,
                                                   parse_special=body.parse_special))
    tokens = list(reply.tokens)
    if not body.with_pieces:
        return {"tokens": tokens}
    pieces = await core.call_model(lambda m: m.pieces(tokens))
    # As llama-server gives them: the text, or the bytes where a token holds part of a character.
    return {"tokens": [{"id": t, "piece": _piece(p)} for t, p in zip(tokens, pieces)]}


def _piece(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


async def detokenize(core: SidecarService, body: DetokenizeRequest) -> dict:
    reply = await core.detokenize(pb.DetokenizeRequest(tokens=body.tokens))
    return {"content": reply.text}


def props(core: SidecarService, model_id: str) -> dict:
    """What llama-server's /props tells a client that plugins read: the context a conversation has,
    the slots, the template, and this daemon's own limits."""
    backend = core.ready_backend()
    limits = backend.limits
    model = local_model(backend)
    return {
        "model_alias": model_id,
        "model_path": backend.facts.path,
        # Conversations the KV holds at once; null where the model runs on another server.
        "total_slots": model.config.n_seq if model is not None else None,
        "chat_template": backend.facts.chat_template,
        "modalities": {"vision": limits.vision},
        "default_generation_settings": {"n_ctx": limits.context_per_sequence},
        "max_prompt_tokens": limits.max_prompt_tokens,
        "max_tokens_per_request": limits.max_tokens_per_request,
        "build_info": f"xlm-sidecar {core.info.version}",
    }
