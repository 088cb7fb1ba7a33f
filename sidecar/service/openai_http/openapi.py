"""The OpenAPI 3.1 document of the HTTP API, served at /openapi.json and fuzzed by schemathesis.

Schemas come from the same pydantic models that validate requests and describe replies, so the
document cannot drift from what the server checks.
"""

from __future__ import annotations

import copy
import functools

from pydantic.json_schema import models_json_schema

from sidecar import __version__
from sidecar.service.openai_http import model_routes as mr
from sidecar.service.openai_http import request_models as rq
from sidecar.service.openai_http import response_models as rs

_REF = "#/components/schemas/{model}"


def _json(name: str) -> dict:
    return {"application/json": {"schema": {"$ref": _REF.format(model=name)}}}


def _errors(*statuses: int) -> dict:
    reasons = {400: "bad request", 401: "missing or wrong token", 403: "a browser origin --cors-origin does not allow",
               404: "unknown model, session or route", 413: "body too large", 429: "queue or sessions full",
               500: "internal error", 501: "not implemented", 503: "shutting down, or the model still loading (retry)"}
    return {str(s): {"description": reasons[s], "content": _json("ErrorResponse")} for s in statuses}


_GENERATION_ERRORS = (400, 401, 403, 404, 413, 429, 500, 501, 503)
_SECURED = [{"bearer": []}]
_SESSION_HEADER = {
    "name": "X-Session-Id", "in": "header", "required": False,
    "description": "the NPC's session: keeps its conversation and KV cache between turns (or the body's `user`)",
    "schema": {"type": "string", "maxLength": 128},
}


# One server-sent event: its data is a chunk object as JSON text, the last one "[DONE]".
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "description": "chat.completion.chunk or text_completion JSON, or [DONE]"},
    },
}


_CLAMPED_HEADER = {"X-Max-Tokens-Clamped": {
    "description": "max_tokens (or max_completion_tokens) was above --max-tokens-per-request and was lowered to it",
    "schema": {"type": "integer"},
}}


def _generation(request: str, reply: str, summary: str) -> dict:
    return {"post": {
        "summary": summary,
        "security": _SECURED,
        "parameters": [_SESSION_HEADER],
        "requestBody": {"required": True, "content": _json(request)},
        "responses": {
            "200": {"description": "the reply, or with stream: true server-sent events ending in data: [DONE]",
                    "headers": _CLAMPED_HEADER,
                    "content": {**_json(reply), "text/event-stream": {"schema": _SSE_EVENT}}},
            **_errors(*_GENERATION_ERRORS),
        },
    }}


def _call(request: str, reply: str, summary: str) -> dict:
    return {"post": {
        "summary": summary, "security": _SECURED,
        "requestBody": {"required": True, "content": _json(request)},
        "responses": {"200": {"description": "the answer", "content": _json(reply)}, **_errors(400, 401, 403, 413, 501, 503)},
    }}


def openapi_document(model_names: tuple[str, ...] | None, max_tokens: int) -> dict:
    """The document of this daemon: its model names (None: any name is served by its model) and
    its --max-tokens-per-request."""
    doc = copy.deepcopy(_document())
    schemas = doc["components"]["schemas"]
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        properties = schemas[request]["properties"]
        if model_names is None:
            model = {"anyOf": [{"type": "string"}, {"type": "null"}],
                     "description": "any name: the one model served answers (GET /v1/models gives its id)"}
        else:
            model = {"anyOf": [{"enum": list(model_names)}, {"type": "null"}],
                     "description": "the model served (GET /v1/models); unset is the same"}
        properties["model"] = {**model, "default": None}
        for name in ("max_tokens", "max_completion_tokens"):
            if name in properties:
                properties[name]["description"] = (f"at most {max_tokens} (--max-tokens-per-request): more is lowered "
                                                   f"to it (header X-Max-Tokens-Clamped); -1 is {max_tokens}")
    return doc


@functools.cache
def _document() -> dict:
    models = [
        (rq.ChatCompletionRequest, "validation"), (rq.CompletionRequest, "validation"),
        (rs.ChatCompletion, "serialization"), (rs.TextCompletion, "serialization"), (rs.ModelList, "serialization"),
        (rs.Model, "serialization"), (rs.SessionDeleted, "serialization"), (rs.Health, "serialization"),
        (rs.ErrorResponse, "serialization"), (mr.EmbeddingRequest, "validation"), (mr.TokenizeRequest, "validation"),
        (mr.DetokenizeRequest, "validation"), (rs.EmbeddingList, "serialization"), (rs.Tokens, "serialization"),
        (rs.Text, "serialization"),
    ]
    _, schemas = models_json_schema(models, ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": "xlm-sidecar OpenAI-compatible API", "version": __version__,
                 "description": "Every /v1 path is also served without /v1, as llama-server serves them."},
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/health": {"get": {"summary": "readiness (no token needed)", "responses": {
                "200": {"description": "serving", "content": _json("Health")},
                "503": {"description": "shutting down", "content": _json("Health")},
            }}},
            "/v1/models": {"get": {"summary": "the model served", "security": _SECURED, "responses": {
                "200": {"description": "one model", "content": _json("ModelList")}, **_errors(401, 403, 503),
            }}},
            "/v1/models/{model}": {"get": {
                "summary": "one model", "security": _SECURED,
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model", "content": _json("Model")}, **_errors(401, 403, 404, 503)},
            }},
            "/v1/chat/completions": _generation("ChatCompletionRequest", "ChatCompletion", "chat completion"),
            "/v1/completions": _generation("CompletionRequest", "TextCompletion", "raw-prompt completion"),
            "/v1/embeddings": _call("EmbeddingRequest", "EmbeddingList", "embeddings of short texts from the served model"),
            "/tokenize": _call("TokenizeRequest", "Tokens", "the served model's tokens of a text (llama-server's)"),
            "/detokenize": _call("DetokenizeRequest", "Text", "the text of tokens (llama-server's)"),
            "/v1/sessions/{session_id}": {"delete": {
                "summary": "forget an NPC's session (EndSession)", "security": _SECURED,
                "parameters": [{"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "ended", "content": _json("SessionDeleted")},
                              **_errors(400, 401, 403, 404, 503)},
            }},
        },
    }
