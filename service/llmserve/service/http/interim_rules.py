"""INTERIM — delete when the shared request rules land (domain/request_rules.py, being
written by the lead): the gRPC surface's range rules (transport/validation.py), for the
fields this wing serves, over plain mappings of our field names. Same ranges, same
messages; `InvalidRequest.field` is our (= OpenAI's) name.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from typing import Any

from ..domain.errors import InvalidRequest
from ..domain.model_meta import Limits
from ..domain.requests import OutputParams, SamplingParams, SessionParams, StoppingParams

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128
MAX_LOGIT_BIASES = 1024
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
FLOAT_RANGES = {  # (low, high, low excluded), as transport/validation.py
    "temperature": (0.0, 100.0, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "repeat_penalty": (0.0, 10.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "typical_p": (0.0, 1.0, True),
}


def _check_int(value: int, field: str, low: int, high: int) -> int:
    if value < low or value > high:
        raise InvalidRequest(f"{field} must be in [{low}, {high}], got {value}", field=field)
    return value


def session_params(request_id: str, limits: Limits, sampling: Mapping[str, Any], stopping: Mapping[str, Any],
                   output: Mapping[str, Any], n: int | None, max_samples: int) -> SessionParams:
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidRequest(f"the request id is limited to {MAX_REQUEST_ID_LENGTH} characters", field="x-request-id")
    values: dict[str, Any] = {}
    for name, (low, high, low_open) in FLOAT_RANGES.items():
        if name in sampling:
            value = sampling[name]
            if value < low or value > high or (low_open and value == low):
                raise InvalidRequest(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}",
                                     field=name)
            values[name] = value
    if "top_k" in sampling:
        values["top_k"] = _check_int(sampling["top_k"], "top_k", 0, limits.n_vocab)
    biases = sampling.get("logit_bias", {})
    if len(biases) > MAX_LOGIT_BIASES:
        raise InvalidRequest(f"at most {MAX_LOGIT_BIASES} logit biases", field="logit_bias")
    for token, bias in biases.items():
        if token < 0 or token >= limits.n_vocab or math.isnan(bias):
            raise InvalidRequest(f"token id {token} is outside the vocabulary [0, {limits.n_vocab})",
                                 field=f"logit_bias[{token}]")
    values["logit_bias"] = tuple(sorted(biases.items()))
    if sampling.get("seed") == LLAMA_DEFAULT_SEED:
        raise InvalidRequest(f"seed {LLAMA_DEFAULT_SEED} is llama.cpp's 'random seed' value; leave seed unset",
                             field="seed")
    values["seed"] = sampling["seed"] if "seed" in sampling else secrets.randbelow(LLAMA_DEFAULT_SEED)
    max_tokens = stopping.get("max_tokens")
    if max_tokens is not None:
        _check_int(max_tokens, "max_tokens", 1, limits.max_tokens)
    min_tokens = _check_int(stopping.get("min_tokens", 0), "min_tokens", 0, max_tokens or limits.max_tokens)
    stop = tuple(stopping.get("stop", ()))
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings", field="stop")
    for i, text in enumerate(stop):
        if not text or len(text) > MAX_STOP_LENGTH:
            raise InvalidRequest(f"stop strings must have 1 to {MAX_STOP_LENGTH} characters", field=f"stop[{i}]")
    top = output.get("top_logprobs")
    if top is not None:
        _check_int(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    return SessionParams(
        request_id=request_id,
        sampling=SamplingParams(**values),
        stopping=StoppingParams(max_tokens=max_tokens, min_tokens=min_tokens, stop=stop,
                                ignore_eos=bool(stopping.get("ignore_eos", False))),
        output=OutputParams(top_logprobs=top),
        num_samples=_check_int(n, "n", 1, max_samples) if n is not None else 1,
    )
