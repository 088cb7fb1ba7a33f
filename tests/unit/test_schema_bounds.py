"""A JSON schema never crashes the daemon (issue 29, 1, 5, 6): one set of bounds for every schema
on every transport, checked before llama.cpp parses anything, and a fuzz target that counts
crashes.

The crash: llama-cpp-python's converter writes a repetition of n as n nested groups, and
llama.cpp's grammar parser recurses once per group; at 20,000 (maxLength, maxItems or a pattern's
{0,20000}) the engine thread's stack overflowed and the process died (segfault), every NPC with it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import grpc_sampling
from support.run_summary import record_tally
from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.service.convert import grammar_for
from sidecar.service.schema_bounds import (
    MAX_ENUM_VALUES,
    MAX_GRAMMAR_NESTING,
    MAX_REPETITION,
    MAX_SCHEMA_BYTES,
    check_grammar,
    grammar_nesting,
)

CRASHERS = {  # each of these killed the daemon at 9027554
    "maxLength": {"type": "string", "maxLength": 100000},
    "maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 100000},
    "pattern": {"type": "string", "pattern": "^a{0,100000}$"},
    "http maxLength": {"type": "string", "maxLength": 20000},
}


# -- the bounds, without a model ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CRASHERS))
def test_a_repetition_past_the_bound_is_refused_naming_it(name: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        grammar_for(json.dumps(CRASHERS[name]))
    assert str(MAX_REPETITION) in str(e.value)


def test_the_bound_itself_compiles_and_llama_cpp_parses_it_on_a_thread(smollm2_path) -> None:
    """At the limit, the grammar parses (on a thread, as on the engine's): the bound is not a guess
    far below what works, and the crash is more than ten times further."""
    import llama_cpp

    from sidecar.native.model import NativeModel

    grammars = [grammar_for(json.dumps(s)) for s in (
        {"type": "string", "maxLength": MAX_REPETITION},
        {"type": "array", "items": {"type": "integer"}, "maxItems": MAX_REPETITION},
        {"type": "string", "pattern": f"^a{{0,{MAX_REPETITION}}}$"},
    )]
    assert all(grammar_nesting(g) <= MAX_GRAMMAR_NESTING for g in grammars)
    model = NativeModel(smollm2_path)
    parsed: list[bool] = []

    def parse() -> None:
        for g in grammars:
            sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, g.encode(), b"root")
            parsed.append(bool(sampler))
            if sampler:
                llama_cpp.llama_sampler_free(sampler)

    try:
        thread = threading.Thread(target=parse)
        thread.start()
        thread.join(60)
    finally:
        model.close()
    assert parsed == [True, True, True]


def test_big_enums_schemas_and_nestings_are_refused_cheaply() -> None:
    cases = {
        "enum": json.dumps({"enum": [f"v{i}" for i in range(200_000)]}),
        "bytes": json.dumps({"type": "object", "description": "x" * MAX_SCHEMA_BYTES}),
        "depth": '{"items": ' * 100 + "{}" + "}" * 100,
        "depth past the parser": '{"items": ' * 5000 + "{}" + "}" * 5000,
    }
    for name, text in cases.items():
        started = time.perf_counter()
        with pytest.raises(InvalidArgument):
            grammar_for(text)
        # Refused by size, not by compiling (the 200,000-value enum compiled for minutes); generous
        # for slow and shared machines, where the parse of a 1.6 MB schema alone may take a second.
        assert time.perf_counter() - started < 30.0, name
    assert grammar_for(json.dumps({"enum": [f"v{i}" for i in range(MAX_ENUM_VALUES)]}))


def test_the_grammar_check_counts_groups_not_characters_in_literals() -> None:
    assert grammar_nesting('root ::= "((((" [(] ( "a" ( "b" ) )  # (((') == 2
    with pytest.raises(InvalidArgument):
        check_grammar("root ::= " + "(" * (MAX_GRAMMAR_NESTING + 1) + '"a"' + ")" * (MAX_GRAMMAR_NESTING + 1))


# -- against the daemon, on every transport ----------------------------------------------------------


def _code(client, request: pb.GenerateRequest) -> str:
    try:
        client.complete(request)
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


def test_the_crashers_are_invalid_argument_on_grpc_and_the_daemon_stays_up(client, eog) -> None:
    ask = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Act.")])
    for name, schema in CRASHERS.items():
        request = pb.GenerateRequest(messages=ask, json_schema=json.dumps(schema), max_tokens=2)
        assert _code(client, request) == "INVALID_ARGUMENT", name
    deep = '{"type": "object", "properties": {"a": ' * 2000 + "{}" + "}}" * 2000
    tool = pb.GenerateRequest(messages=ask, max_tokens=2, tools=[
        pb.Tool(name="deep", parameters_json_schema=deep),
        pb.Tool(name="long", parameters_json_schema=json.dumps({"type": "object", "properties": {
            "line": {"type": "string", "maxLength": 30000}}}))])
    assert _code(client, tool) == "INVALID_ARGUMENT"  # was INTERNAL (D1 on the tools path)
    enum = pb.GenerateRequest(messages=ask, max_tokens=2, json_schema=json.dumps({"enum": [f"v{i}" for i in range(200_000)]}))
    started = time.perf_counter()
    assert _code(client, enum) == "INVALID_ARGUMENT"
    print(f"a 200,000-value enum refused in {time.perf_counter() - started:.2f} s (was 167 s to compile)")
    # The end-of-generation tokens banned: the reply has a token, whatever the model says.
    after = pb.GenerateRequest(prompt="Hello", max_tokens=2, sampling=grpc_sampling(eog))
    assert client.complete(after).final.usage.completion_tokens >= 1


# -- the schema fuzz target -------------------------------------------------------------------------

FUZZ = settings(deadline=None, database=None, max_examples=120,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TALLY: Counter[str] = Counter()
counts = st.integers(0, 10) | st.integers(900, 1100) | st.integers(10**4, 10**6)
leaf = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")}, optional={"maxLength": counts, "minLength": counts,
                                                                  "pattern": counts.map(lambda n: f"^(ab|c){{0,{n}}}$")}),
    st.fixed_dictionaries({"type": st.just("array"), "items": st.just({"type": "integer"})},
                          optional={"maxItems": counts, "minItems": counts}),
    st.fixed_dictionaries({"enum": st.lists(st.text(max_size=4), min_size=1, max_size=8) | counts.map(lambda n: list(range(min(n, 3000))))}),
    st.just({"$ref": "#"}),
    st.just({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
    st.just({"type": "integer", "minimum": 10, "maximum": 1}),
)
schemas = st.recursive(leaf, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(st.sampled_from("abcdef"), inner, max_size=3)}),
    st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"type": st.just("array"), "items": inner}, optional={"maxItems": counts}),
), max_leaves=12)


@pytest.fixture(scope="module")
def fuzzed(request: pytest.FixtureRequest) -> Iterator[RunningDaemon]:
    running = start_daemon("--threads", "1", "--max-tokens-per-request", "2", "--ctx", "512", "--parallel", "2")
    yield running
    alive = running.process.poll() is None
    TALLY["crashes"] += not alive
    record_tally(request.config, "schema fuzz tally", {k: TALLY[k] for k in ("requests", "crashes", "hangs", "undocumented codes")})
    assert alive, "the daemon died during the schema fuzz"
    assert stop_daemon(running) == 0


@FUZZ
@given(schema=schemas, as_tool=st.booleans())
def test_fuzzed_schemas_never_crash_the_daemon(fuzzed: RunningDaemon, schema: dict, as_tool: bool) -> None:
    ask = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Act.")])
    text = json.dumps(schema)
    request = pb.GenerateRequest(messages=ask, max_tokens=2, sampling=pb.SamplingParams(temperature=0))
    if as_tool:
        request.tools.append(pb.Tool(name="act", parameters_json_schema=json.dumps({"type": "object", "properties": {"x": schema}})))
    else:
        request.json_schema = text
    with fuzzed.client(timeout_s=60) as client:
        try:
            code = _code(client, request)
        except Exception:  # noqa: BLE001 - a transport failure here means the daemon went away
            code = "CRASH"
    TALLY["requests"] += 1
    if code == "DEADLINE_EXCEEDED":
        TALLY["hangs"] += 1
    elif code in ("UNAVAILABLE", "CRASH") or fuzzed.process.poll() is not None:
        TALLY["crashes"] += 1
    elif code not in ("OK", "INVALID_ARGUMENT"):
        TALLY["undocumented codes"] += 1
    assert fuzzed.process.poll() is None, f"the daemon died on {text[:300]}"
    assert code in ("OK", "INVALID_ARGUMENT"), (code, text[:300])
