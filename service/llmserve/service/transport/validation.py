"""Request validation: proto messages → domain values, or InvalidArgument naming the field.

Nothing that could crash llama.cpp gets past here: token ids are checked against
the vocabulary, sizes against the slot context and the ubatch.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.model_meta import Limits
from ..domain.requests import OutputParams, SamplingParams, SessionParams, StoppingParams
from ..engine.engine import MAX_TOP_LOGPROBS
from .errors import InvalidArgument

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128
MAX_EMBED_INPUTS_PER_MESSAGE = 1024


MAX_SAMPLES = 8
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama_sampler_init_dist: a random seed
MAX_LOGIT_BIASES = 1024
MAX_DRY_BREAKERS = 16
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_SCHEMA_REPETITIONS = 1000
MAX_SCHEMA_DEPTH = 64

# Float sampling fields: (low, high, low excluded). Ranges follow llama-server's meaning.
_FLOAT_RANGES = {
    "temperature": (0.0, 100.0, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "repeat_penalty": (0.0, 10.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "dynatemp_range": (0.0, 100.0, False),
    "dynatemp_exponent": (0.0, 100.0, False),
    "typical_p": (0.0, 1.0, True),
    "top_n_sigma": (0.0, 100.0, True),
    "xtc_probability": (0.0, 1.0, False),
    "xtc_threshold": (0.0, 0.5, False),
    "dry_multiplier": (0.0, 100.0, False),
    "dry_base": (1.0, 100.0, False),
    "mirostat_tau": (0.0, 100.0, False),
    "mirostat_eta": (0.0, 1.0, True),
}


def _check_float(value: float, field: str, low: float, high: float, low_open: bool = False) -> float:
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} must be a finite number, got {value}", field=field)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidArgument(f"{field} must be in {bracket}{low}, {high}], got {value}", field=field)
    return value


def _check_int(value: int, field: str, low: int, high: int) -> int:
    if value < low or value > high:
        raise InvalidArgument(f"{field} must be in [{low}, {high}], got {value}", field=field)
    return value


def sampling_params(msg: pb.SamplingParams, limits: Limits, grammar: str = "") -> SamplingParams:
    prefix = "config.sampling."
    values: dict[str, object] = {}
    for name, (low, high, low_open) in _FLOAT_RANGES.items():
        if msg.HasField(name):
            values[name] = _check_float(getattr(msg, name), prefix + name, low, high, low_open)
    ctx = limits.n_ctx_per_slot
    ints = {"top_k": (0, limits.n_vocab), "repeat_last_n": (-1, ctx), "dry_allowed_length": (0, ctx),
            "dry_penalty_last_n": (-1, ctx), "mirostat": (0, 2)}
    for name, (low, high) in ints.items():
        if msg.HasField(name):
            values[name] = _check_int(getattr(msg, name), prefix + name, low, high)
    if values.get("repeat_last_n") == -1:
        values["repeat_last_n"] = ctx
    if msg.HasField("dry_sequence_breakers"):
        breakers = tuple(msg.dry_sequence_breakers.values)
        if len(breakers) > MAX_DRY_BREAKERS or any(not b or len(b) > 64 for b in breakers):
            raise InvalidArgument(
                f"at most {MAX_DRY_BREAKERS} sequence breakers of 1 to 64 characters",
                field=prefix + "dry_sequence_breakers",
            )
        values["dry_sequence_breakers"] = breakers
    if len(msg.logit_bias) > MAX_LOGIT_BIASES:
        raise InvalidArgument(f"at most {MAX_LOGIT_BIASES} logit biases", field=prefix + "logit_bias")
    biases = []
    for token, bias in sorted(msg.logit_bias.items()):
        field = f"{prefix}logit_bias[{token}]"
        token_ids([token], limits.n_vocab, field)
        if math.isnan(bias) or bias == math.inf:
            raise InvalidArgument(f"a logit bias must be a number or -inf, got {bias}", field=field)
        biases.append((token, bias))
    values["logit_bias"] = tuple(biases)
    if msg.HasField("seed") and msg.seed == LLAMA_DEFAULT_SEED:
        raise InvalidArgument(
            f"seed {LLAMA_DEFAULT_SEED} is llama.cpp's 'random seed' value; leave seed unset for a random one",
            field=prefix + "seed",
        )
    values["seed"] = msg.seed if msg.HasField("seed") else secrets.randbelow(LLAMA_DEFAULT_SEED)
    values["grammar"] = grammar
    return SamplingParams(**values)  # type: ignore[arg-type]


def stopping_params(msg: pb.StoppingCriteria, limits: Limits) -> StoppingParams:
    max_tokens = None
    if msg.HasField("max_tokens"):
        max_tokens = msg.max_tokens
        if max_tokens < 1 or max_tokens > limits.max_tokens:
            raise InvalidArgument(
                f"max_tokens must be in [1, {limits.max_tokens}] (the per-slot context), got {max_tokens}",
                field="config.stopping.max_tokens",
            )
    min_tokens = _check_int(msg.min_tokens, "config.stopping.min_tokens", 0, max_tokens or limits.max_tokens)
    if len(msg.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"at most {MAX_STOP_STRINGS} stop strings", field="config.stopping.stop")
    for i, stop in enumerate(msg.stop):
        if not stop or len(stop) > MAX_STOP_LENGTH:
            raise InvalidArgument(
                f"stop strings must have 1 to {MAX_STOP_LENGTH} characters", field=f"config.stopping.stop[{i}]"
            )
    if len(msg.stop_token_ids) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"at most {MAX_STOP_STRINGS} stop token ids", field="config.stopping.stop_token_ids")
    stop_ids = token_ids(msg.stop_token_ids, limits.n_vocab, "config.stopping.stop_token_ids")
    return StoppingParams(
        max_tokens=max_tokens, min_tokens=min_tokens, stop=tuple(msg.stop), stop_token_ids=stop_ids,
        ignore_eos=msg.ignore_eos,
    )


def output_params(msg: pb.OutputOptions) -> OutputParams:
    top = None
    if msg.HasField("top_logprobs"):
        top = _check_int(msg.top_logprobs, "config.output.top_logprobs", 0, MAX_TOP_LOGPROBS)
    return OutputParams(top_logprobs=top, prompt_logprobs=msg.prompt_logprobs, include_special=msg.include_special)


def constraint_of(msg: pb.Constraint) -> tuple[str, str] | None:
    """The constraint's kind ("grammar" or "json_schema") and text, within the size limits.
    The engine compiles it (in the grammar worker, with a time and memory budget)."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None
    text = getattr(msg, kind)
    field = f"config.constraint.{kind}"
    if not text or len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise InvalidArgument(f"{kind} must have 1 to {MAX_GRAMMAR_BYTES} bytes", field=field)
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise InvalidArgument(f"the JSON schema is not JSON: {exc}", field=field) from None
        _check_schema_bounds(schema, field, "")
    return kind, text


