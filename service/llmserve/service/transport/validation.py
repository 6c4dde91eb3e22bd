"""Request validation for gRPC: proto messages → the shared rules (domain/request_rules.py)
→ domain values, or InvalidArgument naming the field as the proto spells it.

Nothing that could crash llama.cpp gets past here: token ids are checked against
the vocabulary, sizes against the slot context and the ubatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmserve.v1 import llmserve_pb2 as pb

from ..domain import request_rules as rules
from ..domain.model_meta import Limits
from ..domain.request_rules import MAX_REQUEST_ID_LENGTH as MAX_REQUEST_ID_LENGTH
from ..domain.requests import SessionParams
from ..domain.schema_checks import check_constraint

MAX_EMBED_INPUTS_PER_MESSAGE = 1024

NAMES = rules.FieldNames(
    session=rules.prefixed("config."),
    sampling=rules.prefixed("config.sampling."),
    stopping=rules.prefixed("config.stopping."),
    output=rules.prefixed("config.output."),
)


def _set_fields(msg: Any) -> dict[str, Any]:
    """The fields the message sets, by name (repeated and map fields as Python values)."""
    values: dict[str, Any] = {}
    for descriptor, value in msg.ListFields():
        if descriptor.name == "dry_sequence_breakers":
            value = tuple(value.values)
        elif descriptor.name == "logit_bias":
            value = dict(value)
        elif not isinstance(value, (str, bytes, int, float)):  # a repeated field
            value = tuple(value)
        values[descriptor.name] = value
    return values


def constraint_of(msg: pb.Constraint) -> tuple[str, str] | None:
    """The constraint's kind (grammar, json_schema, regex, choice, json_object) and text,
    within the size limits; with `strict`, a schema the converter enforces in full
    (domain/schema_strict.py). The engine compiles it (in the grammar worker, with a time
    and memory budget)."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "choice":
        text = rules.choice_text(msg.choice.values)
    elif kind == "json_object":
        text = ""
    else:
        text = getattr(msg, kind)
    check_constraint(kind, text, f"config.constraint.{kind}", msg.strict)  # strict: refuse what the converter drops
    return kind, text


def session_params(
    msg: pb.SessionConfig, limits: Limits, request_id: str, grammar: str = ""
) -> SessionParams:
    """`grammar`: the compiled GBNF of `msg.constraint` (see `constraint_of`)."""
    return rules.session_params(
        request_id, limits, NAMES, _set_fields(msg.sampling), _set_fields(msg.stopping), _set_fields(msg.output),
        num_samples=msg.n if msg.HasField("n") else None, session_id=msg.session_id, priority=msg.priority,
        grammar=grammar,
    )


def token_ids(ids: Sequence[int], n_vocab: int, field: str) -> tuple[int, ...]:
    """Token ids outside the vocabulary would crash llama.cpp: refuse them here."""
    return rules.token_ids(ids, n_vocab, field)
