"""Checks of the token controls a Godot protocol fixture's await may name (test_godot_protocol.py's
replay runs them on what the daemon sent): candidates by index, log probabilities, a favoured token,
a grammar's strings, embeddings, and result fields. Mechanisms only, never what the model says."""

from __future__ import annotations

import math

# Placeholder in a fixture's step: "$RESULT:<call id>:<field>" is that field of an earlier call's result.
RESULT_PLACEHOLDER = "$RESULT:"


def resolve(value: object, results: dict | None) -> object:
    """`value` with each placeholder replaced; without results (a static check) by null, which the
    JSON mapping reads as the field's default."""
    if isinstance(value, str) and value.startswith(RESULT_PLACEHOLDER):
        if results is None:
            return None
        call_id, field = value[len(RESULT_PLACEHOLDER):].split(":")
        return results[call_id][field]
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, results) for v in value]
    return value


def by_candidate(chunks: list[dict], n: int) -> list[list[dict]]:
    """The chunks of each candidate 0..n-1, in order; each must end with its own final and have no
    chunk after it."""
    groups: dict[int, list[dict]] = {}
    for chunk in chunks:
        group = groups.setdefault(chunk["index"], [])
        assert not any("final" in c for c in group), f"a chunk of candidate {chunk['index']} after its final one"
        group.append(chunk)
    assert sorted(groups) == list(range(n)), f"expected candidates 0..{n - 1}, got {sorted(groups)}"
    for index, group in groups.items():
        assert "final" in group[-1], f"candidate {index} did not end with a final chunk"
        assert group[-1]["final"]["usage"]["completionTokens"] == sum(len(c["tokenIds"]) for c in group), index
    return [groups[i] for i in range(n)]


def check_logprobs(chunks: list[dict], alternatives: int) -> None:
    """One entry per token of each chunk, in order: a log probability with `alternatives` others,
    likeliest first."""
    entries = 0
    for chunk in chunks:
        assert [e["tokenId"] for e in chunk["logprobs"]] == chunk["tokenIds"], chunk
        for entry in chunk["logprobs"]:
            assert math.isfinite(entry["logprob"]) and entry["logprob"] <= 0, entry
            top = [t["logprob"] for t in entry["top"]]
            assert len(top) == alternatives and top == sorted(top, reverse=True), entry
            assert not top or top[0] >= entry["logprob"], entry
            entries += 1
    assert entries > 0, "no tokens to check"


def check_every_token(chunks: list[dict], token_id: int) -> None:
    ids = [t for c in chunks for t in c["tokenIds"]]
    assert ids and set(ids) == {token_id}, f"every token should be {token_id}: {ids}"


def check_text_in(chunks: list[dict], allowed: list[str]) -> None:
    text = "".join(c["text"] for c in chunks)
    assert text in allowed, f"{text!r} is not one of {allowed}"


def check_embeddings(result: dict, count: int) -> None:
    vectors = [e["values"] for e in result["embeddings"]]
    assert len(vectors) == count, result
    assert len({len(v) for v in vectors}) == 1 and vectors[0], "embeddings of one length"
    for v in vectors:
        assert abs(sum(x * x for x in v) - 1.0) < 1e-3, "a unit vector"


def check_fields(message: dict, equals: dict, lengths: dict) -> None:
    for field, expected in equals.items():
        assert message[field] == expected, (field, message)
    for field, length in lengths.items():
        assert len(message[field]) == length, (field, message)


def check_token_controls(wait: dict, chunks: list[dict], checked: dict) -> None:
    """Every token-control check `wait` names, on a call's chunks and its final or result."""
    if "logprobs" in wait:
        check_logprobs(chunks, wait["logprobs"])
    if "every_token" in wait:
        check_every_token(chunks, wait["every_token"])
    if "text_in" in wait:
        check_text_in(chunks, wait["text_in"])
    if "embeddings" in wait:
        check_embeddings(checked, wait["embeddings"])
    check_fields(checked, wait.get("equals", {}), wait.get("lengths", {}))
