"""Word vectors for memories: hashed content words and their character trigrams, unit length.

Why words at all, beside the served model's embeddings: a chat model's mean-pooled hidden states
are not trained to retrieve, and a player asking back about a fact nearly always names part of it
(a name, "my sister", "the mill's key"). Measured on the memory benchmark's evening (bench/run.py
memory), which is what decides the mix in embedder.py. Trigrams of each word let "sister's" meet
"sister" and "fingers" meet "finger" without a stemmer per language.

Pure numpy, microseconds a text, no model: it runs on any thread and costs the engine nothing.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

# Dimensions of the hashed space: collisions among a few hundred distinct words of one evening
# are rare at 512 and a memory costs 2 KB of float32.
LEXICAL_DIMS = 512
# A word counts this much against its trigrams together: a shared whole word is the strong signal.
WORD_WEIGHT = 1.0
TRIGRAM_WEIGHT = 0.35

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

# Words that say nothing about what a memory is about (English; other languages pass through and
# only lose a little precision).
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you
your yours yourself yourselves tell told say said remember recall again still ask asked did do don
t s ll ve re d m o know think thing things one once also yes yeah oh well hm hmm please
""".split())


def words(text: str) -> list[str]:
    """The content words of `text`, lowercased."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 1]


def _slot(feature: str) -> tuple[int, float]:
    h = zlib.crc32(feature.encode("utf-8"))
    return h % LEXICAL_DIMS, (1.0 if (h >> 16) & 1 else -1.0)


def lexical_vector(text: str) -> np.ndarray:
    """A unit vector (float32, LEXICAL_DIMS) of `text`'s content words; zeros when it has none."""
    vector = np.zeros(LEXICAL_DIMS, dtype=np.float32)
    for word in set(words(text)):
        index, sign = _slot("w:" + word)
        vector[index] += sign * WORD_WEIGHT
        padded = f"<{word}>"
        grams = {padded[i:i + 3] for i in range(len(padded) - 2)}
        share = TRIGRAM_WEIGHT / max(1, len(grams)) ** 0.5
        for gram in grams:
            index, sign = _slot("g:" + gram)
            vector[index] += sign * share
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
