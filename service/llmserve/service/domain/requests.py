"""What a request asks for: sampling, stopping, output, a Generate session's parameters, an embedding input."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    deterministic: bool = False  # batch-invariant: greedy output a function of the transcript alone

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

    @property
    def reuses_prefix(self) -> bool:
        """Prompt logprobs need every prompt token evaluated: no cached prefix is reused then."""
        return not self.prompt_logprobs


AdapterSet = tuple[tuple[str, float], ...]  # (adapter name, scale), sorted by name, no zero scale; (): the base


def adapter_set(pairs: tuple[tuple[str, float], ...] | list[tuple[str, float]]) -> AdapterSet:
    """The one spelling of a set of LoRA adapters: sorted by name, without the zero scales
    (llama.cpp leaves those out of the graph, so such a set computes what the base does)."""
    return tuple(sorted((name, float(scale)) for name, scale in pairs if scale != 0.0))


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
    surface: str = "grpc"  # the wing that opened it ("grpc", "http"): the metrics' `surface` label
    adapters: AdapterSet = ()  # the LoRA adapters its decodes run under (adapter_set); (): the base model
    # An aLoRA set's invocation tokens: the adapters apply from their last occurrence on (): a LoRA set
    alora_invocation: tuple[int, ...] = ()

    @property
    def takes_stored_kv(self) -> bool:
        """Whether a stored turn's saved KV (`continue_from`) may seed its slot: not for prompt
        logprobs, nor under an aLoRA (where a saved cell's adapter starts is not saved)."""
        return self.output.reuses_prefix and not self.alora_invocation

    @property
    def kv_adapters(self) -> AdapterSet:
        """The set a slot's cached KV is keyed by for a fresh session: the base's for an aLoRA,
        whose cells before its invocation are the base's (its slot marks where they end)."""
        return () if self.alora_invocation else self.adapters


@dataclass(frozen=True)
class EmbedInput:
    """One tokenized input of an Embed stream."""

    index: int
    tokens: tuple[int, ...]
    normalize: bool
    truncated: bool
