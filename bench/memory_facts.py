"""The memory benchmark's evening: 20 facts a player tells an NPC early on, a paraphrased question
about each asked long after it has left the context, and small talk in between.

Written here for the benchmark. The questions are how a player would ask again, not the fact's
words: most share one content word with the fact (the way people refer back: "my sister"), some
share none ("where did I grow up" for "born in Saltmere"), so a retriever that only matches words
is measured as such. `small_talk` draws from a fixed vocabulary of a market town, seeded, so every
run asks the same evening.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    told: str  # what the player says early in the evening
    asked: str  # the paraphrased question, 100+ turns later
    key: str  # a word of the fact that a recalled memory must hold (checks the mechanism)


FACTS: tuple[Fact, ...] = (
    Fact("By the way, my sister is called Mira. She sells herbs in the capital.",
         "Do you still remember what my sister's name was?", "Mira"),
    Fact("I was born in Saltmere, the harbor town past the cliffs.",
         "Where did I tell you I grew up?", "Saltmere"),
    Fact("I promise I will bring you three wolf pelts before the first snow.",
         "What was it that I swore to deliver to you?", "pelts"),
    Fact("My horse is a grey mare named Thistle.",
         "What do I call the animal I ride?", "Thistle"),
    Fact("I owe the innkeeper Borin forty silver coins, don't tell him I'm here.",
         "How much money did I say I still have to pay back?", "forty"),
    Fact("My father was a lighthouse keeper on the isle of Vey.",
         "What work did my dad do, do you recall?", "lighthouse"),
    Fact("The key to the old mill is hidden under the blue stone by the well.",
         "Where is the mill's key kept, again?", "blue stone"),
    Fact("I'm terrified of spiders, ever since the caves of Durn.",
         "Which creatures frighten me the most?", "spiders"),
    Fact("My favourite food is smoked eel with rye bread.",
         "What meal do I like best?", "eel"),
    Fact("The priest Aldric asked me to find his stolen silver chalice.",
         "Who sent me looking for a stolen cup?", "Aldric"),
    Fact("I lost two fingers of my left hand to a frost troll.",
         "What happened to my hand, do you remember?", "troll"),
    Fact("My old sword is called Dawnbreaker and it was my grandmother's.",
         "What's the name of the blade I inherited?", "Dawnbreaker"),
    Fact("I agreed to meet the smuggler Kess at midnight on the south pier.",
         "When and where was my meeting with the smuggler?", "midnight"),
    Fact("My birthday is on the ninth day of the harvest month.",
         "On which day was I born?", "ninth"),
    Fact("I keep my savings buried beneath the oak behind the chapel.",
         "Where did I hide my money?", "oak"),
    Fact("I used to be a sailor on a merchant ship called the Gull's Wake.",
         "What was the name of the vessel I worked on?", "Gull"),
    Fact("The witch in the marsh told me my brother Tam is still alive.",
         "What did the marsh woman say about my sibling?", "Tam"),
    Fact("I am allergic to honey, it makes my throat swell.",
         "Is there anything I can't eat?", "honey"),
    Fact("I carry a letter for the Duchess of Orlen that nobody may read.",
         "Who is the sealed message I'm carrying addressed to?", "Orlen"),
    Fact("I once won the archery contest at the spring fair in Highvale.",
         "What competition did I win, and where?", "archery"),
)

_OPENERS = ("Tell me", "I wonder", "Say", "Honestly,", "Between us,", "Hm,", "Listen,", "So")
_TOPICS = (
    ("the weather", "Will it rain on the market tomorrow?"),
    ("the road north", "Is the road north safe for a lone traveller these days?"),
    ("prices", "Why has the price of bread gone up again?"),
    ("the guards", "Are the town guards any good at their job?"),
    ("the festival", "When does the lantern festival start this year?"),
    ("your trade", "How long have you been working at this trade?"),
    ("the mines", "Do the miners still find copper in the eastern hills?"),
    ("the tavern", "Which tavern serves the best ale around here?"),
    ("the river", "Does the river freeze over in deep winter?"),
    ("the old tower", "Who built the ruined tower on the hill?"),
    ("bandits", "Have there been bandits near the crossroads lately?"),
    ("the harvest", "Was the harvest good for the farmers this autumn?"),
    ("boots", "Where can a traveller get good boots mended?"),
    ("the king", "What do people here think of the new king?"),
    ("maps", "Do you sell maps of the southern coast?"),
    ("the forest", "Is it true the forest paths move at night?"),
)


def small_talk(count: int, seed: int = 7) -> list[str]:
    """`count` lines of market-town chatter, none of them about a planted fact."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        topic, question = _TOPICS[rng.randrange(len(_TOPICS))]
        opener = _OPENERS[rng.randrange(len(_OPENERS))]
        lines.append(f"{opener} about {topic}. {question}")
    return lines
