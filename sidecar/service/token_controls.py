"""What a request may ask of the tokens themselves, checked for every transport alike: a grammar of
its own (GBNF), token log probabilities and logit biases, against what the backend can do."""

from __future__ import annotations

from sidecar.api import pb
from sidecar.backend.contract import RequestLimits
from sidecar.backend.requests import GenerationSpec
from sidecar.errors import FailedPrecondition, InvalidArgument
from sidecar.service.schema_bounds import check_grammar

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
