"""AskImage is checked as every turn is (issue 37: one turn, built once): its question first, then
the Turn it amounts to, by the same rules and the backend's limits, and its image. Before,
AskImage had a spec builder of its own that skipped them: a logit bias past the vocabulary, or a
question longer than the prompt limit by its bytes alone, reached the engine."""

from __future__ import annotations

import pytest

from sidecar.api import pb
from sidecar.backend.contract import RequestLimits
from sidecar.errors import ContextLengthExceeded, InvalidArgument
from sidecar.service.turn import image_turn, turn_spec

pytestmark = pytest.mark.fast
LIMITS = RequestLimits(max_prompt_tokens=64, max_tokens_per_request=256, vision=True, compiles_grammar=False,
                       vocabulary=49152, model_calls=True)


def image_spec_from_pb(request: pb.AskImageRequest, limits: RequestLimits, max_image_bytes: int):
    return turn_spec(image_turn(request), limits, max_image_bytes)


def follow_up(**fields) -> pb.AskImageRequest:
    return pb.AskImageRequest(question=fields.pop("question", "And its colour?"), session_id="hud", **fields)


def test_a_follow_up_question_is_the_turn_the_engine_takes() -> None:
    spec = image_spec_from_pb(follow_up(max_tokens=12, stop=["."]), LIMITS, 1 << 20)
    assert spec.prompt.messages == (("user", "And its colour?"),) and spec.asks_about_image and spec.image is None
    assert spec.max_tokens == 12 and spec.stop == (".",) and spec.session_id == "hud"


def test_the_backends_limits_hold_for_image_questions_too() -> None:
    with pytest.raises(InvalidArgument, match="not in the model's vocabulary"):
        image_spec_from_pb(follow_up(sampling=pb.SamplingParams(logit_bias={10**6: 1.0})), LIMITS, 1 << 20)
    with pytest.raises(ContextLengthExceeded):
        image_spec_from_pb(follow_up(question="What is that? " * 200), LIMITS, 1 << 20)
    with pytest.raises(InvalidArgument, match="no image"):
        image_spec_from_pb(pb.AskImageRequest(question="What is this?"), LIMITS, 1 << 20)


def test_an_image_question_is_a_turn_with_its_image() -> None:
    png = b"\x89PNG\r\n\x1a\n"
    turn = image_turn(pb.AskImageRequest(question="What is this?", image=pb.Image(encoded=png)))
    assert turn.asks_about_image and turn.image.encoded == png and not turn.resends_history
    assert turn.request.messages.messages[0].content.endswith("\nWhat is this?")
    with pytest.raises(InvalidArgument, match="raw.format"):
        image_spec_from_pb(pb.AskImageRequest(question="What?", image=pb.Image(raw=pb.RawImage(pixels=b"x"))), LIMITS, 1 << 20)
