"""JSON schemas as llama.cpp grammars (GBNF), by llama-cpp-python's converter. Imported on first
use: remote mode checks schemas but never compiles them, and must not load llama.cpp."""

from __future__ import annotations

from sidecar.errors import InvalidArgument


def json_schema_grammar(schema: str) -> str:
    """GBNF grammar text that only admits JSON valid under `schema`; InvalidArgument if it is not a schema."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        json.loads(schema)
    except ValueError as e:
        raise InvalidArgument(f"json_schema is not valid JSON: {e}") from e
    try:
        return json_schema_to_gbnf(schema)
    except Exception as e:  # the converter raises bare Exceptions/KeyErrors on schemas it cannot express
        raise InvalidArgument(f"json_schema cannot be turned into a grammar: {e}") from e
