"""Composition of one forward pass (pure)."""

from sidecar.engine.scheduling.step import SequenceDemand, plan_step, threads_for


def test_decode_tokens_are_chosen_first_and_prompts_fill_the_rest() -> None:
    demands = [
        SequenceDemand(seq=0, tokens=tuple(range(100, 110)), start_pos=0, decoding=False),
        SequenceDemand(seq=1, tokens=(7,), start_pos=42, decoding=True),
        SequenceDemand(seq=2, tokens=(8,), start_pos=5, decoding=True),
    ]
    plan = plan_step(demands, n_batch=6)
    assert plan.n_tokens == 6
    assert dict(plan.fed) == {1: 1, 2: 1, 0: 4}
    # Entries go out by sequence id: the cut prompt of sequence 0, then the two decoders.
    assert [(e.seq, e.pos) for e in plan.entries] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 42), (2, 5)]
    # The prompt is cut, so it asks for no logits yet; the decoding sequences do.
    assert dict(plan.logits_at) == {1: 4, 2: 5}
    assert [e.logits for e in plan.entries] == [False, False, False, False, True, True]


def test_entries_run_in_sequence_order_so_llama_cpp_keeps_them_in_one_micro_batch() -> None:
    # llama.cpp's split for per-sequence KV streams takes consecutive sequence ids in batch order;
    # a prompt between decoders must not break the run.
    demands = [SequenceDemand(4, (40,), 9, True), SequenceDemand(6, (60,), 9, True),
               SequenceDemand(5, (1, 2), 0, False), SequenceDemand(3, (30,), 9, True)]
    plan = plan_step(demands, n_batch=512)
    assert [e.seq for e in plan.entries] == [3, 4, 5, 5, 6]
    assert plan.logits_at == ((3, 0), (4, 1), (5, 3), (6, 4))
    assert all(plan.entries[i].logits for _, i in plan.logits_at)


def test_a_prompt_that_ends_in_this_pass_asks_for_its_last_logits() -> None:
    plan = plan_step([SequenceDemand(3, (1, 2, 3), 10, False)], n_batch=512)
    assert [(e.token, e.pos, e.logits) for e in plan.entries] == [(1, 10, False), (2, 11, False), (3, 12, True)]
    assert plan.logits_at == ((3, 2),)


def test_more_decoders_than_the_batch_holds_wait_their_turn() -> None:
    demands = [SequenceDemand(i, (i,), 0, True) for i in range(5)]
    plan = plan_step(demands, n_batch=3)
    assert [seq for seq, _ in plan.fed] == [0, 1, 2]


def test_threads_follow_the_smallest_tier_holding_the_pass() -> None:
    tiers = ((1, 2), (16, 4), (512, 8))
    assert [threads_for(n, tiers) for n in (1, 2, 16, 17, 512, 4096)] == [2, 4, 4, 8, 8, 8]


def test_beside_a_streaming_reply_prompts_take_only_their_budget() -> None:
    demands = [SequenceDemand(0, tuple(range(100)), 0, False), SequenceDemand(1, (7,), 42, True),
               SequenceDemand(2, tuple(range(50)), 0, False)]
    plan = plan_step(demands, n_batch=512, prompt_beside_replies=30)
    # The reply's token goes in; the two prompts share 30 tokens, in the order given.
    assert dict(plan.fed) == {1: 1, 0: 30}
    assert plan.logits_at == ((1, 30),)


def test_with_no_reply_streaming_a_prompt_takes_the_whole_pass() -> None:
    demands = [SequenceDemand(0, tuple(range(100)), 0, False)]
    plan = plan_step(demands, n_batch=64, prompt_beside_replies=30)
    assert dict(plan.fed) == {0: 64}


def test_beside_a_reply_a_short_prompt_goes_whole_and_a_long_one_waits_its_budget() -> None:
    demands = [SequenceDemand(1, (7,), 42, True), SequenceDemand(0, tuple(range(300)), 0, False),
               SequenceDemand(2, tuple(range(40)), 0, False), SequenceDemand(3, tuple(range(50)), 0, False)]
    plan = plan_step(demands, n_batch=512, prompt_beside_replies=10, whole_below=64)
    assert dict(plan.fed) == {1: 1, 0: 10, 2: 40, 3: 50}
    # The long prompt's budget spent, short prompts after it still go.
    spent = plan_step(demands, n_batch=512, prompt_beside_replies=0, whole_below=64)
    assert dict(spent.fed) == {1: 1, 2: 40, 3: 50}


def test_a_long_prompt_stays_sliced_to_its_end() -> None:
    # The last 100 tokens of a 3,000-token prompt: under whole_below, but the prompt is long, and
    # those 100 tokens deep in its context would hold every stream for one long pass.
    tail = SequenceDemand(0, tuple(range(100)), 2900, False, prefill_tokens=3000)
    reply = SequenceDemand(1, (7,), 42, True)
    plan = plan_step([reply, tail], n_batch=512, prompt_beside_replies=20, whole_below=128)
    assert dict(plan.fed) == {1: 1, 0: 20}
    # A prompt that was short from the start still goes whole.
    short = SequenceDemand(0, tuple(range(100)), 50, False, prefill_tokens=100)
    assert dict(plan_step([reply, short], n_batch=512, prompt_beside_replies=20, whole_below=128).fed) == {1: 1, 0: 100}
