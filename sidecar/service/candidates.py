"""n > 1: several candidate replies to one prompt, run side by side and streamed as one.

The candidates are submitted together as one-offs marked shares_prompt, so the engine computes
the prompt once and copies it to the others (prefix_sharing.py). With a fixed seed each candidate
samples with its own (seed + index), or every candidate would be the same line. They are one
request's (GenerationSpec.group), which the engine admits in turn with the others.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from sidecar.api import pb
from sidecar.backend.requests import GenerationSpec
from sidecar.backend.sampling import SamplingConfig

_SEEDS = 2**32 - 1


def candidate_specs(spec: GenerationSpec, n: int) -> list[GenerationSpec]:
    def sampling(i: int) -> SamplingConfig:
        s = spec.sampling
        return s if s.seed is None else replace(s, seed=(s.seed + i) % _SEEDS)

    # One-offs: no session (candidates.candidates refuses one), and a resent conversation is
    # simply the whole prompt. Several prompts' candidates come with their request's group.
    group = spec.group or uuid.uuid4().hex
    return [replace(spec, sampling=sampling(i), shares_prompt=True, resends_history=False, session_id="",
                    request_id=f"{spec.request_id}#{i}" if spec.request_id else "", group=group) for i in range(n)]


async def merged(streams: list[AsyncIterator[pb.GenerateChunk]], stride: int = 1) -> AsyncIterator[pb.GenerateChunk]:
    """Every stream's chunks as they come, stream i's chunk of index j tagged i * stride + j
    (several prompts of n candidates each: OpenAI's order); the first error ends them all (and
    is raised), as does the caller stopping early."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[pb.GenerateChunk]) -> None:
        try:
            async for chunk in stream:
                chunk.index = index * stride + chunk.index
                await queue.put(chunk)
            await queue.put(done)
        except BaseException as e:  # handed to the reader, which raises it
            await queue.put(e)
        finally:
            await stream.aclose()

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def fan_out(spec: GenerationSpec, n: int,
            stream: Callable[[GenerationSpec], AsyncIterator[pb.GenerateChunk]]) -> AsyncIterator[pb.GenerateChunk]:
    """The candidates' streams merged. Every candidate is submitted before the first chunk is
    awaited (the streams start in order), so the engine sees them in one admission."""
    return merged([stream(s) for s in candidate_specs(spec, n)])
