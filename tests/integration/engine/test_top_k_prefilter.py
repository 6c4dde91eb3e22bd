"""The top-k prefilter and the greedy argmax (model/sampler.py): a chain that starts with
top_k, handed only the top k candidates, and a greedy chain done by numpy draw exactly the
tokens the chain draws from the whole 262k-token row, also with forbidden tokens
(ignore_eos bans the end-of-generation tokens with -inf biases)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmserve.service.domain.requests import SamplingParams
from llmserve.service.model.default_model import default_model_path
from llmserve.service.model.sampler import Sampler, top_k_allowed_ids, top_k_ids
from llmserve.service.model.tokenizer import Vocab, load_model


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(load_model(default_model_path()))


def _rows(seed: int, n_vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    peaked = rng.standard_normal((20, n_vocab)).astype(np.float32) * 3  # many near the top
    flat = rng.standard_normal((20, n_vocab)).astype(np.float32) * 0.3  # all within the window
    spiky = rng.standard_normal((20, n_vocab)).astype(np.float32)
    spiky[:, rng.integers(0, n_vocab, 20)] += 30.0  # fewer than k within the window
    return [*peaked, *flat, *spiky]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=40, seed=11),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.5, min_p=0.0, seed=3),
    SamplingParams(temperature=0.7, top_k=64, repeat_penalty=1.3, presence_penalty=0.5, seed=5),
], ids=["defaults", "narrow", "penalties"])
def test_prefiltered_chain_draws_the_same_tokens(vocab: Vocab, params: SamplingParams) -> None:
    prefiltered = Sampler(params, vocab.ptr, vocab.n_tokens, 4096)
    whole = Sampler(dataclasses.replace(params), vocab.ptr, vocab.n_tokens, 4096)
    whole._top_k_first = False  # the reference: every token a candidate
    assert prefiltered._top_k_first
    drawn = [(prefiltered.sample_from(row), whole.sample_from(row)) for row in _rows(params.seed, vocab.n_tokens)]
    assert all(a == b for a, b in drawn), drawn
    assert len({a for a, _ in drawn}) > 10  # the draws differ: the rows and the RNG are exercised
    prefiltered.free()
    whole.free()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-50, 50, width=32), min_size=1, max_size=300), st.integers(1, 300), st.floats(0.5, 20))
def test_top_k_ids_are_the_k_highest(values: list[float], k: int, window: float) -> None:
    logits = np.array(values, dtype=np.float32)
    k = min(k, len(logits))
    ids = top_k_ids(logits, k, (window, 2 * window))
    assert len(ids) == k == len(set(ids.tolist()))
    assert np.sort(logits[ids]).tolist() == np.sort(logits)[-k:].tolist()


FORBIDDEN = (1, 106, 5000, 9, 200_000)  # gemma's <eos> and <end_of_turn> among them


def _rows_led_by_forbidden(seed: int, n_vocab: int) -> list[np.ndarray]:
    """Rows whose highest logits are forbidden tokens (as a model about to end would give)."""
    rows = _rows(seed, n_vocab)
    for i, row in enumerate(rows):
        if i % 2 == 0:
            row[list(FORBIDDEN[: 1 + i % len(FORBIDDEN)])] = row.max() + 5.0
    return rows


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, seed=1),
    SamplingParams(temperature=0.8, top_k=40, seed=11),
    SamplingParams(temperature=1.0, top_k=3, seed=7),
], ids=["greedy", "top-k", "narrow-top-k"])
def test_fast_paths_leave_out_forbidden_tokens_as_the_chain_does(vocab: Vocab, params: SamplingParams) -> None:
    fast = Sampler(params, vocab.ptr, vocab.n_tokens, 4096, banned_tokens=FORBIDDEN)
    whole = Sampler(dataclasses.replace(params), vocab.ptr, vocab.n_tokens, 4096, banned_tokens=FORBIDDEN)
    whole._is_argmax = whole._top_k_first = False  # the reference: the logit_bias sampler over every token
    assert fast._is_argmax or fast._top_k_first
    drawn = [(fast.sample_from(row), whole.sample_from(row)) for row in _rows_led_by_forbidden(params.seed, vocab.n_tokens)]
    assert all(a == b for a, b in drawn), drawn
    assert not {a for a, _ in drawn} & set(FORBIDDEN)
    assert len({a for a, _ in drawn}) > 10
    fast.free()
    whole.free()


def test_a_greedy_chain_with_every_token_forbidden_picks_none(vocab: Vocab) -> None:
    sampler = Sampler(SamplingParams(temperature=0.0), vocab.ptr, vocab.n_tokens, 4096, banned_tokens=FORBIDDEN)
    row = np.full(vocab.n_tokens, -np.inf, dtype=np.float32)
    row[list(FORBIDDEN)] = 1.0
    assert sampler.sample_from(row) is None
    sampler.free()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-50, 50, width=32), min_size=2, max_size=300), st.integers(1, 300),
       st.sets(st.integers(0, 299), max_size=20))
def test_top_k_allowed_ids_are_the_k_highest_allowed(values: list[float], k: int, banned: set[int]) -> None:
    logits = np.array(values, dtype=np.float32)
    forbidden = np.array(sorted(t for t in banned if t < len(logits)), dtype=np.int64)
    allowed = np.setdiff1d(np.arange(len(logits)), forbidden)
    k = min(k, len(allowed))
    if k == 0:
        return
    ids = top_k_allowed_ids(logits, k, forbidden)
    assert len(ids) == k == len(set(ids.tolist())) and not set(ids.tolist()) & set(forbidden.tolist())
    assert np.sort(logits[ids]).tolist() == np.sort(logits[allowed])[-k:].tolist()
