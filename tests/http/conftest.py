"""The HTTP tests' clients of the module's own daemon: each test module defines `api` (the daemon,
with the flags it is about); these make the bare URL, llama.cpp's raw requests and the official
`openai` client on it, once, for every module of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from support.daemons import RunningDaemon
from support.openai_http_support import http_base


@pytest.fixture(scope="module")
def base(api: RunningDaemon) -> str:
    return http_base(api)


@pytest.fixture(scope="module")
def raw(api: RunningDaemon, base: str) -> Iterator[httpx.Client]:
    """Plain requests with the token, on the bare URL (llama.cpp's tests' server.make_request)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {api.token}"}, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(api: RunningDaemon, base: str) -> Iterator[openai.OpenAI]:
    """The official `openai` package on the daemon's /v1, as a game's plugin would reach it."""
    with openai.OpenAI(base_url=f"{base}/v1", api_key=api.token, max_retries=0, timeout=120) as c:
        yield c
