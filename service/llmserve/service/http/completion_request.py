"""A `/v1/completions` body → the engine's values, or a 400 naming the field.

Types and shapes here (fields.py); ranges in the rules both surfaces share
(domain/request_rules.py), with OpenAI's names (ours). A field this wing does not serve
is refused by name, `suffix` included (no fill-in-the-middle); a `null` counts as not sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..domain import request_rules
from ..domain.model_meta import Limits
from ..domain.requests import SessionParams
from . import fields
from .adapters import LoraRef, lora_field
from .errors import bad_request

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
            "frequency_penalty")
_SAME: request_rules.FieldName = lambda name: name  # noqa: E731
NAMES = request_rules.FieldNames(session=lambda name: "x-request-id" if name == "request_id" else name,
                                 sampling=_SAME, stopping=_SAME, output=lambda name: "logprobs")
FIELDS = frozenset({
    "model", "prompt", "stream", "stream_options", "n", "max_tokens", "stop", "seed", "logit_bias", "logprobs",
    "echo", "user", "min_tokens", "ignore_eos", *SAMPLING, "lora", "deterministic",
})
MAX_PROMPTS = 64  # prompts of one request (each runs as a session of its own)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]  # text (tokenized with BOS, as gRPC's) or token ids
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None  # the legacy int: alternatives per token
    n: int | None = None
    prompt_only: bool = False  # max_tokens 0: no completion tokens are shown
    sampling: dict[str, Any] = field(default_factory=dict)  # our names; only what the body set
    stopping: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() by which the turns end (x-request-timeout)
    lora: tuple[LoraRef, ...] = ()  # llama-server's per-request adapters (http/adapters.py)

    def session_params(self, request_id: str, limits: Limits) -> SessionParams:
        output: dict[str, Any] = {}
        if self.logprobs is not None:
            output["top_logprobs"] = self.logprobs
            output["prompt_logprobs"] = self.echo  # the echoed prompt's tokens are scored too
        return request_rules.session_params(request_id, limits, NAMES, self.sampling, self.stopping, output,
                                            num_samples=self.n)


def parse_completion(value: object) -> CompletionRequest:
    if isinstance(value, dict) and value.get("suffix") is not None:
        raise bad_request("suffix is not supported by this server (no fill-in-the-middle)", "suffix")
    body = fields.body_of(value, FIELDS)
    if "prompt" not in body:
        raise bad_request("prompt is required", "prompt")
    prompts = fields.texts_or_tokens(body["prompt"], "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", "prompt")
    sampling = fields.sampling_values(body, SAMPLING)
    max_tokens = fields.integer(body, "max_tokens") if "max_tokens" in body else DEFAULT_MAX_TOKENS
    # max_tokens 0 (eval harnesses: the prompt's logprobs with echo): one token runs, none is shown
    stopping: dict[str, Any] = {"max_tokens": max_tokens or 1, **fields.stop_values(body)}
    stream = fields.boolean(body, "stream") if "stream" in body else False
    include_usage = fields.include_usage(body["stream_options"], stream) if "stream_options" in body else False
    if "user" in body:
        fields.string(body, "user")
    model = fields.string(body, "model") if "model" in body else None
    return CompletionRequest(
        model, prompts, stream, include_usage,
        echo=fields.boolean(body, "echo") if "echo" in body else False,
        logprobs=fields.integer(body, "logprobs") if "logprobs" in body else None,
        n=fields.integer(body, "n") if "n" in body else None,
        prompt_only=max_tokens == 0,
        sampling=sampling, stopping=stopping,
        lora=lora_field(body["lora"]) if "lora" in body else (),
    )
