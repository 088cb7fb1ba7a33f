"""An image question over the OpenAI-compatible API: SmolLM2 with the generated projector (its
weights are random, so the answer is not about the picture; what is tested is the path: a data:
URL decoded and checked as AskImage checks it, encoded, placed in the conversation, and a session
follow-up that resends it reusing the image's KV instead of encoding again)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
from PIL import Image

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import http_bias, http_eog_ids
from support.openai_http_support import http_base

pytestmark = pytest.mark.slow
PROJECTOR_TOKENS = 16  # the generated projector: 64 px images, 8 px patches pooled 2x2


def data_url(width: int = 320, height: int = 180, seed: int = 0) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def vision_api(model_files) -> Iterator[RunningDaemon]:
    models = model_files()
    running = start_daemon("--mmproj", str(models["smollm2_projector"]), "--no-websocket")
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def client(vision_api: RunningDaemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=http_base(vision_api) + "/v1", api_key=vision_api.token, max_retries=0, timeout=300) as c:
        yield c


def question(url: str, text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}


def test_an_image_question_answers_and_a_resent_image_is_not_encoded_again(client: openai.OpenAI,
                                                                           vision_api: RunningDaemon) -> None:
    # The end-of-generation tokens banned: each reply says something (after a random projector's
    # embeddings the model may well end at once).
    no_end = http_bias(http_eog_ids(http_base(vision_api), vision_api.token))
    with vision_api.client(timeout_s=60) as grpc_client:
        encoded_before = grpc_client.status().vision.images_encoded
        messages = [{"role": "system", "content": "You describe screenshots."}, question(data_url(), "What is on the screen?")]
        first = client.chat.completions.create(model=client.models.list().data[0].id,
                                               messages=messages, max_tokens=8, temperature=0, user="hud", logit_bias=no_end)
        assert first.choices[0].message.content.strip()
        assert first.usage.prompt_tokens > PROJECTOR_TOKENS
        assert grpc_client.status().vision.images_encoded == encoded_before + 1
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And what colour is it?"}]
        follow = client.chat.completions.create(model=first.model, messages=messages, max_tokens=6, temperature=0, user="hud",
                                                logit_bias=no_end)
        assert follow.choices[0].message.content.strip()
        assert grpc_client.status().vision.images_encoded == encoded_before + 1  # the image's KV was reused
        assert follow.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_a_bad_image_is_a_400_and_two_new_images_are_refused(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    not_png = "data:image/png;base64," + base64.b64encode(b"this is not a picture").decode()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[question(not_png, "What is it?")], max_tokens=4)
    two = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(seed=1)}},
                                       {"type": "image_url", "image_url": {"url": data_url(seed=2)}}]}
    with pytest.raises(openai.BadRequestError, match="one new image"):
        client.chat.completions.create(model=model, messages=[two], max_tokens=4)
