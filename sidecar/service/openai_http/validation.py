"""A request body's validation errors, told as a client's author reads them.

pydantic speaks of its own schema: "messages.1.content.str: Input should be a valid string (3
problems)", a path through union branches (str, list[...], constrained-str, tagged-union[...])
that no JSON body has. This names the field as JSON does (messages[1].content) and says what it
must be, joining what the union's branches would have taken: "messages[1].content must be a
string or a list of content parts".
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic

# The plural of the items a `list[...]` branch holds, by the model classes in its name.
_ITEMS = {"TextPart": "content parts", "ImagePart": "content parts", "ChatMessage": "messages", "Tool": "tools",
          "ToolCall": "tool calls", "str": "strings", "constrained-str": "strings"}
# What a list field holds, by its name, for "at most 16 prompts per request".
_LIMITED = {"prompt": "prompts", "input": "inputs", "messages": "messages", "tools": "tools", "stop": "stop strings"}
_KINDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
          "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
          "none_required": "null"}


def describe(error: pydantic.ValidationError, raw: bytes) -> tuple[str, str | None]:
    """(message, param): the first problem, in JSON's terms, and the field it is about."""
    problems = error.errors(include_url=False)
    invalid = next((p for p in problems if p["type"] == "json_invalid"), None)
    if invalid is not None:
        return f"the body is not valid JSON: {invalid['ctx']['error']}", None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # pydantic read it: not expected, but no reason for a 500
        body = None
    located = [(_path(p, body), p) for p in problems]
    too_long = _too_long_only(problems, located)
    if too_long is not None:
        return too_long
    # A union's branches each report; the one that got furthest into the value is the one the
    # client meant (a list whose part lacks "text" is no "not a string").
    deepest = max(len(path) for path, _ in located)
    path = next(path for path, _ in located if len(path) == deepest)
    field, message = _sentence(path, [p for where, p in located if where == path])
    others = {where for where, _ in located if where[:len(path)] != path and path[:len(where)] != where}
    if others:
        message += f" (and {len(others)} more {'problem' if len(others) == 1 else 'problems'})"
    return message, field


def _too_long_only(problems: list[dict], located: list) -> tuple[str, str | None] | None:
    """A list branch whose items all passed and that failed on its length alone is the one the
    client meant: 17 prompts are "at most 16 prompts", not the token-id branch's "prompt[0] must
    be an integer (and 16 more problems)"."""
    for path, problem in located:
        loc = tuple(problem["loc"])
        if problem["type"] != "too_long" or any(len(q["loc"]) > len(loc) and tuple(q["loc"][:len(loc)]) == loc
                                                 for q in problems):
            continue
        field = _json_path(path) or None
        ctx = problem.get("ctx") or {}
        last = next((step for step in reversed(path) if isinstance(step, str)), "")
        noun = _LIMITED.get(last, "items")
        return (f"at most {ctx.get('max_length')} {noun} per request; {field or 'the body'} has "
                f"{ctx.get('actual_length', 'more')}"), field
    return None


def _path(problem: dict, body: Any) -> tuple[str | int, ...]:
    """The problem's location in the body: pydantic's path without its union branch names,
    kept only where the body has that key or index (a missing field is the last step)."""
    loc = problem["loc"]
    if body is None:
        return tuple(loc)
    path: list[str | int] = []
    value = body
    for i, step in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            path.append(step)
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict) and step in value:
            path.append(step)
            value = value[step]
        elif last and problem["type"] == "missing" and isinstance(step, str):
            path.append(step)
    return tuple(path)


def _json_path(path: tuple[str | int, ...]) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _sentence(path: tuple[str | int, ...], problems: list[dict]) -> tuple[str | None, str]:
    """(the field, in JSON's terms, or None for the body itself; the sentence about it)."""
    field = _json_path(path) or None
    if any(p["type"] == "missing" for p in problems):
        return field, f"{field} is required"
    tagged = next((p for p in problems if p["type"] in ("union_tag_invalid", "union_tag_not_found")), None)
    if tagged is not None:  # the field that tells the kinds apart ("type") is missing or unknown
        field = _json_path((*path, tagged["ctx"]["discriminator"].strip("'")))
        if tagged["type"] == "union_tag_not_found":
            return field, f"{field} is required"
        return field, f"{field} must be one of {tagged['ctx']['expected_tags']}"
    musts: list[str] = []
    for p in problems:
        phrase = _must(p)
        if phrase not in musts:
            musts.append(phrase)
    either = " or ".join(musts) if len(musts) < 3 else ", ".join(musts[:-1]) + " or " + musts[-1]
    return field, f"{field or 'the body'} must be {either}"


def _must(problem: dict) -> str:
    """What the value must be, by this problem."""
    kind, ctx = problem["type"], problem.get("ctx") or {}
    if kind in _KINDS:
        return _KINDS[kind]
    if kind == "list_type":
        branch = next((s for s in problem["loc"] if isinstance(s, str) and s.startswith("list[")), "")
        nouns = {_ITEMS[name] for name in re.findall(r"[A-Za-z-]+", branch[5:]) if name in _ITEMS}
        return f"a list of {nouns.pop()}" if len(nouns) == 1 else "a list"
    if kind == "literal_error":
        return f"one of {ctx['expected'].replace(' or ', ', ')}"
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"{words} {ctx[key]:g}" if isinstance(ctx[key], float) else f"{words} {ctx[key]}"
    if kind in ("string_too_short", "string_too_long"):
        n = ctx["min_length" if kind == "string_too_short" else "max_length"]
        return f"a string of {'at least' if kind == 'string_too_short' else 'at most'} {n} character{'s' * (n != 1)}"
    if kind in ("too_short", "too_long"):
        n = ctx["min_length" if kind == "too_short" else "max_length"]
        return f"a list of {'at least' if kind == 'too_short' else 'at most'} {n} item{'s' * (n != 1)}"
    if kind == "string_pattern_mismatch":
        return f"a string matching {ctx['pattern']}"
    if kind == "value_error":
        return str(ctx["error"]).removeprefix("must be ")
    message = problem["msg"]
    return message.removeprefix("Input should be ").removeprefix("Value should be ")
