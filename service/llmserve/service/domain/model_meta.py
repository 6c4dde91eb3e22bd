"""What the loaded model is and what a request may ask of it."""

from __future__ import annotations

from dataclasses import dataclass


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
