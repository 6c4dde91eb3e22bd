"""The embedding model as the surfaces see it, and the size rule every embedding input keeps.

Every input must fit one ubatch (llama.cpp aborts the process otherwise) and the model's
trained context (a learned position table ends there): `max_input_tokens`. A longer input
is refused naming it, or cut when the request asks to truncate (as sentence-transformers'
truncation does for BERT, keeping a closing SEP/EOS the tokenizer added).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..domain.errors import InvalidRequest
from ..domain.model_meta import EmbeddingModelInfo
from ..domain.requests import EmbedInput

if TYPE_CHECKING:  # the model wing's class, for type hints only
    from ..model.embedder import Embedder


def embedding_model_info(embedder: Embedder) -> EmbeddingModelInfo:
    return EmbeddingModelInfo(
        meta=embedder.meta,
        pooling=embedder.pooling_name,
        n_embd=embedder.n_embd,
        n_ubatch=embedder.n_ubatch,
        max_input_tokens=embedder.max_input_tokens,
        adds_eos=embedder.tokenizer.adds_eos,
        eos_token_id=embedder.tokenizer.eos,
        separate=embedder.owns_model,
    )


def embed_input(info: EmbeddingModelInfo, index: int, tokens: tuple[int, ...], field: str, normalize: bool = True,
                truncate: bool = False, added_specials: bool = False) -> EmbedInput:
    """Input `index` as the executor takes it: within `max_input_tokens`, else InvalidRequest
    naming `field`, or (`truncate`) cut; `added_specials`: the tokenizer added BOS/EOS."""
    max_tokens = info.max_input_tokens
    if len(tokens) <= max_tokens:
        return EmbedInput(index, tokens, normalize, False)
    if not truncate:
        limit = "one ubatch, the model's trained context" if max_tokens == info.meta.n_ctx_train else "one ubatch"
        raise InvalidRequest(f"input {index} has {len(tokens)} tokens, more than the {max_tokens} an embedding "
                             f"input may have ({limit}); split it, or ask for it to be truncated", field=field)
    if added_specials and info.adds_eos and tokens[-1] == info.eos_token_id:
        return EmbedInput(index, tokens[: max_tokens - 1] + (tokens[-1],), normalize, True)
    return EmbedInput(index, tokens[:max_tokens], normalize, True)