_REPEAT_KEYS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
                "maxContains")
_PATTERN_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def _check_schema_bounds(node: object, field: str, path: str, depth: int = 0) -> None:
    """Repetition counts and nesting the grammar compiler could not build: refused by name."""
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidArgument(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels at {path or '/'}", field=field)
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_schema_bounds(item, field, f"{path}/{i}", depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        where = f"{path}/{key}"
        if key in _REPEAT_KEYS and isinstance(value, (int, float)) and value > MAX_SCHEMA_REPETITIONS:
            raise InvalidArgument(
                f"{where} is {value}; a JSON schema's repetition counts are limited to {MAX_SCHEMA_REPETITIONS}",
                field=field,
            )
        if key == "pattern" and isinstance(value, str):
            for match in _PATTERN_REPEAT.finditer(value):
                count = max(int(match.group(1)), int(match.group(2) or 0))
                if count > MAX_SCHEMA_REPETITIONS:
                    raise InvalidArgument(
                        f"{where} repeats {count} times; a pattern's repetition counts are limited to "
                        f"{MAX_SCHEMA_REPETITIONS}",
                        field=field,
                    )
        _check_schema_bounds(value, field, where, depth + 1)


def session_params(
    msg: pb.SessionConfig, limits: Limits, request_id: str, max_samples: int = MAX_SAMPLES, grammar: str = ""
) -> SessionParams:
    """`grammar`: the compiled GBNF of `msg.constraint` (see `constraint_of`)."""
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(
            f"request_id is limited to {MAX_REQUEST_ID_LENGTH} characters", field="config.request_id"
        )
    num_samples = _check_int(msg.n, "config.n", 1, max_samples) if msg.HasField("n") else 1
    if len(msg.session_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(f"session_id is limited to {MAX_REQUEST_ID_LENGTH} characters", field="config.session_id")
    if msg.session_id and num_samples > 1:
        raise InvalidArgument("a named session takes one sample per turn (n = 1)", field="config.n")
    return SessionParams(
        request_id=request_id,
        sampling=sampling_params(msg.sampling, limits, grammar),
        stopping=stopping_params(msg.stopping, limits),
        output=output_params(msg.output),
        priority=msg.priority,
        num_samples=num_samples,
        session_id=msg.session_id,
    )


def token_ids(ids: Sequence[int], n_vocab: int, field: str) -> tuple[int, ...]:
    """Token ids outside the vocabulary would crash llama.cpp: refuse them here."""
    for i, token in enumerate(ids):
        if token < 0 or token >= n_vocab:
            raise InvalidArgument(
                f"token id {token} at position {i} is outside the vocabulary [0, {n_vocab})",
                field=field,
            )
    return tuple(ids)
