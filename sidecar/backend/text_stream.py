"""Turn a stream of token pieces (bytes) into text chunks a client can show as they come.

Two things make this more than `bytes.decode`:
- A token may end in the middle of a UTF-8 character (emoji, CJK, accented letters in byte-level
  vocabularies). Its bytes are held until the character is complete, so every chunk is valid UTF-8.
- Stop strings may span tokens. Text that could still turn out to be the start of a stop string is
  held back until it either completes the stop string (then generation ends, and the stop string is
  not sent) or cannot any more (then it is sent).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


@dataclass
class TextChunk:
    """Text ready to send and the tokens it came from."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)


class TextStream:
    """Accumulates token pieces; `push` returns what can be sent now. Not thread-safe: one per request."""

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held_text = ""
        self._held_tokens: list[int] = []
        self.stopped = False

    def push(self, token_id: int, piece: bytes) -> TextChunk:
        """Add one token's bytes. Sets `stopped` when a stop string completes."""
        self._held_tokens.append(token_id)
        self._held_text += self._decoder.decode(piece)
        return self._release(final=False)

    def finish(self) -> TextChunk:
        """Flush everything held back (an incomplete character becomes U+FFFD)."""
        self._held_text += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> TextChunk:
        text = self._held_text
        for stop in self._stop:
            at = text.find(stop)
            if at >= 0:
                self.stopped = True
                self._held_text = ""
                return self._take(text[:at])
        keep = 0 if final else self._longest_stop_prefix_suffix(text)
        self._held_text = text[len(text) - keep :] if keep else ""
        return self._take(text[: len(text) - keep])

    def _take(self, text: str) -> TextChunk:
        # Tokens travel with the text they produced; a token that produced nothing at all (nothing
        # held back, no partial character) is flushed on its own so no token id is lost.
        if text or self.stopped or (not self._held_text and self._decoder_idle()):
            return self._flush_tokens(text)
        return TextChunk()

    def _flush_tokens(self, text: str) -> TextChunk:
        tokens, self._held_tokens = self._held_tokens, []
        return TextChunk(text=text, token_ids=tokens)

    def _decoder_idle(self) -> bool:
        # getstate() returns the undecoded byte buffer first; empty means no partial character.
        return self._decoder.getstate()[0] == b""

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
