"""Per-request llama.cpp sampler chains (ctypes).

Order follows llama-server (logit bias, penalties, top_k, top_p, min_p,
temperature, dist) except that top_k runs before the penalties: the penalty
sampler does a hash lookup for every candidate, milliseconds per token over a
262k vocabulary, and top_k first cuts the candidates to k.

A greedy chain with no penalties and no bias is the argmax of the logits row,
which `Sampler.sample` computes with numpy instead of copying the whole
vocabulary into a llama_token_data_array.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np

from .domain import SamplingParams


class Sampler:
    """Owns one llama_sampler chain; used and freed by the executor thread only."""

    def __init__(
        self,
        params: SamplingParams,
        n_vocab: int,
        banned_tokens: Sequence[int] = (),
    ) -> None:
        self.params = params
        self._n_vocab = n_vocab
        self._is_argmax = params.is_greedy and not params.has_penalties and not banned_tokens
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        add = lambda smpl: llama_cpp.llama_sampler_chain_add(self._chain, smpl)  # noqa: E731
        if banned_tokens:
            biases = (llama_cpp.llama_logit_bias * len(banned_tokens))()
            for i, token in enumerate(banned_tokens):
                biases[i].token = token
                biases[i].bias = float("-inf")
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(banned_tokens), biases))
        if params.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.has_penalties:
            add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    params.repeat_last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if params.is_greedy:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            add(llama_cpp.llama_sampler_init_dist(params.seed))

    def sample(self, ctx: llama_cpp.llama_context_p, row: int) -> int:
        """Sample from the logits of batch row `row` (which must have requested logits)."""
        if self._is_argmax:
            logits = llama_cpp.llama_get_logits_ith(ctx, row)
            token = int(np.ctypeslib.as_array(logits, shape=(self._n_vocab,)).argmax())
            return token
        # llama_sampler_sample also accepts the token into the chain's state.
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, row))

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens into the chain's history (repetition penalties)."""
        if self.params.has_penalties:
            for token in tokens:
                llama_cpp.llama_sampler_accept(self._chain, token)

    def free(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

