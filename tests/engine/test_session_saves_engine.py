"""Save games in process, on the real SmolLM2: export, a new engine, import, the next turn.

The next turn's prompt is compared as tokens (the engine's own build of it from the session it
holds) with what the daemon that never stopped would have fed; a restored KV shows in the turn's
cached tokens, and, computed the same way from the same cache, the reply's tokens are the same.
Another context size or model rebuilds from the text and says why; a refused import changes
nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sidecar.backend.save_format import open_archive, seal
from sidecar.engine import Engine, EngineConfig, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.engine.prompts.prompt_build import build_prompt
from sidecar.errors import InvalidArgument, NotFound, SidecarError

from support.no_early_stop import engine_eog_ids, engine_sampling
from support.engines import engine_config

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
PERSONA = "You are Brom, the village blacksmith. Gruff, kind, short sentences."
WORLD = "The kingdom of Eld. Winter is coming and iron is scarce."


def config(path, **changes) -> EngineConfig:
    return engine_config(path, **{"n_ctx": 512, "max_sessions": 4, "max_prompt_tokens": 400, **changes})


def run(engine: Engine, spec: GenerationSpec) -> tuple[list[int], Finished]:
    tokens: list[int] = []
    done, result = threading.Event(), []

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            tokens.extend(event.token_ids)
        else:
            result.append(event)
            done.set()

    engine.submit(spec, sink)
    assert done.wait(120)
    if isinstance(result[0], SidecarError):
        raise result[0]
    return tokens, result[0]


def turn(sampling, sid: str, text: str, **kw) -> GenerationSpec:
    return GenerationSpec(prompt=Prompt(messages=(("user", text),), **kw), sampling=sampling, max_tokens=6, session_id=sid)


def next_prompt(engine: Engine, spec: GenerationSpec) -> list[int]:
    session = engine.sessions.get(spec.session_id)
    return build_prompt(engine.model, spec, session, [], max_prompt_tokens=400, n_ctx=engine.config.n_ctx).tokens


def export(engine: Engine, ids: list[str], include_kv: bool):
    archive, infos = engine.export_sessions(ids, include_kv).result(60)
    return seal(archive), infos


def import_(engine: Engine, blob: bytes, replace: bool = False):
    archive = open_archive(blob)
    return engine.import_sessions(archive, engine.save_fingerprint(archive.fingerprint.layers), replace).result(60)


@pytest.fixture(scope="module")
def saved(smollm2_path) -> Iterator[dict]:
    """A daemon's sessions after two turns, exported with and without KV; then the turn that
    daemon would have run next, and what it fed and answered."""
    a = Engine(config(smollm2_path))
    try:
        sampling = engine_sampling(GREEDY, engine_eog_ids(a))
        run(a, GenerationSpec(prompt=Prompt(messages=(("system", PERSONA), ("user", "Morning, Brom.")), context=WORLD),
                              sampling=sampling, max_tokens=6, session_id="brom"))
        run(a, turn(sampling, "brom", "Can you mend my sword?"))
        run(a, GenerationSpec(prompt=Prompt(text="Once upon a time"), sampling=sampling, max_tokens=6, session_id="bard"))
        with_kv, infos_kv = export(a, [], True)
        text_only, infos_text = export(a, ["brom"], False)
        following = turn(sampling, "brom", "How much will it cost?")
        expected_prompt = next_prompt(a, following)
        reply, final = run(a, following)
        yield dict(with_kv=with_kv, text_only=text_only, infos_kv=infos_kv, infos_text=infos_text, following=following,
                   prompt=expected_prompt, reply=reply, final=final, sampling=sampling)
    finally:
        a.close()


def test_export_lists_what_it_saved(saved) -> None:
    assert [(i.session_id, i.restored) for i in saved["infos_kv"]] == [("bard", "kv"), ("brom", "kv")]
    assert all(i.kv_bytes > 0 for i in saved["infos_kv"])
    assert [(i.session_id, i.restored, i.kv_bytes) for i in saved["infos_text"]] == [("brom", "text", 0)]
    assert len(saved["text_only"]) < 4096 < len(saved["with_kv"])


def test_restored_kv_resumes_as_if_never_gone(saved, smollm2_path) -> None:
    b = Engine(config(smollm2_path))
    try:
        infos = import_(b, saved["with_kv"])
        assert [(i.session_id, i.restored, i.reason) for i in infos] == [("bard", "kv", ""), ("brom", "kv", "")]
        assert b.sessions.get("brom").imported == "kv"
        assert next_prompt(b, saved["following"]) == saved["prompt"]
        reply, final = run(b, saved["following"])
        assert final.usage.prompt_tokens == saved["final"].usage.prompt_tokens
        assert final.usage.cached_prompt_tokens == saved["final"].usage.cached_prompt_tokens > len(saved["prompt"]) // 2
        assert reply == saved["reply"], "the same cache and the same new tokens compute the same reply"
        assert b.sessions.get("brom").imported == ""
        # The raw-prompt session goes on from its text and cache too.
        _, bard = run(b, GenerationSpec(prompt=Prompt(text=" there was"), sampling=saved["sampling"], max_tokens=4,
                                        session_id="bard"))
        assert bard.usage.cached_prompt_tokens > 0
    finally:
        b.close()


def test_refused_imports_change_nothing(saved, smollm2_path) -> None:
    b = Engine(config(smollm2_path))
    try:
        import_(b, saved["with_kv"])
        run(b, saved["following"])
        before = list(b.sessions.get("brom").messages)
        with pytest.raises(InvalidArgument, match="exist already"):
            import_(b, saved["text_only"])
        with pytest.raises(InvalidArgument, match="checksum"):
            import_(b, saved["with_kv"][:-1] + bytes([saved["with_kv"][-1] ^ 1]))
        assert b.sessions.get("brom").messages == before
        with pytest.raises(NotFound):
            b.export_sessions(["nobody"], False).result(60)
        # Replace, when asked: the text-only save's brom, rebuilt from its text at its next turn.
        infos = import_(b, saved["text_only"], replace=True)
        assert [(i.session_id, i.restored, i.reason) for i in infos] == [("brom", "text", "saved without its KV state")]
        assert next_prompt(b, saved["following"]) == saved["prompt"]
        _, final = run(b, saved["following"])
        assert final.usage.prompt_tokens == saved["final"].usage.prompt_tokens
    finally:
        b.close()


def test_another_context_size_rebuilds_from_text(saved, smollm2_path) -> None:
    c = Engine(config(smollm2_path, n_ctx=1024))
    try:
        infos = import_(c, saved["with_kv"])
        assert {i.restored for i in infos} == {"text"}
        assert all("context 1024 tokens per session, saved with 512" in i.reason for i in infos)
        assert next_prompt(c, saved["following"]) == saved["prompt"]
        _, final = run(c, saved["following"])
        assert final.usage.prompt_tokens == saved["final"].usage.prompt_tokens
        assert final.usage.cached_prompt_tokens == 0
    finally:
        c.close()


def test_another_model_never_restores_a_foreign_state(saved, model_files) -> None:
    tiny = model_files("tiny_llama")["tiny_llama"]
    d = Engine(config(tiny, n_ctx=512))
    try:
        infos = import_(d, saved["with_kv"])
        assert {i.restored for i in infos} == {"text"}
        assert all(i.reason.startswith("another model") for i in infos), infos
        assert all(s.saved_state is None and not s.reply_tokens for s in d.sessions.all())
        _, final = run(d, GenerationSpec(prompt=Prompt(messages=(("user", "Hm?"),)), sampling=GREEDY, max_tokens=3,
                                         session_id="brom"))
        assert final.usage.cached_prompt_tokens == 0 and final.usage.prompt_tokens > 20
    finally:
        d.close()


def test_another_kv_type_rebuilds_from_text(saved, smollm2_path) -> None:
    e = Engine(config(smollm2_path, kv_type="Q8_0", flash_attention=True))
    try:
        infos = import_(e, saved["with_kv"])
        assert {(i.restored, i.reason) for i in infos} == {("text", "KV cache type Q8_0, saved with F16")}
        assert next_prompt(e, saved["following"]) == saved["prompt"]
    finally:
        e.close()


def test_each_saying_of_a_reply_travels_in_order(smollm2_path) -> None:
    """A text said more than once keeps each saying's tokens, None where a saying kept none
    (reply_tokens.py): a save holds each as an entry of its own, in order, and an import gives
    back the same list."""
    a, b = Engine(config(smollm2_path)), Engine(config(smollm2_path))
    try:
        sampling = engine_sampling(GREEDY, engine_eog_ids(a))
        run(a, turn(sampling, "guard", "Halt! Who goes there?"))
        session = a.sessions.get("guard")
        text = session.messages[-1][1]
        kept = session.reply_tokens[text]
        assert text and len(kept) == 1 and kept[0] is not None
        session.reply_tokens[text] = [None, kept[0], kept[0]]
        blob, _ = export(a, ["guard"], False)
        import_(b, blob)
        assert b.sessions.get("guard").reply_tokens == {text: [None, kept[0], kept[0]]}
    finally:
        a.close()
        b.close()
