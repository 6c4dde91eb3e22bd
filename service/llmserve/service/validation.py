"""Request validation: proto messages → domain values, or InvalidArgument naming the field.

Nothing that could crash llama.cpp gets past here: token ids are checked against
the vocabulary, sizes against the slot context and the ubatch.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from llmserve.v1 import llmserve_pb2 as pb

from .domain import SamplingParams, SessionParams, StoppingParams
from .errors import InvalidArgument

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128
MAX_EMBED_INPUTS_PER_MESSAGE = 1024


@dataclass(frozen=True)
class Limits:
    n_vocab: int
    n_ctx_per_slot: int
    n_ubatch: int


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} must be a finite number, got {value}", field=field)
    return value


def _in_range(value: float, field: str, low: float, high: float, *, low_open: bool = False) -> float:
    _finite(value, field)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidArgument(f"{field} must be in {bracket}{low}, {high}], got {value}", field=field)
    return value


def sampling_params(msg: pb.SamplingParams, limits: Limits) -> SamplingParams:
    d = SamplingParams()
    prefix = "config.sampling."
    has = msg.HasField
    temperature = _in_range(msg.temperature, prefix + "temperature", 0.0, 100.0) if has("temperature") else d.temperature
    top_k = msg.top_k if has("top_k") else d.top_k
    if top_k < 0 or top_k > limits.n_vocab:
        raise InvalidArgument(f"top_k must be in [0, {limits.n_vocab}], got {top_k}", field=prefix + "top_k")
    repeat_last_n = msg.repeat_last_n if has("repeat_last_n") else d.repeat_last_n
    if repeat_last_n < -1:
        raise InvalidArgument("repeat_last_n must be >= -1", field=prefix + "repeat_last_n")
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=_in_range(msg.top_p, prefix + "top_p", 0.0, 1.0, low_open=True) if has("top_p") else d.top_p,
        min_p=_in_range(msg.min_p, prefix + "min_p", 0.0, 1.0) if has("min_p") else d.min_p,
        seed=msg.seed if has("seed") else secrets.randbits(32),
        repeat_penalty=(
            _in_range(msg.repeat_penalty, prefix + "repeat_penalty", 0.0, 10.0, low_open=True)
            if has("repeat_penalty")
            else d.repeat_penalty
        ),
        presence_penalty=(
            _in_range(msg.presence_penalty, prefix + "presence_penalty", -2.0, 2.0)
            if has("presence_penalty")
            else d.presence_penalty
        ),
        frequency_penalty=(
            _in_range(msg.frequency_penalty, prefix + "frequency_penalty", -2.0, 2.0)
            if has("frequency_penalty")
            else d.frequency_penalty
        ),
        repeat_last_n=limits.n_ctx_per_slot if repeat_last_n == -1 else repeat_last_n,
    )


def stopping_params(msg: pb.StoppingCriteria, limits: Limits) -> StoppingParams:
    max_tokens = None
    if msg.HasField("max_tokens"):
        max_tokens = msg.max_tokens
        if max_tokens < 1 or max_tokens > limits.n_ctx_per_slot:
            raise InvalidArgument(
                f"max_tokens must be in [1, {limits.n_ctx_per_slot}] (the per-slot context), got {max_tokens}",
                field="config.stopping.max_tokens",
            )
    if len(msg.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"at most {MAX_STOP_STRINGS} stop strings", field="config.stopping.stop")
    for i, stop in enumerate(msg.stop):
        if not stop or len(stop) > MAX_STOP_LENGTH:
            raise InvalidArgument(
                f"stop strings must have 1 to {MAX_STOP_LENGTH} characters", field=f"config.stopping.stop[{i}]"
            )
    return StoppingParams(max_tokens=max_tokens, stop=tuple(msg.stop), ignore_eos=msg.ignore_eos)


def session_params(msg: pb.SessionConfig, limits: Limits, request_id: str) -> SessionParams:
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(
            f"request_id is limited to {MAX_REQUEST_ID_LENGTH} characters", field="config.request_id"
        )
    return SessionParams(
        request_id=request_id,
        sampling=sampling_params(msg.sampling, limits),
        stopping=stopping_params(msg.stopping, limits),
        priority=msg.priority,
    )


def token_ids(ids: Sequence[int], limits: Limits, field: str) -> tuple[int, ...]:
    """Token ids outside the vocabulary would crash llama.cpp: refuse them here."""
    for i, token in enumerate(ids):
        if token < 0 or token >= limits.n_vocab:
            raise InvalidArgument(
                f"token id {token} at position {i} is outside the vocabulary [0, {limits.n_vocab})",
                field=field,
            )
    return tuple(ids)
