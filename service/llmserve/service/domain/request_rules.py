"""The rules a request's parameters keep, for every surface (gRPC and OpenAI HTTP alike).

Each surface turns its message into plain mappings of our field names, holding only the
fields the request set, and gets domain values back, or `InvalidRequest` naming the
field as that surface spells it (a `FieldName` maps our name to theirs). Nothing that
could crash llama.cpp gets past here: token ids are checked against the vocabulary,
sizes against the slot context, a schema's repetition counts against what the grammar
compiler can build.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest, PreconditionFailed
from .model_meta import Limits
from .requests import OutputParams, SamplingParams, SessionParams, StoppingParams

FieldName = Callable[[str], str]  # our field name -> the surface's, for error messages

MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128
SERVER_SESSION_PREFIX = "stored-turn:"  # the session ids the server names itself (engine/stored_kv.py)
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama_sampler_init_dist: a random seed
MAX_LOGIT_BIASES = 1024
MAX_DRY_BREAKERS = 16
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_SCHEMA_REPETITIONS = 1000
MAX_SCHEMA_DEPTH = 64
MAX_CHOICES = 256
MAX_CHOICE_LENGTH = 1024


def choice_text(options: Sequence[str]) -> str:
    """A choice constraint's options as the text `Engine.compile_async` takes."""
    return json.dumps(list(options))

