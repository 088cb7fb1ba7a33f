"""What a request may ask of the tokens themselves, checked for every transport alike: a grammar of
its own (GBNF), token log probabilities and logit biases, against what the backend can do."""

from __future__ import annotations

import re

from sidecar.api import pb
from sidecar.backend.contract import RequestLimits
from sidecar.backend.requests import GenerationSpec
from sidecar.errors import FailedPrecondition, InvalidArgument
from sidecar.service.schema_bounds import check_grammar

# A token id written as text (JSON object keys: OpenAI's logit_bias, the bridge's map keys): ASCII
# decimal digits only. int() also takes " 1", "+3", "1_0" and other scripts' digits ("١", "３"),
# none of which is a token id a client meant to send.
_TOKEN_ID = re.compile(r"[0-9]+")
# Token ids travel as int32 (the proto's map key); the vocabulary check comes once the model is known.
MAX_TOKEN_ID = 2**31 - 1

# Candidates one request may ask for: each holds a sequence while it runs.
MAX_CANDIDATES = 16
NO_LOCAL_MODEL = "remote mode forwards generations only"


def caller_grammar(r: pb.GenerateRequest) -> str | None:
    """The request's own GBNF, within the bounds every grammar keeps (schema_bounds); None when it
    has none. llama.cpp parses it when the request starts: a grammar it cannot parse is then
    INVALID_ARGUMENT, before any token."""
    if not r.grammar:
        return None
    if r.json_schema or r.tools:
        raise InvalidArgument("grammar cannot be combined with json_schema or tools: each is a grammar of its own")
    if not r.grammar.strip():
        raise InvalidArgument("grammar is blank")
    return check_grammar(r.grammar, "the request's grammar")


def token_id_key(key: str, field: str = "logit_bias") -> int:
    """The token id a JSON key names; InvalidArgument naming the key when it is not one."""
    if not _TOKEN_ID.fullmatch(key):
        raise InvalidArgument(f"{field} keys are token ids (decimal digits), not {key[:40]!r}: Tokenize (HTTP: POST "
                              "/tokenize) gives a word's ids")
    digits = key.lstrip("0") or "0"
    token = int(digits) if len(digits) <= 10 else MAX_TOKEN_ID + 1  # int() refuses 4300 digits and more
    if token > MAX_TOKEN_ID:
        raise InvalidArgument(f"{field}: token id {key[:40]} is past any vocabulary (at most {MAX_TOKEN_ID})")
    return token


def candidates(r: pb.GenerateRequest) -> int:
    """How many replies the request asks for (n; 0 means 1)."""
    n = r.n or 1
    if n > MAX_CANDIDATES:
        raise InvalidArgument(f"n is {n}; at most {MAX_CANDIDATES} candidates per request")
    if n > 1 and r.session_id:
        raise InvalidArgument("n > 1 asks for candidates, which are one-offs: send it without session_id, then send "
                              "the chosen line as the assistant message of the session's next turn")
    return n


def check_against_backend(spec: GenerationSpec, r: pb.GenerateRequest, limits: RequestLimits) -> None:
    """What only the backend's limits can decide."""
    if r.grammar and not limits.model_calls:
        raise FailedPrecondition(f"{NO_LOCAL_MODEL}: a GBNF grammar is not forwarded (use json_schema)")
    if spec.logprobs is not None and not limits.model_calls:
        raise FailedPrecondition(f"{NO_LOCAL_MODEL}: token log probabilities are not returned")
    if limits.vocabulary is not None:
        bad = next((t for t, _ in spec.sampling.logit_bias if t >= limits.vocabulary), None)
        if bad is not None:
            raise InvalidArgument(f"logit_bias: token id {bad} is not in the model's vocabulary of {limits.vocabulary}")
    ids = spec.prompt.token_ids or ()
    # llama_decode reads an id past the vocabulary out of the embedding table: refused here, named.
    bad_id = next((i for i, t in enumerate(ids) if t < 0 or (limits.vocabulary is not None and t >= limits.vocabulary)), None)
    if bad_id is not None:
        within = f"0 to {limits.vocabulary - 1}" if limits.vocabulary is not None else "0 or more"
        raise InvalidArgument(f"prompt_tokens[{bad_id}] is {ids[bad_id]}: token ids are {within}")
