"""Per-request llama.cpp sampler chains (ctypes).

The chain follows llama-server's order (logit bias; penalties, DRY, top-n-sigma,
top_k, typical, top_p, min_p, XTC, temperature; then the draw, or temperature +
mirostat) with one change for speed: penalties and DRY run after top_k. Both
scan every candidate (milliseconds per token over a 262k vocabulary) and only
lower logits, so after top_k they cost microseconds and can only differ in which
tokens just outside the top k could have moved in.

A greedy chain with nothing else to apply is the argmax of the logits row, done
with numpy. A grammar is applied llama-server's way: sample with the chain, and
only if the grammar rejects that token, constrain the full row and sample again
(applying a grammar to 262k candidates on every token would cost tens of ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Iterator, Sequence

import llama_cpp
import numpy as np

from ..domain import GrammarError, SamplingParams

SAMPLER_NAMES = (
    "logit_bias", "penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
    "temperature", "dynamic_temperature", "mirostat", "mirostat_v2", "greedy", "grammar",
)

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """llama.cpp's grammar parser prints its errors straight to fd 2: catch them so they
    reach the client (and never the log as raw text). Our own logs go to stdout."""
    out: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))


def check_grammar(vocab: llama_cpp.llama_vocab_p, grammar: str) -> None:
    """Parse a grammar once (thread-safe: reads the vocabulary only)."""
    with _captured_stderr() as errors:
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not smpl:
        detail = " ".join(" ".join(errors).split())[:300]
        raise GrammarError(f"the grammar does not parse (GBNF with a 'root' rule expected): {detail}")
    llama_cpp.llama_sampler_free(smpl)


class Sampler:
    """Owns one llama_sampler chain (and grammar); used and freed by the executor thread only."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: llama_cpp.llama_vocab_p,
        n_vocab: int,
        n_ctx: int,
        banned_tokens: Sequence[int] = (),
        ctx: llama_cpp.llama_context_p | None = None,
    ) -> None:
        """`ctx`: the context whose batch rows `sample` reads."""
        self.params = params
        self._ctx = ctx
        self._n_vocab = n_vocab
        biases = list(params.logit_bias) + [(t, float("-inf")) for t in banned_tokens]
        self._is_argmax = params.is_greedy and not params.has_penalties and not biases and not params.grammar
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._grammar = None
        if params.grammar:
            self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
            if not self._grammar:
                raise GrammarError("the grammar does not parse")
        self._keep_alive: list[object] = []
        self._build(params, vocab, n_ctx, biases)

    def _add(self, smpl: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, smpl)

    def _build(self, p: SamplingParams, vocab: llama_cpp.llama_vocab_p, n_ctx: int, biases: list) -> None:  # type: ignore[type-arg]
        if biases:
            arr = (llama_cpp.llama_logit_bias * len(biases))()
            for i, (token, bias) in enumerate(biases):
                arr[i].token, arr[i].bias = token, bias
            self._add(llama_cpp.llama_sampler_init_logit_bias(self._n_vocab, len(biases), arr))
        if p.mirostat:
            self._add(llama_cpp.llama_sampler_init_temp(p.temperature))
            if p.mirostat == 1:
                self._add(llama_cpp.llama_sampler_init_mirostat(self._n_vocab, p.seed, p.mirostat_tau, p.mirostat_eta, 100))
            else:
                self._add(llama_cpp.llama_sampler_init_mirostat_v2(p.seed, p.mirostat_tau, p.mirostat_eta))
            return
        if p.top_n_sigma > 0:  # needs the whole distribution's spread: before top_k
            self._add(llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        if p.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.has_penalties:
            last_n = n_ctx if p.repeat_last_n == -1 else p.repeat_last_n
            self._add(llama_cpp.llama_sampler_init_penalties(
                self._n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            ))
        if p.dry_multiplier > 0:
            breakers = [b.encode() for b in p.dry_sequence_breakers]
            c_breakers = (ctypes.c_char_p * len(breakers))(*breakers)
            self._keep_alive.append(c_breakers)
            last_n = n_ctx if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n
            self._add(llama_cpp.llama_sampler_init_dry(
                vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n, c_breakers, len(breakers)
            ))
        if p.is_greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if p.typical_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_typical(p.typical_p, 1))
        self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        if p.xtc_probability > 0:
            self._add(llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, p.seed))
        self._add(llama_cpp.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent))
        self._add(llama_cpp.llama_sampler_init_dist(p.seed))

    # ---------------------------------------------------------------- sampling

    def sample(self, row: int, logits: np.ndarray) -> int:
        """Sample from batch row `row` (`logits` is its view) and accept the token."""
        if self._is_argmax:
            return int(logits.argmax())
        if self._grammar is None:
            # Builds the candidates in C from the context's row, and accepts the token.
            return int(llama_cpp.llama_sampler_sample(self._chain, self._ctx, row))
        token = self._apply(*self._candidates(logits))
        if not self._grammar_allows(token):
            data, arr = self._candidates(logits)
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
            token = self._apply(data, arr)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def sample_from(self, logits: np.ndarray) -> int:
        """Sample from logits the caller changed (a copy): candidates are built here."""
        if self._is_argmax:
            return int(logits.argmax())
        data, arr = self._candidates(logits)
        if self._grammar is not None:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        token = self._apply(data, arr)
        if self._grammar is not None:
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens into the chain's history (repetition penalties, DRY)."""
        if self.params.has_penalties or self.params.dry_multiplier > 0:
            for token in tokens:
                llama_cpp.llama_sampler_accept(self._chain, token)

    @staticmethod
    def _candidates(logits: np.ndarray) -> tuple[np.ndarray, llama_cpp.llama_token_data_array]:
        data = np.empty(len(logits), dtype=_TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(data), selected=-1, sorted=False
        )
        return data, arr

    def _apply(self, data: np.ndarray, arr: llama_cpp.llama_token_data_array) -> int:
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if arr.selected < 0:
            raise RuntimeError("the sampler chain selected no token")
        return int(arr.data[arr.selected].id)

    def _grammar_allows(self, token: int) -> bool:
        one = np.array([(token, 0.0, 0.0)], dtype=_TOKEN_DATA)
        arr = llama_cpp.llama_token_data_array(
            data=one.ctypes.data_as(llama_cpp.llama_token_data_p), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        return bool(np.isfinite(one["logit"][0]))

    def free(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
