"""Domain types shared by the transport, the engine and the model wings.

Everything here is a frozen dataclass, an enum, a protocol or an exception: these
values cross from the event-loop thread to the executor thread and back, so nobody
may mutate them. Nothing here imports grpc or llama_cpp.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class InvalidRequest(ValueError):
    """A request the engine refuses (the transport maps it to INVALID_ARGUMENT)."""

    def __init__(self, message: str, field: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.retry_after_s = retry_after_s


class PreconditionFailed(InvalidRequest):
    """A request this server cannot serve as configured (FAILED_PRECONDITION)."""


class GrammarError(InvalidRequest):
    """A GBNF grammar (or the grammar of a JSON schema) that llama.cpp cannot use."""


class EventSink(Protocol):
    """Where a request's events go (the transport bridges it into the event loop)."""

    def put(self, event: object) -> None: ...

    @property
    def backlog(self) -> int:
        """Events put but not yet taken by the consumer."""
        ...


@dataclass(frozen=True)
class Limits:
    """What a request may ask of this server: the transport validates against these."""

    n_vocab: int
    n_ctx_per_slot: int
    context_shift: bool = False

    @property
    def max_tokens(self) -> int:
        """A turn's generation limit: the slot's context, or (shifting) practically none."""
        return 2**31 - 1 if self.context_shift else self.n_ctx_per_slot


@dataclass(frozen=True)
class ModelMeta:
    """What a loaded GGUF says about itself."""

    name: str
    path: str
    architecture: str
    num_parameters: int
    n_ctx_train: int
    n_embd: int
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    eog_token_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None
    # Sliding-window attention span (0: none). A token at position p attends to the
    # positions after p - n_swa in those layers, and llama.cpp drops older cells.
    n_swa: int = 0
    quantization: str = ""  # GGUF general.file_type, as llama.cpp names it (Q4_K_M)


@dataclass(frozen=True)
class EmbeddingModelInfo:
    """The model Embed runs on (the generative model unless `separate`)."""

    meta: ModelMeta
    pooling: str
    n_embd: int
    n_ubatch: int
    max_input_tokens: int  # min(n_ubatch, n_ctx_train): longer inputs are refused or cut
    adds_eos: bool  # tokenizing with specials appends EOS/SEP (BERT-style)
    eos_token_id: int
    separate: bool


@dataclass(frozen=True)
class SavedSession:
    """A named session's state: what its KV holds, and the KV bytes."""

    session_id: str
    tokens: tuple[int, ...]  # the KV holds these, at positions 0..n-1
    pending: tuple[int, ...]  # sampled or sent, not yet in the KV
    chat: tuple[tuple[str, str], ...] | None
    state: bytes


@dataclass(frozen=True)
class SlotSnapshot:
    seq_id: int
    busy: bool
    num_cached_tokens: int
    paused: bool = False
    kv_pos_min: int = -1  # from llama.cpp's memory, for leak checks
    kv_pos_max: int = -1


@dataclass(frozen=True)
class ExecutorSnapshot:
    """Published by the executor after every step; read from any thread."""

    slots: tuple[SlotSnapshot, ...] = ()
    num_sessions: int = 0
    num_waiting: int = 0
    num_embed_queued: int = 0
    num_steps: int = 0
    num_kv_tokens: int = 0


class FinishReason(enum.IntEnum):
    """Why a turn ended (numbers match llmserve.v1.FinishReason)."""

    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2
    STOP_SEQUENCE = 3
    CANCELLED = 4
    DEADLINE = 5
    CONTEXT_FULL = 6
    ERROR = 7


DEFAULT_DRY_BREAKERS = ("\n", ":", '"', "*")


@dataclass(frozen=True)
class SamplingParams:
    """Resolved sampling parameters (defaults follow llama-server)."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = 0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str = ""  # GBNF; a JSON schema arrives here already converted

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 and self.mirostat == 0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class StoppingParams:
    """When a turn stops: max_tokens None means "until the slot's context is full"."""

    max_tokens: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class OutputParams:
    top_logprobs: int | None = None  # None: no logprobs; 0: the sampled token's only
    prompt_logprobs: bool = False
    include_special: bool = False


@dataclass(frozen=True)
class SessionParams:
    """Everything the first Generate message configures."""

    request_id: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    output: OutputParams = field(default_factory=OutputParams)
    priority: int = 0
    num_samples: int = 1
    session_id: str = ""  # saved when the stream ends, restored by a later stream


# ----------------------------------------------------------- executor → client


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (id, text, logprob), most likely first


@dataclass(frozen=True)
class TokenEvent:
    """Text that is safe to show (complete UTF-8, no stop string) and its tokens."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    index: int = 0


@dataclass(frozen=True)
class PromptLogprobsEvent:
    tokens: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class TurnEndEvent:
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_ms: float
    ttft_ms: float
    prompt_ms: float
    decode_ms: float
    seed: int
    matched_stop: str = ""
    message: str = ""
    index: int = 0
    matched_stop_token_id: int | None = None
    final: bool = True  # the last turn end of this turn (all samples done)
    draft_tokens: int = 0  # speculative draft tokens verified
    accepted_draft_tokens: int = 0
    # When the phases ran (time.monotonic() seconds), for trace spans: waiting for a slot
    # [t_queued, t_slot], prefill [t_ready, t_first_token], decode [t_first_token, t_end].
    t_queued: float = 0.0
    t_slot: float = 0.0
    t_ready: float = 0.0
    t_first_token: float = 0.0
    t_end: float = 0.0


@dataclass(frozen=True)
class SessionFailed:
    """The session cannot go on; the transport ends the RPC with this status."""

    status: str  # a StatusCode name, e.g. "INVALID_ARGUMENT"
    message: str


@dataclass(frozen=True)
class EmbedInput:
    """One tokenized input of an Embed stream."""

    index: int
    tokens: tuple[int, ...]
    normalize: bool
    truncated: bool


@dataclass(frozen=True)
class EmbedResult:
    index: int
    vector: np.ndarray
    num_tokens: int
    truncated: bool
    # The executor step that computed it (time.monotonic() seconds; inputs of all calls).
    t_batch_start: float = 0.0
    t_batch_end: float = 0.0
    batch_size: int = 0
