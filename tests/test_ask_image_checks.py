"""AskImage is checked as every turn is (issue 37: one turn, built once): its question and image
first, then the GenerateRequest it amounts to, by the same rules and the backend's limits. Before,
AskImage had a spec builder of its own that skipped them: a logit bias past the vocabulary, or a
question longer than the prompt limit by its bytes alone, reached the engine."""

from __future__ import annotations

import pytest

from sidecar.api import pb
from sidecar.backend.contract import RequestLimits
from sidecar.errors import ContextLengthExceeded, InvalidArgument
from sidecar.service.convert import image_spec_from_pb

pytestmark = pytest.mark.fast
LIMITS = RequestLimits(max_prompt_tokens=64, max_tokens_per_request=256, vision=True, compiles_grammar=False,
                       vocabulary=49152, model_calls=True)


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
