"""What the loaded model is and what a request may ask of it."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SAMPLES = 8  # samples of one turn (`n`), at most: and never more than the slots


@dataclass(frozen=True)
class Limits:
    """What a request may ask of this server: every surface validates against these."""

    n_vocab: int
    n_ctx_per_slot: int
    context_shift: bool = False
    n_parallel: int = MAX_SAMPLES
    input_tokens_limit: int | None = None  # --max-input-tokens (None: the slot's context)
    deterministic: bool = False  # --deterministic: a session's default
    kv_per_slot: bool = True  # one KV stream per slot (no --kv-unified): what deterministic sessions need

    @property
    def max_samples(self) -> int:
        """A turn's samples, at most: each needs a slot of its own."""
        return min(MAX_SAMPLES, self.n_parallel)

    @property
    def max_input_tokens(self) -> int:
        """All the input one session may be sent: --max-input-tokens, within the slot's context."""
        return min(self.input_tokens_limit or self.n_ctx_per_slot, self.n_ctx_per_slot)

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
