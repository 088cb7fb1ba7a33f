"""SetBudget.ram_size: a RAM budget the game changes while the daemon runs, on a live daemon with
the real model. Lowered under streaming NPCs no reply is cut (each runs its whole length) and the
KV comes down inside the budget once they end; raised again the ceiling goes back up and the crowd
grows into it; a budget too small for the model or not a size is refused and changes nothing; "0"
removes it; the WebSocket bridge carries it too; remote mode refuses it. Only mechanism is
asserted (counts, finish reasons, status fields), never what the model says.

The budgets are found by the launch rule itself (Settings.sequences(), local/crowd.py), so the test
follows that rule if its shares change, rather than hard-coding megabytes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.suite_model import suite_model_path
from support.no_early_stop import default_eog_ids, grpc_bias
from sidecar.api import pb
from sidecar.backend.engine_config import EngineConfig
from sidecar.budget import Budget
from sidecar.local.crowd import PROCESS_BYTES, SAVED_SESSIONS_SHARE
from sidecar.engine.scheduling.kv_sizing import ceiling_count
from sidecar.engine.scheduling.slot import Slot
from sidecar.errors import Unimplemented
from sidecar.local.executor import gpu_free_bytes
from sidecar.remote.budget import RemoteBudget
from sidecar.service.core import ServiceInfo, SidecarService
from sidecar.service.ram_budget import MemoryShares
from sidecar.service.state import DaemonState, StateHub
from sidecar.settings import Settings

CTX = 1024
STREAMS = 4
MAX_TOKENS = 48


def sequences_for(mib: int) -> int:
    return Settings(model=suite_model_path(), ctx=CTX, ram_budget=f"{mib}M").sequences()


def smallest_budget_mib(holding: int) -> int:
    """The smallest budget in MiB whose ceiling is `holding` sequences or more."""
    mib = 200
    while True:
        try:
            if sequences_for(mib) >= holding:
                return mib
        except Exception:  # below what the model needs
            pass
        mib += 4


# Launch holding all the streams at once; shrink to one that holds only two of them.
LAUNCH_MIB = smallest_budget_mib(STREAMS) + 16
SMALL_MIB = smallest_budget_mib(2)


@pytest.fixture(scope="module")
def ram_daemon() -> Iterator[RunningDaemon]:
    running = start_daemon("--budget", "0", "--ctx", str(CTX), "--ram-budget", f"{LAUNCH_MIB}M",
                           "--stream-interval-ms", "0")
    yield running
    stop_daemon(running)


def no_end_request(i: int, max_tokens: int = MAX_TOKENS) -> pb.GenerateRequest:
    # The end-of-generation tokens banned: each reply runs to max_tokens (no_early_stop.py).
    return pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=f"NPC {i}, tell me a long tale.")]),
        session_id=f"npc-{i}", max_tokens=max_tokens,
        sampling=pb.SamplingParams(temperature=0.0, logit_bias=grpc_bias(default_eog_ids())))


class Stream(threading.Thread):
    """One NPC's reply, read to its end: how many tokens came, the final chunk, any error."""

    def __init__(self, client, request: pb.GenerateRequest) -> None:
        super().__init__(daemon=True)
        self.client, self.request = client, request
        self.tokens = 0
        self.final: pb.FinalChunk | None = None
        self.error: BaseException | None = None
        self.started = threading.Event()

    def run(self) -> None:
        try:
            for chunk in self.client.generate(self.request):
                self.tokens += len(chunk.token_ids)
                if self.tokens:
                    self.started.set()
                if chunk.HasField("final"):
                    self.final = chunk.final
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.started.set()


def set_ram(client, size: str) -> pb.SetBudgetResponse:
    return client.set_budget(pb.SetBudgetRequest(ram_size=size))


