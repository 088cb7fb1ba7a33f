"""--ram-budget and the KV that grows with the crowd, on a live daemon with the real model: the
daemon's resident memory stays inside the budget at start and with more NPCs talking than it holds
sequences for, status says held against used, and a budget too small for the model is refused at
launch with what the model needs."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import psutil
import pytest

from support.daemons import start_daemon, stop_daemon
from support.suite_model import suite_model_path
from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.settings import Settings

BUDGET_MB = 512


def test_a_budget_below_what_the_model_needs_is_refused_at_launch() -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--ram-budget", "150M"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--ram-budget 150 MiB is below what this model needs" in done.stderr and "weights" in done.stderr


def test_the_refusal_names_a_budget_that_is_accepted() -> None:
    # The caches' shares grow with the budget: the figure once named was the sum at the refused
    # budget, and that figure was refused too (issue 36, P8: "needs 358 MiB", 358M and 373M refused).
    # The model the daemon below serves (the suite's), so the figure is checked where it is named.
    model = suite_model_path()
    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--model", str(model),
                           "--ram-budget", "300M"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    need = int(re.search(r"below what this model needs: (\d+) MiB", done.stderr)[1])
    assert f"--ram-budget {need}M holds one conversation" in done.stderr
    assert Settings(model=model, ram_budget=f"{need}M").sequences() == 1
    with pytest.raises(InvalidArgument, match=f"needs: {need} MiB"):
        Settings(model=model, ram_budget=f"{need - 1}M").sequences()
    daemon = start_daemon("--budget", "0", "--ram-budget", f"{need}M")
    try:
        with daemon.client(timeout_s=60) as client:
            memory = client.status().memory
        assert memory.ram_budget_bytes == need << 20 and memory.kv_sequences_max == 1
    finally:
        stop_daemon(daemon)


def test_the_daemon_keeps_inside_its_ram_budget_through_a_crowd() -> None:
    daemon = start_daemon("--budget", "0", "--ram-budget", f"{BUDGET_MB}M")
    try:
        process = psutil.Process(daemon.process.pid)
        with daemon.client(timeout_s=180) as client:
            memory = client.status().memory
            assert memory.ram_budget_bytes == BUDGET_MB << 20
            assert 1 <= memory.kv_sequences <= memory.kv_sequences_max
            assert memory.kv_cache_held_bytes >= memory.kv_cache_bytes
            assert process.memory_info().rss < BUDGET_MB << 20
            peak = [0]
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], process.memory_info().rss)
                    stop.wait(0.05)

            watcher = threading.Thread(target=watch)
            watcher.start()
            errors: list[BaseException] = []

            def npc(i: int) -> None:
                try:
                    request = pb.GenerateRequest(
                        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=f"NPC {i}, tell me a tale.")]),
                        session_id=f"npc-{i}", max_tokens=24, sampling=pb.SamplingParams(temperature=0.0))
                    assert client.complete(request).final is not None
                except BaseException as e:  # reported below
                    errors.append(e)

            talkers = [threading.Thread(target=npc, args=(i,)) for i in range(8)]
            for t in talkers:
                t.start()
            for t in talkers:
                t.join(300)
            stop.set()
            watcher.join()
            assert not errors, errors
            after = client.status().memory
            assert after.kv_sequences <= after.kv_sequences_max < 8  # fewer at once than talked: the rest waited
            assert peak[0] < BUDGET_MB << 20, f"resident {peak[0] >> 20} MiB past the {BUDGET_MB} MiB budget"
    finally:
        stop_daemon(daemon)


@pytest.mark.parametrize("flags, grows", [((), True), (("--parallel", "3"), False)])
def test_without_a_budget_the_kv_starts_small_and_grows_with_demand(flags, grows) -> None:
    daemon = start_daemon("--budget", "0", "--ctx", "1024", *flags)
    try:
        with daemon.client(timeout_s=180) as client:
            start = client.status().memory
            assert (start.kv_sequences < start.kv_sequences_max) == grows

            def npc(i: int) -> None:
                client.complete(pb.GenerateRequest(prompt=f"Tale {i}:", max_tokens=24, sampling=pb.SamplingParams(temperature=0.0)))

            talkers = [threading.Thread(target=npc, args=(i,)) for i in range(start.kv_sequences_max)]
            for t in talkers:
                t.start()
            for t in talkers:
                t.join(300)
            after = client.status().memory
            assert after.kv_sequences == after.kv_sequences_max
            assert after.kv_cache_held_bytes >= start.kv_cache_held_bytes
    finally:
        stop_daemon(daemon)


def test_the_vision_worker_comes_out_of_the_budget_and_is_named_when_it_does_not_fit() -> None:
    from sidecar.local.crowd import sequences_within, vision_host_bytes
    from sidecar.errors import InvalidArgument

    mib = 1 << 20
    vision = vision_host_bytes(200 * mib, True)
    assert vision == (60 + 200 + 128) * mib
    plain = sequences_within(1024 * mib, 98 * mib, 94 * mib, 64 * mib, 4096)
    assert sequences_within(1024 * mib, 98 * mib, 94 * mib, 64 * mib, 4096, vision_bytes=vision) == plain - 4 == 2
    with pytest.raises(InvalidArgument, match="the vision worker encoding 388"):
        sequences_within(512 * mib, 98 * mib, 94 * mib, 64 * mib, 4096, vision_bytes=vision)
