"""A tiny byte-level GPT-2 style vocabulary with ChatML control tokens.

Every byte has a token, so any text tokenizes; a handful of merges exist because llama.cpp's
BPE loader refuses a gpt2 vocabulary without merges. The chat template is ChatML and accepts
both plain-string content and OpenAI content-part lists (which is what llama-cpp-python's
multimodal chat handler passes), so the same tiny model serves text and vision tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gguf import GGUFWriter, TokenType

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Pairs merged in this order (lower index = higher priority). Chosen from frequent English
# pairs so that tokenizing ordinary text exercises the merge path, not only single bytes.
_MERGE_PAIRS = (
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("o", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("o", "u"),
)

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def _byte_symbols() -> list[str]:
    """The printable character GPT-2's byte-level BPE uses for each byte value 0..255.

    Bytes that are printable and not whitespace stand for themselves; the rest are shifted to
    code points from 256 up, in byte order. llama.cpp applies the same mapping before lookup,
    so these strings are what the token list must contain.
    """
    printable = (
        set(range(ord("!"), ord("~") + 1))
        | set(range(ord("¡"), ord("¬") + 1))
        | set(range(ord("®"), ord("ÿ") + 1))
    )
    symbols = []
    shifted = 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


@dataclass(frozen=True)
class ByteVocab:
    """Token strings, their types and the merge list, in id order."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def token_id(self, token: str) -> int:
        return self.tokens.index(token)


@cache
def byte_vocab() -> ByteVocab:
    """The vocabulary: 256 byte tokens, one token per merge result, then the control tokens."""
    tokens = _byte_symbols()
    types = [int(TokenType.NORMAL)] * len(tokens)
    for left, right in _MERGE_PAIRS:
        tokens.append(left + right)
        types.append(int(TokenType.NORMAL))
    for control in CONTROL_TOKENS:
        tokens.append(control)
        types.append(int(TokenType.CONTROL))
    merges = tuple(f"{left} {right}" for left, right in _MERGE_PAIRS)
    return ByteVocab(tuple(tokens), tuple(types), merges)


def add_byte_vocab(writer: GGUFWriter) -> ByteVocab:
    """Write the tokenizer metadata (gpt2 model, tokens, merges, special ids, chat template).

    BOS is <|endoftext|> and is not added automatically; EOS is <|im_end|>, so chat generation
    ends at the end of the assistant turn. Setting both ids matters: without them llama.cpp's BPE
    loader falls back to id 11, which here is an ordinary byte.
    """
    vocab = byte_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.token_id(ENDOFTEXT))
    writer.add_eos_token_id(vocab.token_id(IM_END))
    writer.add_pad_token_id(vocab.token_id(ENDOFTEXT))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    return vocab
