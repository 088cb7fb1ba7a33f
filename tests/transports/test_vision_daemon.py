"""Screenshot questions through a real daemon: SmolLM2 paired with a generated projector.

The projector's weights are random, so answers are not about the picture; what is tested is the
path: images decoded and encoded, embeddings placed in the conversation's KV cache, follow-ups
reusing it, bad images refused while other conversations go on, VLMOpt's load-per-image.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest
from PIL import Image

from sidecar.api import pb
from support.daemons import start_daemon, stop_daemon
from support.no_early_stop import grpc_eog_ids, grpc_sampling

GREEDY = pb.SamplingParams(temperature=0.0)
PROJECTOR_TOKENS = 16  # the generated projector: 64 px images, 8 px patches pooled 2x2


def screenshot(width: int = 1280, height: int = 720, seed: int = 0, fmt: str = "PNG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


@pytest.fixture(scope="module")
def models(model_files) -> dict:
    return model_files()


@pytest.fixture(scope="module")
def vision_daemon(models):
    running = start_daemon("--mmproj", str(models["smollm2_projector"]), "--no-websocket")
    yield running
    stop_daemon(running)


@pytest.fixture
def vclient(vision_daemon):
    with vision_daemon.client(timeout_s=120) as c:
        yield c


@pytest.fixture(scope="module")
def no_end(vision_daemon) -> pb.SamplingParams:
    """Greedy with the end-of-generation tokens banned: a reply runs its whole max_tokens (after a
    random projector's embeddings the model may well end at once)."""
    with vision_daemon.client(timeout_s=120) as c:
        return grpc_sampling(grpc_eog_ids(c), temperature=0.0)


def test_a_screenshot_question_streams_an_answer(vclient, no_end) -> None:
    chunks = list(vclient.ask_image_stream(pb.AskImageRequest(
        image=pb.Image(encoded=screenshot()), question="What is on the screen?", max_tokens=24, sampling=no_end,
    )))
    assert len(chunks) >= 2 and "".join(c.text for c in chunks).strip()
    final = chunks[-1].final
    assert final.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    info = final.image
    assert (info.original_width, info.original_height) == (1280, 720)
    assert (info.encoded_width, info.encoded_height) == (64, 64) and not info.downscaled
    assert info.image_tokens == PROJECTOR_TOKENS and info.encode_ms > 0
    assert final.usage.prompt_tokens > PROJECTOR_TOKENS


def test_raw_render_texture_pixels_are_accepted(vclient, no_end) -> None:
    w, h = 320, 180
    rgba = np.random.default_rng(3).integers(0, 255, (h, w, 4), dtype=np.uint8)
    raw = pb.RawImage(pixels=rgba.tobytes(), width=w, height=h, format=pb.PIXEL_FORMAT_RGBA8, bottom_up=True)
    reply = vclient.ask_image("Describe the scene.", image=raw, max_tokens=8, sampling=no_end)
    assert reply.final.image.original_width == w and reply.final.usage.completion_tokens >= 1


def test_a_follow_up_reuses_the_image_kv_instead_of_encoding_again(vclient) -> None:
    before = vclient.status().vision.images_encoded
    first = vclient.ask_image("What is this?", image=screenshot(seed=5), session_id="scout", max_tokens=6, sampling=GREEDY)
    assert vclient.status().vision.images_encoded == before + 1
    follow = vclient.ask_image("And what colour is it?", session_id="scout", max_tokens=6, sampling=GREEDY)
    assert vclient.status().vision.images_encoded == before + 1  # the encoder did not run
    assert follow.final.image.encode_ms == 0 and follow.final.image.image_tokens == PROJECTOR_TOKENS
    # Everything up to and including the image was already in the session's cache.
    assert follow.final.usage.cached_prompt_tokens >= first.final.usage.prompt_tokens
    # A new screenshot in the same session is encoded; the old one stays in the conversation.
    vclient.ask_image("Now this one?", image=screenshot(seed=6), session_id="scout", max_tokens=4, sampling=GREEDY)
    assert vclient.status().vision.images_encoded == before + 2
    assert vclient.end_session("scout") > 2 * PROJECTOR_TOKENS


def test_an_image_question_in_a_session_is_a_turn_like_any_other(vclient) -> None:
    """AskImage goes the one way every turn goes (service/turn.py): a session's image question
    recalls the memories of the scopes it reads, as a chat turn does."""
    fact = vclient.remember(["The lookout saw black sails off the north cape."], scope="lookout")[0]
    asked = vclient.ask_image("Are those the black sails from the north cape?", image=screenshot(seed=9),
                              session_id="lookout", max_tokens=2, sampling=GREEDY)
    assert list(asked.final.memories_used) == [fact.id]
    follow = vclient.ask_image("Where did the sails come from?", session_id="lookout", max_tokens=2, sampling=GREEDY)
    assert fact.id not in follow.final.memories_used  # told once, it is in the conversation now
    vclient.end_session("lookout")
    vclient.forget(scope="lookout")


def test_status_reports_vision_and_vlmopt_frees_the_encoder(vclient) -> None:
    vclient.ask_image("Anything?", image=screenshot(seed=7), max_tokens=2, sampling=GREEDY)
    status = vclient.status()
    assert status.model.vision_available and status.model.projector_path.endswith("smollm2_projector.gguf")
    v = status.vision
    assert v.available and v.vlmopt and v.placement == "cpu" and v.flash_attention
    assert not v.loaded  # loaded per image, freed after
    assert v.images_encoded >= 1 and v.last_encode_ms > 0 and v.compute_buffer_bytes > 0
    # The worker is a process of its own, counted apart; nothing is set aside without a RAM budget.
    assert status.memory.vision_worker_bytes > 10 << 20 and status.memory.vision_reserved_bytes == 0


def test_a_ram_budget_sets_the_vision_worker_aside_and_images_still_answer(models) -> None:
    from sidecar.local.crowd import vision_host_bytes
    from sidecar.settings import Settings

    projector = models["smollm2_projector"]
    budget = "1200M"
    with_vision = Settings(mmproj=projector, ram_budget=budget, profile="off")
    # What the worker may hold encoding comes out of the conversations the budget holds.
    assert with_vision.sequences() < Settings(ram_budget=budget, profile="off").sequences()
    daemon = start_daemon("--mmproj", str(projector), "--ram-budget", budget, "--no-websocket")
    try:
        with daemon.client(timeout_s=120) as c:
            answer = c.ask_image("Anything?", image=screenshot(seed=12), max_tokens=2, sampling=GREEDY)
            memory = c.status().memory
        shown = subprocess.run([sys.executable, "-m", "sidecar", "status", "--address", daemon.address, "--token",
                                daemon.token], capture_output=True, text=True, timeout=120)
    finally:
        stop_daemon(daemon)
    assert shown.returncode == 0 and "vision worker" in shown.stdout and "set aside" in shown.stdout, shown.stderr
    assert answer.final.image.image_tokens > 0
    assert memory.vision_reserved_bytes == vision_host_bytes(projector.stat().st_size, True)
    assert memory.kv_sequences_max == with_vision.sequences()
    assert 0 < memory.vision_worker_bytes <= memory.vision_reserved_bytes


def _bad_requests() -> list[tuple[str, pb.AskImageRequest]]:
    png = screenshot(64, 64)
    rgba = bytes(64 * 64 * 4)
    raw = lambda **kw: pb.Image(raw=pb.RawImage(**{"width": 64, "height": 64, "format": pb.PIXEL_FORMAT_RGBA8, **kw}))
    return [
        ("corrupt bytes", pb.AskImageRequest(image=pb.Image(encoded=b"\x89PNG\r\n\x1a\n" + bytes(100)), question="?")),
        ("truncated", pb.AskImageRequest(image=pb.Image(encoded=png[: len(png) // 2]), question="?")),
        ("zero size", pb.AskImageRequest(image=raw(pixels=b"", width=0), question="?")),
        ("16384x16384", pb.AskImageRequest(image=raw(pixels=rgba, width=16384, height=16384), question="?")),
        ("pixel count", pb.AskImageRequest(image=raw(pixels=rgba[:-5]), question="?")),
        ("no format", pb.AskImageRequest(image=raw(pixels=rgba, format=pb.PIXEL_FORMAT_UNSPECIFIED), question="?")),
        ("gif", pb.AskImageRequest(image=pb.Image(encoded=b"GIF89a" + bytes(30)), question="?")),
        ("empty question", pb.AskImageRequest(image=pb.Image(encoded=png), question="  ")),
        ("follow-up without image", pb.AskImageRequest(question="and now?", session_id="never-saw-one")),
    ]


def test_bad_images_get_invalid_argument_while_another_conversation_goes_on(vclient, no_end) -> None:
    result: dict = {}

    def talk() -> None:  # no end-of-generation token: all 120 tokens, unless some were lost
        result["reply"] = vclient.complete(pb.GenerateRequest(prompt="Once upon a time", max_tokens=120, sampling=no_end))

    talker = threading.Thread(target=talk)
    talker.start()
    for what, request in _bad_requests():
        with pytest.raises(grpc.RpcError) as e:
            list(vclient.ask_image_stream(request))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert e.value.details(), what
    talker.join(120)
    assert result["reply"].final.usage.completion_tokens == 120  # no token lost to the bad images
    assert vclient.ask_image("Still there?", image=screenshot(seed=9), max_tokens=2).final.image.image_tokens


def test_without_vlmopt_the_encoder_stays_loaded_and_answers_the_same(models, vclient) -> None:
    question = dict(image=screenshot(seed=11), max_tokens=16, sampling=GREEDY)
    streamed = vclient.ask_image("What do you see?", **question)
    resident = start_daemon("--mmproj", str(models["smollm2_projector"]), "--no-vlmopt", "--no-websocket")
    try:
        with resident.client(timeout_s=120) as c:
            same = c.ask_image("What do you see?", **question)
            v = c.status().vision
    finally:
        stop_daemon(resident)
    # The same image becomes the same prompt wherever the encoder lives. (Not asserted: the same
    # tokens. Two daemons with other histories compute the text model in other batch layouts and
    # threads, and llama.cpp promises identity for neither.)
    assert same.final.usage.prompt_tokens == streamed.final.usage.prompt_tokens
    assert same.final.image.image_tokens == streamed.final.image.image_tokens and same.final.image.image_tokens > 0
    assert not v.vlmopt and v.loaded and v.placement == "cpu_resident"


def _serve_exit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--profile", "off", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_projector_for_another_model_is_refused_at_start(models) -> None:
    done = _serve_exit("--model", str(models["tiny_llama"]), "--mmproj", str(models["smollm2_projector"]))
    assert done.returncode == 3
    assert "576-wide" in done.stderr and "not a pair" in done.stderr


@pytest.mark.parametrize("which", ["text model", "missing"])
def test_an_mmproj_that_is_no_projector_is_refused_at_start(models, tmp_path, which) -> None:
    path = models["tiny_llama"] if which == "text model" else tmp_path / "nope.gguf"
    done = _serve_exit("--model", str(models["tiny_llama"]), "--mmproj", str(path))
    assert done.returncode == 3
    assert ("not a vision projector" if which == "text model" else "not found") in done.stderr