# Float sampling fields: (low, high, low excluded). Ranges follow llama-server's meaning.
FLOAT_RANGES = {
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
INT_FIELDS = ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat")


def prefixed(prefix: str) -> FieldName:
    """Field names as `prefix` + ours (a surface whose fields sit in groups)."""
    return lambda name: prefix + name


def check_float(value: float, field: str, low: float, high: float, low_open: bool = False) -> float:
    if not math.isfinite(value):
        raise InvalidRequest(f"{field} must be a finite number, got {value}", field=field)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidRequest(f"{field} must be in {bracket}{low}, {high}], got {value}", field=field)
    return value


def check_int(value: int, field: str, low: int, high: int) -> int:
    if value < low or value > high:
        raise InvalidRequest(f"{field} must be in [{low}, {high}], got {value}", field=field)
    return value


def token_ids(ids: Sequence[int], n_vocab: int, field: str) -> tuple[int, ...]:
    """Token ids outside the vocabulary would crash llama.cpp: refuse them here."""
    for i, token in enumerate(ids):
        if token < 0 or token >= n_vocab:
            raise InvalidRequest(f"token id {token} at position {i} is outside the vocabulary [0, {n_vocab})",
                                 field=field)
    return tuple(ids)


def sampling_params(values: Mapping[str, Any], limits: Limits, name: FieldName, grammar: str = "") -> SamplingParams:
    """`values`: the set fields among FLOAT_RANGES, INT_FIELDS, `dry_sequence_breakers`
    (strings), `logit_bias` (token id -> bias) and `seed`; `grammar`: the compiled GBNF."""
    out: dict[str, object] = {}
    for field, (low, high, low_open) in FLOAT_RANGES.items():
        if field in values:
            out[field] = check_float(values[field], name(field), low, high, low_open)
    ctx = limits.n_ctx_per_slot
    ints = {"top_k": (0, limits.n_vocab), "repeat_last_n": (-1, ctx), "dry_allowed_length": (0, ctx),
            "dry_penalty_last_n": (-1, ctx), "mirostat": (0, 2)}
    for field, (low, high) in ints.items():
        if field in values:
            out[field] = check_int(values[field], name(field), low, high)
    if out.get("repeat_last_n") == -1:
        out["repeat_last_n"] = ctx
    if "dry_sequence_breakers" in values:
        breakers = tuple(values["dry_sequence_breakers"])
        if len(breakers) > MAX_DRY_BREAKERS or any(not b or len(b) > 64 for b in breakers):
            raise InvalidRequest(f"at most {MAX_DRY_BREAKERS} sequence breakers of 1 to 64 characters",
                                 field=name("dry_sequence_breakers"))
        out["dry_sequence_breakers"] = breakers
    out["logit_bias"] = _logit_bias(values.get("logit_bias", {}), limits, name)
    if "seed" in values and values["seed"] == LLAMA_DEFAULT_SEED:
        raise InvalidRequest(
            f"seed {LLAMA_DEFAULT_SEED} is llama.cpp's 'random seed' value; leave seed unset for a random one",
            field=name("seed"),
        )
    out["seed"] = values["seed"] if "seed" in values else secrets.randbelow(LLAMA_DEFAULT_SEED)
    out["grammar"] = grammar
    out["deterministic"] = bool(values.get("deterministic", limits.deterministic))
    if out["deterministic"] and not limits.kv_per_slot:
        raise PreconditionFailed("deterministic sessions need one KV stream per slot; this server runs --kv-unified",
                                 field=name("deterministic"))
    return SamplingParams(**out)  # type: ignore[arg-type]


def _logit_bias(biases: Mapping[int, float], limits: Limits, name: FieldName) -> tuple[tuple[int, float], ...]:
    if len(biases) > MAX_LOGIT_BIASES:
        raise InvalidRequest(f"at most {MAX_LOGIT_BIASES} logit biases", field=name("logit_bias"))
    checked = []
    for token, bias in sorted(biases.items()):
        field = f"{name('logit_bias')}[{token}]"
        token_ids([token], limits.n_vocab, field)
        if math.isnan(bias) or bias == math.inf:
            raise InvalidRequest(f"a logit bias must be a number or -inf, got {bias}", field=field)
        checked.append((token, bias))
    return tuple(checked)


def stopping_params(values: Mapping[str, Any], limits: Limits, name: FieldName) -> StoppingParams:
    """`values`: the set fields among max_tokens, min_tokens, stop, stop_token_ids, ignore_eos."""
    max_tokens = values.get("max_tokens")
    if max_tokens is not None and (max_tokens < 1 or max_tokens > limits.max_tokens):
        raise InvalidRequest(
            f"max_tokens must be in [1, {limits.max_tokens}] (the per-slot context), got {max_tokens}",
            field=name("max_tokens"),
        )
    min_tokens = check_int(values.get("min_tokens", 0), name("min_tokens"), 0, max_tokens or limits.max_tokens)
    stop = tuple(values.get("stop", ()))
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings", field=name("stop"))
    for i, text in enumerate(stop):
        if not text or len(text) > MAX_STOP_LENGTH:
            raise InvalidRequest(f"stop strings must have 1 to {MAX_STOP_LENGTH} characters", field=f"{name('stop')}[{i}]")
    stop_ids = tuple(values.get("stop_token_ids", ()))
    if len(stop_ids) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop token ids", field=name("stop_token_ids"))
    stop_ids = token_ids(stop_ids, limits.n_vocab, name("stop_token_ids"))
    return StoppingParams(max_tokens=max_tokens, min_tokens=min_tokens, stop=stop, stop_token_ids=stop_ids,
                          ignore_eos=bool(values.get("ignore_eos", False)))


def output_params(values: Mapping[str, Any], name: FieldName) -> OutputParams:
    """`values`: the set fields among top_logprobs, prompt_logprobs, include_special."""
    top = values.get("top_logprobs")
    if top is not None:
        top = check_int(top, name("top_logprobs"), 0, MAX_TOP_LOGPROBS)
    return OutputParams(top_logprobs=top, prompt_logprobs=bool(values.get("prompt_logprobs", False)),
                        include_special=bool(values.get("include_special", False)))


@dataclass(frozen=True)
class FieldNames:
    """How a surface spells the fields of each group (see `prefixed`)."""

    session: FieldName  # request_id, n, session_id
    sampling: FieldName
    stopping: FieldName
    output: FieldName


def session_params(request_id: str, limits: Limits, names: FieldNames, sampling: Mapping[str, Any],
                   stopping: Mapping[str, Any], output: Mapping[str, Any], num_samples: int | None = None,
                   session_id: str = "", priority: int = 0, grammar: str = "") -> SessionParams:
    """A Generate session's parameters from the set fields of each group (see
    `sampling_params`, `stopping_params`, `output_params`); `grammar`: the compiled GBNF; `n` at most `limits.max_samples`."""
    name = names.session
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidRequest(f"request_id is limited to {MAX_REQUEST_ID_LENGTH} characters", field=name("request_id"))
    n = check_int(num_samples, name("n"), 1, limits.max_samples) if num_samples is not None else 1
    if len(session_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidRequest(f"session_id is limited to {MAX_REQUEST_ID_LENGTH} characters", field=name("session_id"))
    if session_id.startswith(SERVER_SESSION_PREFIX):
        raise InvalidRequest(f"session ids starting {SERVER_SESSION_PREFIX!r} are the server's own", field=name("session_id"))
    if session_id and n > 1:
        raise InvalidRequest("a named session takes one sample per turn (n = 1)", field=name("n"))
    sampling_checked, output_checked = sampling_params(sampling, limits, names.sampling, grammar), output_params(output, names.output)
    if sampling_checked.deterministic and output_checked.prompt_logprobs:
        raise InvalidRequest("prompt logprobs need every prompt row's logits, which a deterministic session's fixed "
                             "chunks do not compute; set deterministic to false", field=names.output("prompt_logprobs"))
    return SessionParams(
        request_id=request_id,
        sampling=sampling_checked,
        stopping=stopping_params(stopping, limits, names.stopping),
        output=output_checked,
        priority=priority,
        num_samples=n,
        session_id=session_id,
    )


_REPEAT_KEYS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
                "maxContains")
_PATTERN_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def check_constraint(kind: str, text: str, field: str) -> None:
    """A constraint within the size limits: a "grammar", "json_schema" or "regex" text, a
    "choice" (a JSON list of strings: see `choice_text`), a "json_object" (no text); a schema
    within what the grammar compiler can build. The engine compiles it
    (`Engine.compile_async`)."""
    if kind == "json_object":
        return
    if kind == "choice":
        options = json.loads(text)
        if not options or len(options) > MAX_CHOICES or any(not o or len(o) > MAX_CHOICE_LENGTH for o in options):
            raise InvalidRequest(f"choice takes 1 to {MAX_CHOICES} strings of 1 to {MAX_CHOICE_LENGTH} characters",
                                 field=field)
        return
    if not text or len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(f"{kind} must have 1 to {MAX_GRAMMAR_BYTES} bytes", field=field)
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"the JSON schema is not JSON: {exc}", field=field) from None
        _check_schema_bounds(schema, field, "")


