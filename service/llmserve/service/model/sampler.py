"""Per-request llama.cpp sampler chains (ctypes).

The chain follows llama-server's order (logit bias; penalties, DRY, top-n-sigma,
top_k, typical, top_p, min_p, XTC, temperature; then the draw, or temperature +
mirostat) with one change for speed: penalties and DRY run after top_k. Both
scan every candidate (milliseconds per token over a 262k vocabulary) and only
lower logits, so after top_k they cost microseconds and can only differ in which
tokens just outside the top k could have moved in.

A greedy chain with nothing else to apply is the argmax of the logits row, done
with numpy. A chain whose first filter is top_k (no top-n-sigma, mirostat or grammar)
gets only the top k candidates (`top_k_ids`: numpy, a fraction of a ms) instead of all
262k: top_k keeps exactly those and sorts them, so every later sampler and the draw see
the same candidates in the same order (ties at the k-th logit aside). Both hold with
forbidden tokens (-inf biases: ignore_eos, banned ids), which they leave out; a bias
that moves a logit needs the whole row (building it costs ~1 ms per token: 7% of a
16-stream step, measured with ignore_eos). A grammar is applied llama-server's way: sample with the chain, and
only if the grammar rejects that token, constrain the full row and sample again
(applying a grammar to 262k candidates on every token would cost tens of ms).

llama.cpp throws (std::terminate: the process dies) when a grammar accepts a token
it does not allow, and aborts when it accepts the end of generation before the
grammar is complete. So a token reaches `llama_sampler_accept` on the grammar only
after the grammar itself allowed it; when nothing is allowed (the grammar can only
end, and ignore_eos, min_tokens or a bias forbids ending) sampling returns None.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np

from ..domain.requests import SamplingParams
from .grammar_compiler import CompiledGrammar

SAMPLER_NAMES = (
    "logit_bias", "penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
    "temperature", "dynamic_temperature", "mirostat", "mirostat_v2", "greedy", "grammar",
)

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


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
        grammar: CompiledGrammar | None = None,
    ) -> None:
        """`ctx`: the context whose batch rows `sample` reads; `grammar`: `params.grammar`
        compiled (off this thread), cloned here."""
        self.params = params
        self._ctx = ctx
        self._n_vocab = n_vocab
        biases = list(params.logit_bias) + [(t, float("-inf")) for t in banned_tokens]
        self._forbidden = np.array(sorted({t for t, bias in biases if bias == float("-inf")}), dtype=np.int64)
        # Biases that move a logit (not only forbid a token) need the whole row in the chain.
        shifts = any(bias != float("-inf") for _, bias in biases)
        self._is_argmax = (
            params.is_greedy and not params.has_penalties and params.dry_multiplier <= 0 and not shifts
            and not params.grammar
        )
        self._top_k_first = (
            0 < params.top_k < n_vocab and not params.is_greedy and not params.mirostat and params.top_n_sigma <= 0
            and not shifts and not params.grammar
        )
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._compiled = grammar
        self._grammar = grammar.clone() if grammar is not None else None
        self._eog = int(llama_cpp.llama_vocab_eos(vocab))
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

    def sample(self, row: int, logits: np.ndarray) -> int | None:
        """Sample from batch row `row` (`logits` is its view) and accept the token;
        None when no token is allowed (see the module's docstring)."""
        if self._is_argmax:
            return self._argmax(logits)
        if self._top_k_first:
            return self.sample_from(logits)
        if self._grammar is None:
            # Builds the candidates in C from the context's row, and accepts the token.
            return int(llama_cpp.llama_sampler_sample(self._chain, self._ctx, row))
        token = self._apply(*self._candidates(logits))
        if not self._grammar_allows(token):
            return self._sample_constrained(logits)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def sample_from(self, logits: np.ndarray) -> int | None:
        """Sample from logits the caller changed (a copy) or saved: candidates are built here."""
        if self._is_argmax:
            return self._argmax(logits)
        if self._grammar is not None:
            return self._sample_constrained(logits)
        ids = top_k_allowed_ids(logits, self.params.top_k, self._forbidden) if self._top_k_first else None
        data, arr = self._candidates(logits, ids)
        if not self._any_allowed(data):
            return None
        token = self._apply(data, arr)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _sample_constrained(self, logits: np.ndarray) -> int | None:
        """The grammar applied to the whole row first, then the chain; None if nothing is left."""
        assert self._grammar is not None
        data, arr = self._candidates(logits)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        if not self._any_allowed(data):
            return None
        token = self._apply(data, arr)
        if not self._grammar_allows(token):  # never accept what the grammar refuses (it throws)
            return None
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _argmax(self, logits: np.ndarray) -> int | None:
        """Greedy with forbidden tokens (-inf biases: ignore_eos, bans) masked: the chain's
        choice (the first highest logit) without building 262k candidates."""
        token = int(logits.argmax())
        if self._forbidden.size and token in self._forbidden:
            logits = logits.copy()
            logits[self._forbidden] = -np.inf
            token = int(logits.argmax())
        return token if np.isfinite(logits[token]) else None

    def _any_allowed(self, data: np.ndarray) -> bool:
        allowed = np.isfinite(data["logit"])
        if len(data) == self._n_vocab:  # the top k alone hold no forbidden token
            allowed[self._forbidden] = False
        return bool(allowed.any())

    def grammar_allows_end(self) -> bool:
        """The grammar (if any) is complete: it would accept the end of generation."""
        if self._grammar is None:
            return True
        return self._grammar_allows(self._eog)

    def begin_turn(self) -> None:
        """Each turn's output matches the grammar from its start (a fresh clone: a reset
        would parse the grammar again, here on the executor thread)."""
        if self._compiled is not None and self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = self._compiled.clone()

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens into the chain's history (repetition penalties, DRY)."""
        if self.params.has_penalties or self.params.dry_multiplier > 0:
            for token in tokens:
                llama_cpp.llama_sampler_accept(self._chain, token)

    @staticmethod
    def _candidates(
        logits: np.ndarray, ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, llama_cpp.llama_token_data_array]:
        """Candidates for the chain: every token, or only `ids`."""
        data = np.empty(len(logits) if ids is None else len(ids), dtype=_TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype=np.int32) if ids is None else ids
        data["logit"] = logits if ids is None else logits[ids]
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


# Logit windows below a row's highest that `top_k_ids` tries in turn. With temperature
# sampling, 30% of gemma-3-270m's rows held fewer than 43 logits within 8 of their highest
# (a confident next token) and went to a partition of all 262k (~2.5 ms); within 16 every
# row held them (median 6,900).
TOP_K_WINDOWS = (8.0, 12.0, 16.0, 24.0)


def top_k_ids(logits: np.ndarray, k: int, windows: Sequence[float] = TOP_K_WINDOWS) -> np.ndarray:
    """The ids of the k highest logits (in no order). Exact: when at least k logits lie
    within a window of the highest, the k-th highest does too, so the top k are among
    them and only those few are partitioned. The windows widen until one holds k (each a
    pass over the row); past the last the whole row is partitioned."""
    highest = logits.max()
    for window in windows:
        near = np.flatnonzero(logits >= highest - window)
        if len(near) >= k:
            break
    else:
        return np.argpartition(logits, -k)[-k:]
    if len(near) == k:
        return near
    return near[np.argpartition(logits[near], -k)[-k:]]


def top_k_allowed_ids(logits: np.ndarray, k: int, forbidden: np.ndarray) -> np.ndarray:
    """The ids of the k highest logits outside `forbidden` (in no order): they are among
    the k + len(forbidden) highest of all."""
    if forbidden.size == 0:
        return top_k_ids(logits, k)
    ids = top_k_ids(logits, min(k + forbidden.size, len(logits)))
    ids = ids[~np.isin(ids, forbidden)]
    return ids if len(ids) <= k else ids[np.argpartition(logits[ids], -k)[-k:]]
