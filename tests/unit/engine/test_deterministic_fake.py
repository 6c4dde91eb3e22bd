"""Deterministic sessions in the executor, on the fake runner (canonical_chunks.py): every decode
that holds one of their rows holds no other session's, their prompts go in canonical chunks
from position 0, and a cache serves them only whole canonical chunks, so a later turn or a
warm request computes exactly the shapes a cold one does. (That llama.cpp then gives the same
bits is the integration test's: tests/integration/server/test_deterministic.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
from llmserve.service.domain.errors import InvalidRequest, PreconditionFailed
from llmserve.service.domain.events import TurnEndEvent
from llmserve.service.domain.model_meta import Limits
from llmserve.service.domain.request_rules import FieldNames, prefixed, session_params
from llmserve.service.engine.executor import canonical_chunks as chunks

from .engine_harness import GREEDY, ListSink, assert_kv_mirrors_slots, make, params, run_until, turn_ends
from .fake_runner import BOS, FakeRunner, next_token

CHUNK = 64  # the harness's n_batch = n_ubatch
Rows = list[tuple[int, int]]  # (seq_id, position) of each row of one decode


def _recording(runner: FakeRunner) -> list[Rows]:
    decodes: list[Rows] = []
    decode = runner.decode

    def recorded() -> int:
        b = runner.batch
        decodes.append([(int(b.seq[i]), int(b.pos[i])) for i in range(b.num_tokens)])
        return decode()

    runner.decode = recorded  # type: ignore[method-assign]
    return decodes


def _open(executor, prompt: tuple[int, ...], deterministic: bool, max_tokens: int = 6) -> tuple[ListSink, int]:  # type: ignore[no-untyped-def]
    sink = ListSink()
    p = params(max_tokens=max_tokens)
    key = executor.open_session(replace(p, sampling=replace(GREEDY, deterministic=deterministic)), sink)
    executor.add_input(key, prompt, True)
    return sink, key


def _chunks_of(decodes: list[Rows], seq_id: int) -> list[tuple[int, int]]:
    """(first position, rows) of each decode holding `seq_id`, which must hold nothing else."""
    out = []
    for rows in decodes:
        mine = [pos for seq, pos in rows if seq == seq_id]
        if mine:
            assert len(mine) == len(rows), f"seq {seq_id} shared a decode: {rows}"
            assert mine == list(range(mine[0], mine[0] + len(mine)))
            out.append((mine[0], len(mine)))
    return out


def test_the_chunk_rules() -> None:
    assert chunks.canonical_chunk(2048, 512) == chunks.MAX_CANONICAL_CHUNK
    assert chunks.canonical_chunk(64, 64) == 64
    assert chunks.num_ready(0, 150, 64, True) == 64
    assert chunks.num_ready(128, 22, 64, True) == 22  # the last, partial chunk
    assert chunks.num_ready(128, 22, 64, False) == 0  # more input may come: a whole chunk or nothing
    assert chunks.num_ready(100, 150, 64, True) == 28  # back on the grid
    assert chunks.is_canonical(64, 64, 64, 64) and not chunks.is_canonical(64, 64, 30, 64)
    assert not chunks.is_canonical(0, 64, 64, 64)  # a gap: not computed on a canonical prefix
    assert chunks.reusable(128, 0, 100, 64) == 64  # a shared prefix ending mid-chunk: the whole chunks before it
    assert chunks.reusable(64, 0, 149, 64) == 64  # no more than was computed canonically


def test_a_deterministic_session_decodes_alone_in_canonical_chunks() -> None:
    executor, runner = make(n_parallel=4)
    decodes = _recording(runner)
    prompt = (BOS, *range(3, 152))  # 150 tokens
    shared = [_open(executor, (BOS, 5 + i, 6, 7), False, max_tokens=12)[0] for i in range(2)]
    lone, key = _open(executor, prompt, True)
    run_until(executor, lambda: all(turn_ends(s)() for s in (*shared, lone)))
    seq_id = executor.table.sessions[key].main.slot.seq_id  # type: ignore[union-attr]
    mine = _chunks_of(decodes, seq_id)
    assert mine[:3] == [(0, 64), (64, 64), (128, 22)]  # the prompt, then one token per decode
    assert all(rows == 1 for _, rows in mine[3:]) and len(mine) == 3 + 5
    assert any(len({seq for seq, _ in rows}) == 2 for rows in decodes)  # the others still share
    assert lone.token_ids()[0] == next_token(151)  # the prompt's last token's logits
    assert_kv_mirrors_slots(executor, runner)


def test_a_warm_cache_serves_whole_canonical_chunks_only() -> None:
    executor, runner = make(n_parallel=2)
    prompt = (BOS, *range(3, 152))
    first, key = _open(executor, prompt, True, max_tokens=2)
    run_until(executor, turn_ends(first))
    executor.close(key)
    decodes = _recording(runner)
    again, key = _open(executor, prompt, True, max_tokens=2)
    run_until(executor, turn_ends(again))
    assert again.of(TurnEndEvent)[0].cached_tokens == 128  # not 149: the last chunk again, whole
    seq_id = executor.table.sessions[key].main.slot.seq_id  # type: ignore[union-attr]
    assert _chunks_of(decodes, seq_id)[0] == (128, 22)
    assert again.token_ids() == first.token_ids()
    executor.close(key)
    shared, _ = _open(executor, prompt, False, max_tokens=2)  # not deterministic: all but the last token
    run_until(executor, turn_ends(shared))
    assert shared.of(TurnEndEvent)[0].cached_tokens >= 149
    assert_kv_mirrors_slots(executor, runner)


def test_a_prefix_shared_to_mid_chunk_is_reused_to_the_chunk_before() -> None:
    executor, runner = make(n_parallel=1)
    first, key = _open(executor, (BOS, *range(3, 152)), True, max_tokens=2)
    run_until(executor, turn_ends(first))
    executor.close(key)
    other, _ = _open(executor, (BOS, *range(3, 103), *range(200, 240)), True, max_tokens=2)  # shares 101 tokens
    run_until(executor, turn_ends(other))
    assert other.of(TurnEndEvent)[0].cached_tokens == 64
    assert_kv_mirrors_slots(executor, runner)


def test_a_next_turn_computes_its_transcript_as_a_fresh_request_would() -> None:
    """Turn 2 recomputes from the last whole chunk: the prompt's tail and the reply go in
    chunks with the new input, as they would for one request holding the whole transcript."""
    executor, runner = make(n_parallel=2)
    sink, key = _open(executor, (BOS, *range(3, 152)), True, max_tokens=4)
    run_until(executor, turn_ends(sink))
    decodes = _recording(runner)
    executor.add_input(key, (20, 21, 22), True)
    run_until(executor, turn_ends(sink, 2))
    seq_id = executor.table.sessions[key].main.slot.seq_id  # type: ignore[union-attr]
    assert _chunks_of(decodes, seq_id)[0] == (128, 22 + 4 + 3)  # prompt tail, reply, new input: one chunk
    assert sink.of(TurnEndEvent)[1].cached_tokens == 128
    assert_kv_mirrors_slots(executor, runner)


def test_the_rules_resolve_the_server_default_and_refuse_prompt_logprobs() -> None:
    names = FieldNames(prefixed(""), prefixed(""), prefixed(""), prefixed(""))
    on = Limits(n_vocab=64, n_ctx_per_slot=256, deterministic=True)
    assert session_params("r", on, names, {}, {}, {}).sampling.deterministic
    assert not session_params("r", on, names, {"deterministic": False}, {}, {}).sampling.deterministic
    assert not session_params("r", Limits(64, 256), names, {}, {}, {}).sampling.deterministic
    with pytest.raises(InvalidRequest) as refused:
        session_params("r", on, names, {}, {}, {"prompt_logprobs": True})
    assert refused.value.field == "prompt_logprobs"
    with pytest.raises(PreconditionFailed) as unified:  # cells among the others': no invariance to offer
        session_params("r", Limits(64, 256, kv_per_slot=False), names, {"deterministic": True}, {}, {})
    assert unified.value.field == "deterministic"
