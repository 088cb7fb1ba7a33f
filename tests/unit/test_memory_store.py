"""NPC memory's pure parts: the store's scopes, bounds and search, the word vectors, what a dropped
turn becomes, what fits a turn's budget, and where the recalled block sits in a prompt."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.backend.prompt_layout import RECALLED, new_turn, untold
from sidecar.backend.chat_segments import Segment, tokenize_segments
from sidecar.backend.requests import IMAGE_MARKER, Prompt
from sidecar.errors import InvalidArgument
from sidecar.memory import recall
from sidecar.memory.lexical import LEXICAL_DIMS, lexical_vector
from sidecar.memory.store import MemoryStore
from sidecar.memory.checks import check_name, check_tags, check_text

pytestmark = pytest.mark.fast


def unit(*values: float, dims: int = 4) -> np.ndarray:
    v = np.zeros(dims, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def test_search_reads_only_the_scopes_named() -> None:
    store = MemoryStore(4, max_per_scope=10, max_total=100)
    [mira] = store.add("smith/p1", ["sister Mira"], unit(1, 0)[None])
    store.add("smith/p2", ["sister Anya"], unit(1, 0)[None])
    [lore] = store.add("village", ["the mill burned"], unit(0.9, 0.1)[None])
    found = store.search(["smith/p1", "village"], unit(1, 0), k=5)
    assert [m.id for m, _ in found] == [mira.id, lore.id]  # best first; p2's never
    assert store.search(["nobody"], unit(1, 0), k=5) == []


def test_tags_filter_and_forget() -> None:
    store = MemoryStore(4, 10, 100)
    a, b = store.add("s", ["a", "b"], np.stack([unit(1), unit(0, 1)]), tags=("quest",))
    [c] = store.add("s", ["c"], unit(1, 1)[None])
    assert {m.id for m, _ in store.search(["s"], unit(1), k=5, tags=("quest",))} == {a.id, b.id}
    assert store.forget(tags=("quest",)) == 2
    assert [m.id for m in store.listing()[0]] == [c.id]
    assert store.forget(ids=(c.id, 999)) == 1 and len(store) == 0


def test_bounds_evict_the_least_used_then_oldest() -> None:
    store = MemoryStore(4, max_per_scope=3, max_total=4)
    first, second, third = store.add("s", ["1", "2", "3"], np.stack([unit(1), unit(0, 1), unit(0, 0, 1)]))
    store.mark_used([first])
    store.add("s", ["4"], unit(0, 0, 0, 1)[None])  # scope full: `second` (unused, oldest) goes
    assert [m.text for m in store.listing(scope="s")[0]] == ["1", "3", "4"]
    store.add("t", ["5"], unit(1)[None])
    store.add("t", ["6"], unit(1)[None])  # the store full: the least used anywhere goes
    assert len(store) == 4 and store.evicted == 2
    assert first.id in {m.id for m in store.listing()[0]}


def test_a_lowered_bound_lets_the_least_used_go_at_once() -> None:
    store = MemoryStore(4, max_per_scope=10, max_total=10)
    kept, *rest = store.add("s", ["1", "2", "3", "4"], np.stack([unit(1), unit(0, 1), unit(0, 0, 1), unit(1, 1)]))
    store.mark_used([kept])
    assert store.set_max_total(2) == 2 and len(store) == 2
    assert kept.id in {m.id for m in store.listing()[0]}
    assert store.max_per_scope == 2  # a scope is never allowed more than the store
    with pytest.raises(InvalidArgument):
        store.set_max_total(0)


def test_removal_keeps_rows_and_memories_aligned() -> None:
    store = MemoryStore(4, 100, 100)
    vectors = np.stack([unit(*(np.eye(4)[i % 4] + 0.1 * i)) for i in range(10)])
    made = store.add("s", [str(i) for i in range(10)], vectors)
    store.forget(ids=(made[0].id, made[4].id))
    for m in made:
        if m.id in (made[0].id, made[4].id):
            continue
        best, score = store.search(["s"], vectors[int(m.text)], k=1)[0]
        assert best.id == m.id and score == pytest.approx(1.0, abs=1e-5)


def test_word_vectors_meet_on_shared_words_and_stems() -> None:
    fact = lexical_vector("My sister is called Mira.")
    assert lexical_vector("what's my sister's name?") @ fact > 0.3
    assert lexical_vector("Will it rain on the market tomorrow?") @ fact < 0.15
    assert lexical_vector("the of and").shape == (LEXICAL_DIMS,) and not lexical_vector("the of and").any()


def test_dropped_turns_become_one_memory_per_user_turn() -> None:
    messages = (("user", "Hi"), ("assistant", "Hello."), ("system", "Tools: none"), ("user", "My sister is Mira"),
                ("assistant", "x " * 400))
    turns = recall.turn_memories(messages, first_turn=5)
    assert [t.turn for t in turns] == [5, 6]
    assert turns[0].text == "The player said: Hi\nYou answered: Hello."
    assert "Mira" in turns[1].text and len(turns[1].text) < 400


def told(found, budget_tokens: int) -> list[int]:
    return [i for i, _ in recall.choose(found, budget_tokens)]


def test_choose_keeps_to_the_budget_and_the_score_floor() -> None:
    found = [(None, 0.5, "a" * 300), (None, 0.45, "b" * 30), (None, 0.41, "c" * 30), (None, 0.1, "d")]
    assert told(found, budget_tokens=45) == [1, 2]  # the long one does not fit; d scores too low
    assert told(found, budget_tokens=1000) == [0, 1, 2]


def test_choose_tells_only_what_scores_near_the_best() -> None:
    # A clear match leaves the chatter behind it untold, though it clears the floor and fits.
    found = [(None, 0.78, "fact"), (None, 0.31, "chatter"), (None, 0.30, "more chatter")]
    assert told(found, budget_tokens=1000) == [0]
    # Close scores are all told: the fact may be second (bench/run.py memory: up to 0.069 behind).
    close = [(None, 0.40, "chatter"), (None, 0.39, "more chatter"), (None, 0.33, "fact"), (None, 0.29, "far")]
    assert told(close, budget_tokens=1000) == [0, 1, 2]
    assert told([], budget_tokens=1000) == []


def test_choose_tells_a_text_once() -> None:
    said = "The player said: Good morning!\nYou answered: Morning."
    found = [(None, 1.0, said), (None, 1.0, said), (None, 0.95, "The player said: Good morning, Brom!")]
    assert told(found, budget_tokens=1000) == [0, 2]


def test_a_turn_that_does_not_fit_whole_is_told_by_the_players_words() -> None:
    turn = recall.turn_memories((("user", "My sister is called Mira."), ("assistant", "x " * 50)), first_turn=1)[0]
    chatter = "The player said: Nice weather.\nYou answered: " + "y " * 40
    found = [(None, 0.40, chatter), (None, 0.35, turn.text)]
    budget = recall.estimated_tokens(RECALLED) + recall.estimated_tokens(chatter) + 12
    assert recall.choose(found, budget) == [(0, chatter), (1, "The player said: My sister is called Mira.")]
    # The same words the player said twice (answered differently) are told once.
    again = "The player said: My sister is called Mira.\nYou answered: Nice."
    assert [i for i, _ in recall.choose([(None, 0.4, turn.text), (None, 0.4, again)], 1000)] == [0]
    # Memories the game wrote are told whole or not at all.
    assert recall.choose([(None, 0.40, chatter), (None, 0.35, "Mira " * 30)], budget) == [(0, chatter)]


def test_memories_sit_after_the_persona_and_history_before_the_new_turn() -> None:
    history = [("system", "World. You are Brom."), ("user", "hi"), ("assistant", "hello")]
    p = Prompt(messages=(("user", "my sister?"),), memories=("Mira is her name",))
    later = history + new_turn(p, history)
    assert later[3] == ("system", RECALLED + "\n- Mira is her name") and later[4] == ("user", "my sister?")
    first = new_turn(Prompt(messages=(("system", "You are Brom."), ("user", "hi")), context="World.",
                            memories=("M",)), [])
    assert first == [("system", "World.\n\nYou are Brom."), ("system", RECALLED + "\n- M"), ("user", "hi")]


def test_a_memory_the_conversation_holds_is_not_told_again() -> None:
    history = [("system", "You are Brom."), ("system", RECALLED + "\n- Mira is her name"), ("user", "hi"),
               ("assistant", "hello")]
    assert untold(("Mira is her name", "The mill burned"), history) == (1,)
    assert new_turn(Prompt(messages=(("user", "q"),), memories=("Mira is her name",)), history) == [("user", "q")]
    # Once the turn that told it has left the context, it is told again.
    assert untold(("Mira is her name",), history[2:]) == (0,)


def test_a_dropped_turns_image_is_no_image_when_recalled() -> None:
    # An OpenAI chat turn's image sits in its message as the marker; recalled with it, the marker
    # would stand for an image the later turn does not carry and the turn would be refused.
    turns = recall.turn_memories((("user", f"{IMAGE_MARKER}\nWhat is this?"), ("assistant", "A sword.")), first_turn=1)
    assert IMAGE_MARKER not in turns[0].text and IMAGE_MARKER not in turns[0].said
    told = new_turn(Prompt(messages=(("user", "and now?"),), memories=(turns[0].text,)), [])
    tokenize_segments(lambda text, add_bos, parse_special: [0] * len(text), [Segment(c, False) for _, c in told])


@pytest.mark.parametrize("text", ["", "   ", "a\x00b", "\x1b[2J", "x" * 5000, f"a {IMAGE_MARKER} b"])
def test_bad_memory_text_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument):
        check_text(text, "text")


def test_bad_names_and_tags_are_refused() -> None:
    for bad in ("", "a\nb", "x" * 200):
        with pytest.raises(InvalidArgument):
            check_name(bad, "scope", 128)
    with pytest.raises(InvalidArgument):
        check_tags([f"t{i}" for i in range(17)])
    assert check_tags(["a", "a", "b"]) == ("a", "b")