def without_large_counts(node: object) -> object:
    """A schema with its upper repetition bounds above MAX_SCHEMA_REPETITIONS left out (the
    bounds a grammar cannot build, unenforced: for a tool that is not `strict`, whose schema
    the grammar follows as far as it can; agents send string limits of 500k characters). A
    lower bound that large stays, and is refused: no reply could meet it."""
    if isinstance(node, list):
        return [without_large_counts(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: without_large_counts(value) for key, value in node.items()
            if not (key in _REPEAT_KEYS and key.startswith("max") and isinstance(value, (int, float))
                    and value > MAX_SCHEMA_REPETITIONS)}


def _check_schema_bounds(node: object, field: str, path: str, depth: int = 0) -> None:
    """Repetition counts and nesting the grammar compiler could not build: refused by name."""
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels at {path or '/'}", field=field)
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_schema_bounds(item, field, f"{path}/{i}", depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        where = f"{path}/{key}"
        if key in _REPEAT_KEYS and isinstance(value, (int, float)) and value > MAX_SCHEMA_REPETITIONS:
            raise InvalidRequest(
                f"{where} is {value}; a JSON schema's repetition counts are limited to {MAX_SCHEMA_REPETITIONS}",
                field=field,
            )
        if key == "pattern" and isinstance(value, str):
            for match in _PATTERN_REPEAT.finditer(value):
                count = max(int(match.group(1)), int(match.group(2) or 0))
                if count > MAX_SCHEMA_REPETITIONS:
                    raise InvalidRequest(
                        f"{where} repeats {count} times; a pattern's repetition counts are limited to "
                        f"{MAX_SCHEMA_REPETITIONS}",
                        field=field,
                    )
        _check_schema_bounds(value, field, where, depth + 1)
