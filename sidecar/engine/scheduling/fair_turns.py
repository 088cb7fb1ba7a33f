"""The order admission considers waiting requests in: requests in turn, not generations.

One request may bring many generations (n candidates, several prompts: up to 16). In arrival order
they all went ahead of a later NPC's line, which then waited for every one of them (16 prompts of
16 candidates each made an NPC wait 71.9 s). So a waiting generation's turn is the number of its
request's generations that hold a sequence or wait before it: a request's first generation goes
before another request's second, and a lone request (no group) always has turn 0. Within a turn,
arrival order: a session's turns, and a request's candidates (the first computes the shared
prompt, prefix_sharing.py), keep their order. Pure: no llama.cpp here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from sidecar.backend.requests import Job
from sidecar.engine.scheduling.slot import Slot


def fair_order(waiting: Iterable[Job], slots: Iterable[Slot]) -> list[Job]:
    held = Counter(s.active.job.spec.group for s in slots if s.active is not None and s.active.job.spec.group)
    turns = []
    for arrival, job in enumerate(waiting):
        group = job.spec.group
        turn = held[group] if group else 0
        if group:
            held[group] += 1
        turns.append((turn, arrival, job))
    return [job for _, _, job in sorted(turns, key=lambda t: t[:2])]
