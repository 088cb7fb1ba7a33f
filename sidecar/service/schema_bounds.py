"""Bounds on a JSON schema and on the grammar it compiles to, checked before llama.cpp sees either.

A schema from the game (or a player's text that reaches one) becomes GBNF through
llama-cpp-python's converter, and the GBNF is parsed by llama.cpp on the engine thread. Neither
bounds its work: the converter writes a repetition of n as n nested optional groups
(`maxLength: 20000` is 20,000 levels of parentheses), and llama.cpp's parser recurses once per
level, so past about 12,000 levels the engine thread's stack overflows and the process dies with
every NPC in it (measured: 1,000 levels parse; 4,000 and 12,000 are refused; 20,000 segfault).
An enum of 200,000 strings compiled for minutes.

So every schema passes one rule, cheaply and off the engine thread: its bytes, its nesting, each
repetition count it asks for (maxLength, maxItems, ..., and `{m,n}` in patterns) and its enum
sizes; and the GBNF, whatever it came from, its bytes and its nesting. A limit that is hit is
INVALID_ARGUMENT naming the field and the limit.
"""

from __future__ import annotations

import json
import re

from sidecar.errors import InvalidArgument

# Deeper schemas are not schemas anyone writes for an NPC's actions; the converter recurses once
# per level.
MAX_SCHEMA_DEPTH = 64
# A tool set of 64 functions with rich parameters is a few tens of KB.
MAX_SCHEMA_BYTES = 128 << 10
# Each becomes as many nested grammar groups: 1,000 parse in milliseconds, far from the crash.
MAX_REPETITION = 1000
MAX_ENUM_VALUES = 1024
# The compiled grammar: its text and how deep its groups nest (the parser's recursion).
MAX_GRAMMAR_BYTES = 1 << 20
MAX_GRAMMAR_NESTING = 1024

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
           "maxContains")
# (lower, upper) keyword pairs: a lower bound above its upper one admits nothing, and the grammar
# converter would write a grammar that admits something anyway (the call {"n": 10} for 10 <= n <= 1).
_RANGES = (("minimum", "maximum"), ("exclusiveMinimum", "exclusiveMaximum"), ("exclusiveMinimum", "maximum"),
           ("minimum", "exclusiveMaximum"), ("minLength", "maxLength"), ("minItems", "maxItems"),
           ("minProperties", "maxProperties"))
_QUANTIFIER = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def parse_schema(text: str, field: str = "json_schema") -> object:
    """The parsed schema, or InvalidArgument when it is not JSON or past a bound (see above)."""
    if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(f"{field} is {len(text.encode('utf-8'))} bytes; at most {MAX_SCHEMA_BYTES}")
    try:
        schema = json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{field} is nested more than {MAX_SCHEMA_DEPTH} levels deep") from None
    except ValueError as e:
        raise InvalidArgument(f"{field} is not valid JSON: {e}") from None
    check_schema(schema, field)
    return schema


def check_schema(schema: object, field: str = "json_schema") -> None:
    """Walk a parsed schema without recursion; InvalidArgument at the first bound it passes."""
    stack: list[tuple[object, str, int]] = [(schema, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise InvalidArgument(f"{field} is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if isinstance(item, dict):
            _check_keywords(item, path or "/", field)
            stack.extend((v, f"{path}/{k}", depth + 1) for k, v in item.items() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, f"{path}/{i}", depth + 1) for i, v in enumerate(item) if isinstance(v, (dict, list)))


def _check_keywords(node: dict, path: str, field: str) -> None:
    for key in _COUNTS:
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_REPETITION:
            raise InvalidArgument(f"{field}: {key} {value:g} at {path} is more than {MAX_REPETITION}, the most a "
                                  f"reply grammar can count (leave {key} out for no limit)")
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for low, high in _QUANTIFIER.findall(pattern):
            n = max(int(low), int(high) if high else 0)
            if n > MAX_REPETITION:
                raise InvalidArgument(f"{field}: pattern at {path} repeats {n} times; at most {MAX_REPETITION}")
        nested = nested_repetition(pattern)
        if nested > MAX_REPETITION:
            raise InvalidArgument(f"{field}: pattern at {path} nests repetitions that multiply to {nested}; at most "
                                  f"{MAX_REPETITION} (each count is within bounds, their product is not)")
    for low_key, high_key in _RANGES:
        low, high = node.get(low_key), node.get(high_key)
        if _number(low) and _number(high) and (low > high or (low == high and "exclusive" in low_key + high_key)):
            raise InvalidArgument(f"{field}: {low_key} {low:g} above {high_key} {high:g} at {path}: no value satisfies it")
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > MAX_ENUM_VALUES:
        raise InvalidArgument(f"{field}: enum at {path} has {len(enum)} values; at most {MAX_ENUM_VALUES}")


def nested_repetition(pattern: str) -> int:
    """The largest product of `{m,n}` counts nested inside one another in a regular expression:
    `(a{0,1000}){0,1000}` is 1,000,000. Counts within bounds one by one multiply once nested, and
    llama.cpp's grammar then tracks every way of splitting the text among them (measured: 30 x 30
    already costs 235 ms a token, 1000 x 1000 a second for the first and minutes for the next)."""
    stack = [1]  # the largest product inside each open group
    last_group = 1  # the product inside the group that just closed
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            last_group = 1
            continue
        if ch == "[":  # a character class: no groups or counts inside
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            last_group = 1
        elif ch == "(":
            stack.append(1)
        elif ch == ")" and len(stack) > 1:
            last_group = stack.pop()
            stack[-1] = max(stack[-1], last_group)
            i += 1
            continue
        elif ch == "{":
            quantifier = _QUANTIFIER.match(pattern, i)
            if quantifier:
                low, high = quantifier.groups()
                count = max(int(low), int(high) if high else 0, 1)
                stack[-1] = max(stack[-1], last_group * count)
                i = quantifier.end()
                last_group = 1
                continue
        last_group = 1
        i += 1
    return max(stack)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_grammar(gbnf: str, source: str = "json_schema") -> str:
    """`gbnf` if llama.cpp may parse it: within MAX_GRAMMAR_BYTES and MAX_GRAMMAR_NESTING (groups
    counted outside quoted literals, character classes and comments)."""
    if len(gbnf) > MAX_GRAMMAR_BYTES:
        raise InvalidArgument(f"the grammar {source} compiles to is {len(gbnf)} bytes; at most {MAX_GRAMMAR_BYTES}")
    nesting = grammar_nesting(gbnf)
    if nesting > MAX_GRAMMAR_NESTING:
        raise InvalidArgument(f"the grammar {source} compiles to nests {nesting} groups deep; at most "
                              f"{MAX_GRAMMAR_NESTING} (a repetition count or nesting too large)")
    return gbnf


def grammar_nesting(gbnf: str) -> int:
    """The deepest nesting of ( ) groups in GBNF text."""
    depth = deepest = 0
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch in "\"[":  # a literal or a character class: skip to its end, past escapes
            close = '"' if ch == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif ch == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        i += 1
    return deepest
