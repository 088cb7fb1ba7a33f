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
        gbnf = json_schema_to_gbnf(schema)
    except Exception as e:  # the converter raises bare Exceptions/KeyErrors on schemas it cannot express
        raise InvalidArgument(f"json_schema cannot be turned into a grammar: {e}") from e
    return strict_strings(compact(gbnf))


# The converter lets the model put one optional space after every brace, key, colon, comma and
# value. Whitespace means nothing in JSON, but as a choice it makes every structural character of a
# reply a token the model must be asked for: with it fixed, `{"name":"give_item","arguments":{"`
# is forced text that jump-forward decoding (engine/jump_forward.py) feeds in one pass. Small models
# also spent tokens on stray spaces. So replies under a schema are compact JSON.
_CONVERTER_SPACE = 'space ::= " "?'
_COMPACT_SPACE = 'space ::= ""'


def compact(gbnf: str) -> str:
    """The converter's grammar with its optional space between JSON tokens fixed to none."""
    lines = gbnf.split("\n")
    return "\n".join(_COMPACT_SPACE if line.strip() == _CONVERTER_SPACE else line for line in lines)


# The converter (llama-cpp-python 0.3.36) lets a JSON string hold any character but `"` and `\\`,
# raw control characters included; JSON forbids them unescaped (RFC 8259, section 7). Sampled at a
# temperature, a small model did write a raw newline inside a key (`{",\n":false}`), a reply no JSON
# parser reads. llama.cpp's own converter excludes U+0000-U+001F and U+007F; so do we.
_CONVERTER_CHAR = 'char ::= [^"\\\\] |'
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def strict_strings(gbnf: str) -> str:
    """The converter's grammar with control characters kept out of JSON strings: they must be escaped."""
    lines = gbnf.split("\n")
    return "\n".join(_STRICT_CHAR + line[len(_CONVERTER_CHAR):] if line.startswith(_CONVERTER_CHAR) else line
                     for line in lines)