def settled_memory(client, timeout_s: float = 30.0) -> pb.MemoryUse:
    """Status once the KV holds no more sequences than its ceiling (the busy ones beyond a lowered
    one go as their replies end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        memory = client.status().memory
        if memory.kv_sequences <= memory.kv_sequences_max or time.monotonic() > deadline:
            return memory
        time.sleep(0.1)


def test_lowering_the_budget_under_live_streams_cuts_none_and_the_kv_comes_down_within_it(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=300) as client:
        set_ram(client, f"{LAUNCH_MIB}M")
        before = client.status()
        assert before.memory.ram_budget_bytes == LAUNCH_MIB << 20
        assert before.memory.kv_sequences_max >= STREAMS
        events: list[pb.StateEvent] = []
        subscribed = threading.Event()
        watching = threading.Thread(target=_watch_for, args=(client, "ram budget", events, subscribed), daemon=True)
        watching.start()
        assert subscribed.wait(60)  # its first event ("initial") came: the change below is seen

        streams = [Stream(client, no_end_request(i)) for i in range(STREAMS)]
        for s in streams:
            s.start()
        for s in streams:
            assert s.started.wait(120)
        during = client.status().memory
        answer = set_ram(client, f"{SMALL_MIB}M")
        live = sum(1 for s in streams if s.final is None)
        after = client.status().memory
        for s in streams:
            s.join(300)

        assert during.kv_sequences >= STREAMS  # all four ran at once before the shrink
        assert not answer.reloaded  # the weights stay: only the KV and the caches resize
        assert answer.budget.ram_bytes == SMALL_MIB << 20  # the answer says which budget is in force
        assert after.ram_budget_bytes == SMALL_MIB << 20 and after.kv_sequences_max == sequences_for(SMALL_MIB) == 2
        assert live >= 1, "every stream had ended before the budget changed: nothing was tested under load"
        for s in streams:
            assert s.error is None, s.error
            assert s.final is not None and s.final.finish_reason == pb.FINISH_REASON_LENGTH
            assert s.final.usage.completion_tokens == MAX_TOKENS and s.tokens == MAX_TOKENS

        memory = settled_memory(client)
        assert memory.kv_sequences <= memory.kv_sequences_max == 2
        status = client.status()
        budget = SMALL_MIB << 20
        prefix_max, saved_max = status.prefix_cache.max_bytes, int(budget * SAVED_SESSIONS_SHARE)
        assert memory.prefix_cache_bytes <= prefix_max and memory.saved_sessions_bytes <= saved_max
        # What local/crowd.py counts inside a budget: the process, the weights, the two caches' shares
        # and the KV held.
        counted = PROCESS_BYTES + status.model.file_bytes + prefix_max + saved_max + memory.kv_cache_held_bytes
        assert counted <= budget, f"{counted >> 20} MiB counted past the {SMALL_MIB} MiB budget"
        watching.join(10)
        assert events and events[0].reason == "ram budget"


def test_the_process_comes_back_under_a_lowered_budget_once_replies_end() -> None:
    # Issue 36, P7: 8 NPCs talking at the default context, ram_size lowered to 420M, 956 MB
    # resident after they finished. The whole process is measured here, not only what the rule
    # counts: the sequences given back must leave the process (their KV buffers, and glibc's heap
    # trimmed after a shrink), not sit in it. Without a measured profile, whose background
    # measurement takes memory of its own for a while.
    budget_mib, npcs = 420, 8
    assert Settings(model=suite_model_path(), ram_budget=f"{budget_mib}M").sequences() == 1
    daemon = start_daemon("--budget", "0", "--stream-interval-ms", "0", "--profile", "off")
    try:
        with daemon.client(timeout_s=300) as client:
            streams = [Stream(client, no_end_request(20 + i)) for i in range(npcs)]
            for s in streams:
                s.start()
            for s in streams:
                assert s.started.wait(120)
            during = client.status().memory
            set_ram(client, f"{budget_mib}M")
            for s in streams:
                s.join(300)
            assert all(s.error is None and s.tokens == MAX_TOKENS for s in streams)
            memory = settled_memory(client)  # the shrink done (mid-resize, the old context is gone already)
            resident = _resident_when_settled(client, budget_mib << 20)
    finally:
        stop_daemon(daemon)
    assert during.kv_sequences == npcs and during.host_resident_bytes > budget_mib << 20  # a real shrink
    assert memory.kv_sequences == memory.kv_sequences_max == 1
    assert resident <= budget_mib << 20, f"{resident >> 20} MiB resident past the {budget_mib} MiB budget"


def test_evicted_sessions_let_go_under_a_lowered_budget_leave_the_process() -> None:
    # The budget's share for evicted sessions drops their saved states, pieces of a few MB that
    # glibc kept in its heap when no shrink of the KV followed to trim it: 477 MiB resident under
    # 420M before (one sequence allocated, so nothing to shrink).
    budget_mib = 420
    daemon = start_daemon("--budget", "0", "--parallel", "1", "--profile", "off")
    try:
        with daemon.client(timeout_s=300) as client:
            # One long persona shared by all (computed once: the prefix cache), each session's
            # state holding all of it. Each session evicts the one before it to host memory: no
            # cap without a budget.
            persona = pb.ChatMessage(role="system", content="You know all of the old forge, the mines and the war. " * 60)
            for i in range(16):
                request = pb.GenerateRequest(
                    messages=pb.ChatMessages(messages=[persona, pb.ChatMessage(role="user", content=f"NPC {i}, hello")]),
                    session_id=f"saved-{i}", max_tokens=2, sampling=pb.SamplingParams(temperature=0.0))
                assert client.complete(request).final.usage.completion_tokens >= 1
            saved = client.status().memory.saved_sessions_bytes
            set_ram(client, f"{budget_mib}M")
            memory = client.status().memory
            resident = _resident_when_settled(client, budget_mib << 20, timeout_s=3.0)
    finally:
        stop_daemon(daemon)
    assert saved > 150 << 20 and memory.saved_sessions_bytes <= (budget_mib << 20) * SAVED_SESSIONS_SHARE
    assert memory.kv_sequences == 1
    assert resident <= budget_mib << 20, f"{resident >> 20} MiB resident past the {budget_mib} MiB budget"


def test_raising_it_again_raises_the_ceiling_and_the_crowd_grows_into_it(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=300) as client:
        set_ram(client, f"{SMALL_MIB}M")
        assert settled_memory(client).kv_sequences_max == 2
        set_ram(client, f"{LAUNCH_MIB}M")
        assert client.status().memory.kv_sequences_max == sequences_for(LAUNCH_MIB) >= STREAMS
        streams = [Stream(client, no_end_request(10 + i, max_tokens=16)) for i in range(STREAMS)]
        for s in streams:
            s.start()
        for s in streams:
            s.join(300)
        assert all(s.error is None and s.final.finish_reason == pb.FINISH_REASON_LENGTH for s in streams)
        assert client.status().memory.kv_sequences >= STREAMS  # grown past the lowered ceiling


def test_a_budget_too_small_for_the_model_is_refused_saying_what_it_needs(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=120) as client:
        set_ram(client, f"{LAUNCH_MIB}M")
        with pytest.raises(grpc.RpcError) as refused:
            set_ram(client, "1M")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = refused.value.details()
        assert "ram_size 1 MiB is below what this model needs" in message and "weights" in message
        status = client.status()
        memory = status.memory
        assert memory.ram_budget_bytes == status.budget.ram_bytes == LAUNCH_MIB << 20
        assert memory.kv_sequences_max == sequences_for(LAUNCH_MIB)


def test_a_call_refused_for_any_part_changes_nothing(ram_daemon) -> None:
    # SetBudget is all or nothing: a RAM budget that fits must not come into force when the VRAM
    # part of the same call is refused (issue 36, P6: the ceiling went from 16 to 6 regardless).
    def unchanged() -> None:
        status = client.status()
        assert status.memory.ram_budget_bytes == status.budget.ram_bytes == LAUNCH_MIB << 20
        assert status.memory.kv_sequences_max == sequences_for(LAUNCH_MIB)

    with ram_daemon.client(timeout_s=120) as client:
        set_ram(client, f"{LAUNCH_MIB}M")
        device = client.status().memory.placement_device
        refusals = [(pb.SetBudgetRequest(ram_size=f"{SMALL_MIB}M", vram_bytes=2**60), grpc.StatusCode.INVALID_ARGUMENT),
                    (pb.SetBudgetRequest(ram_size=f"{SMALL_MIB}M", max_cpu_threads=5000), grpc.StatusCode.INVALID_ARGUMENT)]
        if gpu_free_bytes(device or "CPU") is None:  # no GPU to follow: automatic VRAM is refused
            refusals.append((pb.SetBudgetRequest(ram_size=f"{SMALL_MIB}M", auto_reserve_bytes=1 << 30),
                             grpc.StatusCode.FAILED_PRECONDITION))
        for request, code in refusals:
            with pytest.raises(grpc.RpcError) as refused:
                client.set_budget(request)
            assert refused.value.code() == code, refused.value.details()
            unchanged()


def test_a_budget_that_is_not_a_size_is_refused(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=120) as client:
        set_ram(client, f"{LAUNCH_MIB}M")
        with pytest.raises(grpc.RpcError) as refused:
            client.set_budget(pb.SetBudgetRequest(ram_size="lots", vram_size="0"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "512M" in refused.value.details()
        assert client.status().memory.ram_budget_bytes == LAUNCH_MIB << 20


def test_zero_removes_the_budget(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=120) as client:
        set_ram(client, f"{SMALL_MIB}M")
        answer = set_ram(client, "0")
        memory = client.status().memory
        assert memory.ram_budget_bytes == 0
        assert memory.kv_sequences_max == Settings(model=suite_model_path(), ctx=CTX).sequences() > 2
        assert answer.budget.vram_bytes == 0  # the VRAM budget is untouched
        assert answer.budget.ram_bytes == 0 and client.status().budget.ram_bytes == 0
        set_ram(client, f"{LAUNCH_MIB}M")


def test_a_vram_or_thread_change_keeps_the_ram_budget_in_force(ram_daemon) -> None:
    with ram_daemon.client(timeout_s=120) as client:
        set_ram(client, f"{SMALL_MIB}M")
        client.set_budget(pb.SetBudgetRequest(vram_size="0", max_cpu_threads=1))  # a re-plan from the launch settings
        memory = client.status().memory
        assert memory.ram_budget_bytes == SMALL_MIB << 20 and memory.kv_sequences_max == 2
        client.set_budget(pb.SetBudgetRequest(max_cpu_threads=0, ram_size=f"{LAUNCH_MIB}M"))
        memory = client.status().memory
        assert memory.ram_budget_bytes == LAUNCH_MIB << 20 and memory.kv_sequences_max == sequences_for(LAUNCH_MIB)
        assert client.status().budget.max_cpu_threads == 0


def test_the_budget_command_sets_and_shows_it(ram_daemon) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sidecar", "budget", *args, "--address", ram_daemon.address,
                               "--token", ram_daemon.token], capture_output=True, text=True, timeout=120)

    done = cli("--ram", f"{SMALL_MIB}M")
    assert done.returncode == 0, done.stderr
    assert f"RAM {SMALL_MIB}M" in done.stdout and "of at most 2 sequences" in done.stdout
    done = cli("--ram", "1M")
    assert done.returncode == 1 and "INVALID_ARGUMENT" in done.stderr and "below what this model needs" in done.stderr
    assert cli("--ram", f"{LAUNCH_MIB}M").returncode == 0


def test_the_websocket_bridge_carries_it(ram_daemon) -> None:
    from support.bridge import BridgeClient

    with BridgeClient(ram_daemon.ws_address, ram_daemon.token) as bridge:
        [frame] = bridge.call("SetBudget", {"ramSize": f"{SMALL_MIB}M"}, call_id="ram")
        assert "result" in frame, frame
        [frame] = bridge.call("GetStatus", call_id="status")
        memory = frame["result"]["memory"]
        assert int(memory["ramBudgetBytes"]) == SMALL_MIB << 20 and int(memory["kvSequencesMax"]) == 2
        [frame] = bridge.call("SetBudget", {"ramSize": "lots"}, call_id="bad")
        assert frame["error"]["code"] == "INVALID_ARGUMENT"
        [frame] = bridge.call("SetBudget", {"ram_size": f"{LAUNCH_MIB}M"}, call_id="back")
        assert "result" in frame, frame


def _resident_when_settled(client, budget: int, timeout_s: float = 10.0) -> int:
    """Resident bytes once within `budget`, or the last reading after `timeout_s` (the last
    sequences go between two passes of the engine loop, which polls every 50 ms meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        resident = client.status().memory.host_resident_bytes
        if resident <= budget or time.monotonic() > deadline:
            return resident
        time.sleep(0.1)


def _watch_for(client, reason: str, found: list, subscribed: threading.Event) -> None:
    deadline = time.monotonic() + 120
    for event in client.watch_state():
        subscribed.set()
        if event.reason == reason:
            found.append(event)
            return
        if time.monotonic() > deadline:
            return


# -- without a model ----------------------------------------------------------------------------


def test_remote_mode_refuses_a_ram_budget_and_changes_nothing() -> None:
    async def run() -> None:
        state = StateHub(DaemonState(phase="ready", budget=Budget(), reason="initial"))
        service = SidecarService(object(), Budget(), ServiceInfo("test", (), 1 << 20))
        service.budget_control = RemoteBudget(Budget(), state)
        for request in (pb.SetBudgetRequest(ram_size="1G"), pb.SetBudgetRequest(ram_size="1G", vram_size="2G")):
            with pytest.raises(Unimplemented, match="a RAM budget applies to a model served here"):
                await service.set_budget(request)
        assert service.budget_control.budget.vram_bytes == 0 and service.ram_budget_bytes == 0

    asyncio.run(run())


def test_the_pool_shrinks_past_no_busy_sequence() -> None:
    slots = [Slot(i) for i in range(8)]
    assert ceiling_count(slots, 2) == 2
    slots[5].active = object()  # a reply streams in sequence 5
    assert ceiling_count(slots, 2) == 6
    assert ceiling_count(slots[:6], 2) is None
    assert ceiling_count(slots[:2], 4) is None


def test_shares_move_only_the_memory_fields() -> None:
    config = EngineConfig(model_path="m.gguf", n_seq=8, n_seq_start=2, n_outputs_max=8, n_gpu_layers=0)
    shares = MemoryShares(ram_budget_bytes=400 << 20, n_seq=3, n_seq_start=2, prefix_cache_bytes=50 << 20,
                          saved_sessions_bytes=50 << 20, most_sequences=16, planned_sequences=8)
    out = shares.apply(config)
    assert (out.n_seq, out.n_seq_start, out.grow_beside, out.n_outputs_max) == (3, 2, False, 16)
    assert (out.n_batch, out.threads_decode, out.kv_on_gpu) == (config.n_batch, config.threads_decode, config.kv_on_gpu)
    assert shares.apply(out) == out  # a re-plan carrying them is no change
    # With the KV in VRAM a bigger RAM budget does not grow it past what the VRAM plan holds.
    on_gpu = EngineConfig(model_path="m.gguf", n_seq=4, n_gpu_layers=30, kv_on_gpu=True)
    more = MemoryShares(0, 16, 2, 256 << 20, 0, 16, 4)
    assert more.apply(on_gpu).n_seq == 4 and more.apply(on_gpu).grow_beside
