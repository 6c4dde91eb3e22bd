"""Reading one JSON body's fields by type, each refusal a 400 naming the field.

Types and shapes only; ranges are the shared rules' (domain/request_rules.py). Used by
`/v1/completions` and `/v1/embeddings` (chat's request.py keeps its own for now).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from .errors import ApiError, bad_request

Body = dict[str, Any]


def body_of(value: object, allowed: Collection[str]) -> Body:
    """The body as a dict without its `null` fields (a null counts as not sent); a field
    not in `allowed` is refused by name, never ignored."""
    if not isinstance(value, dict):
        raise bad_request("the body must be a JSON object")
    body = {k: v for k, v in value.items() if v is not None}
    for name in body:
        if name not in allowed:
            raise bad_request(f"{name} is not supported by this server", name)
    return body


def number(body: Body, name: str) -> float:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"{name} must be a number, got {value!r}", name)
    return float(value)


def integer(body: Body, name: str) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {value!r}", name)
    return value


def boolean(body: Body, name: str) -> bool:
    value = body[name]
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean, got {value!r}", name)
    return value


def string(body: Body, name: str) -> str:
    value = body[name]
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string, got {value!r}", name)
    return value


def stop(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad_request("stop must be a string or an array of strings", "stop")


def seed(body: Body) -> int:
    value = integer(body, "seed")
    if not 0 <= value < 2**32:
        raise bad_request(f"seed must be in [0, {2**32 - 1}), got {value}", "seed")
    return value


def logit_bias(value: object) -> dict[int, float]:
    if not isinstance(value, dict):
        raise bad_request("logit_bias must be an object of token id → bias", "logit_bias")
    biases = {}
    for key, bias in value.items():
        where = f"logit_bias[{key}]"
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys are token ids, got {key!r}", where) from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"a logit bias must be a number in [-100, 100], got {bias!r}", where)
        biases[token] = float(bias)
    return biases


def include_usage(value: object, stream: bool) -> bool:
    """`stream_options`: only `include_usage`, only with `stream: true`."""
    if not stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(value, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    for key in value:
        if key != "include_usage":
            raise bad_request(f"stream_options.{key} is not supported by this server", f"stream_options.{key}")
    include = value.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad_request("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    return include


def token_list(value: object) -> bool:
    """Whether `value` is a list of token ids (ints, not bools)."""
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def texts_or_tokens(value: object, name: str) -> list[str | list[int]]:
    """OpenAI's prompt / input: a string, a list of strings, token ids, or a list of token-id
    lists, as a list of items (a string or a token-id list each); none may be empty."""
    if isinstance(value, str):
        items: list[str | list[int]] = [value]
    elif token_list(value) and value:
        items = [value]  # type: ignore[list-item]
    elif isinstance(value, list) and value and all(isinstance(v, str) or token_list(v) for v in value):
        items = list(value)
    else:
        raise bad_request(f"{name} must be a string, an array of strings, an array of token ids, "
                          "or an array of token-id arrays, none empty", name)
    for i, item in enumerate(items):
        if not item:
            where = name if isinstance(value, str) else f"{name}[{i}]"
            raise bad_request(f"{where} must not be empty", where)
    return items


def sampling_values(body: Body, names: Collection[str]) -> dict[str, Any]:
    """The sampling fields the body sets (`names`: its float ones), as the shared rules take them."""
    sampling: dict[str, Any] = {name: number(body, name) for name in names if name in body}
    if "top_k" in sampling:
        sampling["top_k"] = integer(body, "top_k")
    if "seed" in body:
        sampling["seed"] = seed(body)
    if "logit_bias" in body:
        sampling["logit_bias"] = logit_bias(body["logit_bias"])
    if "deterministic" in body:
        sampling["deterministic"] = boolean(body, "deterministic")
    return sampling


def stop_values(body: Body) -> dict[str, Any]:
    """min_tokens, ignore_eos and stop, where the body sets them."""
    stopping: dict[str, Any] = {}
    if "min_tokens" in body:
        stopping["min_tokens"] = integer(body, "min_tokens")
    if "ignore_eos" in body:
        stopping["ignore_eos"] = boolean(body, "ignore_eos")
    if "stop" in body:
        stopping["stop"] = stop(body["stop"])
    return stopping


def known_model(model: str | None, names: tuple[str, ...]) -> str:
    """The request's `model` (absent: the first name), or 404 model_not_found."""
    if model is None:
        return names[0]
    if model not in names:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {', '.join(names)}",
                       param="model", code="model_not_found")
    return model
