"""A reply that runs to max_tokens by mechanism, not by prediction: ban the end-of-generation tokens.

A small model may end any reply at any token (and where it does differs by CPU, as kernels round
otherwise), so a test that needs the whole length (completion_tokens == max_tokens, finish
reason LENGTH, "at least N chunks", a stream still running when something happens to it, any
reply at all) bans the model's end-of-generation (EOG) tokens with logit_bias -100, on whichever
way in it uses. The ids are the model's own, found by tokenizing the EOG texts with special
tokens parsed: a text that does not come back as one token is not a special token of that model
and is skipped. SmolLM2's EOG tokens (llama_vocab_is_eog) are <|endoftext|> 0, <|im_end|> 2 and
<reponame> 4 (llama.cpp counts a fill-in-the-middle repository marker as an end too); the tiny
generated test models have <|endoftext|> and <|im_end|>. test_no_early_stop.py checks that the
lookup finds exactly llama.cpp's EOG set for each.

    ids = grpc_eog_ids(client)   # or http_eog_ids(base, token), engine_eog_ids(engine),
                                 # file_eog_ids(path), default_eog_ids() (the default model's)
    pb.SamplingParams(temperature=0, logit_bias=grpc_bias(ids))
    client.chat.completions.create(..., logit_bias=http_bias(ids))
    SamplingConfig(temperature=0, logit_bias=engine_bias(ids))

A greedy reply made so is scored against the CPU reference with the same ban
(greedy_agreement.assert_greedy_agrees(..., banned=ids)).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.api import pb

# The end-of-generation texts of the models the tests serve (SmolLM2 and its MoE copy, the tiny
# generated models). Only those a model tokenizes to a single token count for it.
EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<reponame>")
BAN = -100.0  # a true ban: the daemon makes it -inf in llama.cpp's logit-bias sampler (OpenAI: "a ban")


def eog_ids(tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    """The EOG token ids of a model, given its tokenize(text) with special tokens parsed."""
    ids = set()
    for text in EOG_TEXTS:
        tokens = list(tokenize(text))
        if len(tokens) == 1:
            ids.add(int(tokens[0]))
    assert ids, f"none of {EOG_TEXTS} is a single token of this model: nothing to ban"
    return tuple(sorted(ids))


def grpc_eog_ids(client) -> tuple[int, ...]:
    """Over gRPC: SidecarClient.tokenize, on the model that daemon serves."""
    return eog_ids(lambda text: client.tokenize(text, parse_special=True))


def http_eog_ids(base: str, token: str | None = None) -> tuple[int, ...]:
    """Over HTTP: POST /tokenize (llama-server's shape) at `base` (http://host:port)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def tokenize(text: str) -> list[int]:
        r = httpx.post(base + "/tokenize", json={"content": text, "parse_special": True}, headers=headers, timeout=60)
        r.raise_for_status()
        return r.json()["tokens"]

    return eog_ids(tokenize)


def engine_eog_ids(engine) -> tuple[int, ...]:
    """In process: on the engine thread, between passes (Engine.call_model)."""
    return eog_ids(lambda text: engine.call_model(lambda m: m.tokenize(text, False, True)).result(60))


@functools.cache
def file_eog_ids(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """From a model file itself (its vocabulary alone is read: milliseconds): for a module's
    constant requests, or a daemon started on a test model, before any daemon is asked."""
    vocab = Vocabulary(Path(path))
    try:
        return eog_ids(vocab.tokenize)
    finally:
        vocab.close()


def default_eog_ids() -> tuple[int, ...]:
    """Those of the default model (SmolLM2): the suite's Q4_0 copy of it (suite_model.py), which
    every test daemon started without --model serves, has the same vocabulary."""
    from sidecar.model_info.default_model import default_model_path

    return file_eog_ids(str(default_model_path()))


class Vocabulary:
    """A model file's vocabulary alone (vocab_only: no weights read), through llama_cpp."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"could not read the vocabulary of {path}"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens, special tokens parsed, no BOS."""
        import llama_cpp

        data = text.encode()
        out = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, len(out), False, True)
        assert n >= 0, f"could not tokenize {text!r}"
        return list(out[:n])

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_model_free(self.model)


def vocab_eog_ids(vocab) -> tuple[int, ...]:
    """Exactly llama.cpp's EOG set of a loaded vocabulary (a llama_vocab pointer): for a test that
    already holds the model through llama_cpp."""
    import llama_cpp

    return tuple(t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, t))


def grpc_bias(ids: Iterable[int]) -> dict[int, float]:
    """pb.SamplingParams.logit_bias (map<int32, float>); llama_cpp.Llama's logit_bias too."""
    return {t: BAN for t in ids}


def http_bias(ids: Iterable[int]) -> dict[str, float]:
    """OpenAI's logit_bias: token id as a string -> bias. Also the WebSocket bridge's logitBias."""
    return {str(t): BAN for t in ids}


def engine_bias(ids: Iterable[int]) -> tuple[tuple[int, float], ...]:
    """SamplingConfig.logit_bias."""
    return tuple((t, BAN) for t in sorted(ids))


def grpc_sampling(ids: Iterable[int], **fields) -> pb.SamplingParams:
    """pb.SamplingParams(**fields) with the EOG tokens banned."""
    from sidecar.api import pb  # noqa: F811 (at run time; the module's import is for the annotation)

    return pb.SamplingParams(logit_bias=grpc_bias(ids), **fields)


def grpc_banned(request, ids: Iterable[int]):
    """A copy of a pb.GenerateRequest (or AskImageRequest) whose sampling bans the EOG tokens,
    its other sampling fields as they were."""
    copy = type(request).FromString(request.SerializeToString())
    copy.sampling.logit_bias.update(grpc_bias(ids))
    return copy


def engine_sampling(base, ids: Iterable[int]):
    """A SamplingConfig as `base`, with the EOG tokens banned (besides any bias it had)."""
    merged = dict(base.logit_bias)
    merged.update(engine_bias(ids))
    return dataclasses.replace(base, logit_bias=tuple(sorted(merged.items())))
