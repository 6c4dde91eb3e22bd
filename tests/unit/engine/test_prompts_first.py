"""Prompts first (engine/executor/prompts_first.py): with one KV stream per slot, a step that
finishes prompts leaves its decode rows to the next step when they would cost it a ubatch."""

from __future__ import annotations

import pytest
from llmserve.service.config import SpeculationSettings
from llmserve.service.engine.executor import scheduler as scheduler_module
from llmserve.service.engine.executor.prompts_first import MAX_STEP_UBATCHES
from llmserve.service.engine.executor.scheduler import Scheduler, SeqDemand

from .engine_harness import ListSink, assert_kv_mirrors_slots, make, params, run_until, turn_ends
from .fake_runner import BOS, FakeRunner

# One sample decoding on id 0, three prompts of distinct lengths (each ready whole) next to it
BURST = [SeqDemand(1, True, 0, seq_id=0), SeqDemand(2, False, 22, seq_id=1), SeqDemand(3, False, 20, seq_id=2),
         SeqDemand(4, False, 21, seq_id=3)]


def per_slot(prefill_budget: int | None = None) -> Scheduler:
    return Scheduler(512, 512, 4, prefill_budget=prefill_budget, per_slot_streams=True, costs=FakeRunner.costs)


def test_a_step_that_finishes_a_burst_leaves_the_decode_row_to_the_next_which_runs_it() -> None:
    scheduler = per_slot()
    first = scheduler.plan(BURST, [])
    assert first.decode == () and sorted(first.prefill) == [(2, 22), (3, 20), (4, 21)]
    assert first.next_state.decode_held
    second = scheduler.plan(BURST, [], state=first.next_state)  # never twice in a row
    assert second.decode == (1,) and not second.next_state.decode_held
    assert scheduler.plan(BURST, [], state=second.next_state).decode == ()


def test_the_decode_rows_go_when_they_save_no_ubatch_a_prompt_goes_on_or_waits_the_step_is_large_or_one_buffer() -> None:
    one_token = [SeqDemand(1, True, 0, seq_id=0), SeqDemand(2, False, 1, seq_id=1)]
    assert per_slot().plan(one_token, []).decode == (1,)  # the prompt's token shares the decode rows' ubatch
    goes_on = per_slot(prefill_budget=64).plan([SeqDemand(1, True, 0, seq_id=0), SeqDemand(2, False, 300, seq_id=1)], [])
    assert goes_on.decode == (1,) and goes_on.prefill == ((2, 64),)  # not its prompt's last chunk
    unified = Scheduler(512, 512, 4, prefill_budget=None, costs=FakeRunner.costs)
    assert unified.plan(BURST, []).decode == (1,)  # one KV buffer: one ubatch either way
    three_waiting = [*(SeqDemand(1 + i, True, 0, seq_id=i) for i in range(3)),
                     *(SeqDemand(4 + i, False, 5, seq_id=3 + i) for i in range(3))]
    paced = per_slot(prefill_budget=64).plan(three_waiting, [])  # two prompts a step beside decode rows
    assert len(paced.prefill) == 2 and paced.decode == (1, 2, 3)  # the third waits: the decode rows go now
    large = [SeqDemand(1, True, 0, seq_id=0), *(SeqDemand(2 + i, False, 20 - i, seq_id=1 + i) for i in range(MAX_STEP_UBATCHES))]
    assert per_slot().plan(large, []).decode == (1,)  # a burst of more ubatches: its decode rows go
    assert per_slot().plan(large[:MAX_STEP_UBATCHES], []).decode == ()  # one fewer prompt: they wait


def test_the_ubatches_are_counted_on_the_prompts_as_they_will_be_seated() -> None:
    # Eight prompts of 20 and 22 tokens alternating over ids 1-8 beside a decode row: in their slots
    # 6 ubatches with the row (over the bound), seated by length 3 with it and 2 without.
    def burst(tradable: bool) -> list[SeqDemand]:
        return [SeqDemand(0, True, 0, seq_id=0),
                *(SeqDemand(1 + i, False, (20, 22)[i % 2], seq_id=1 + i, reseatable=tradable) for i in range(8))]
    assert per_slot().plan(burst(True), []).decode == ()  # empty slots: seat_by_length will order them
    assert per_slot().plan(burst(False), []).decode == (0,)  # cached history: they stay where they are


def burst_beside_a_stream(monkeypatch: pytest.MonkeyPatch, prompts_first: bool) -> tuple[int, int, list[list[int]]]:
    """A stream decoding, then three prompts of 12, 10 and 11 tokens at once: the burst step's
    ubatches, the stream's tokens after it, and every reply."""
    if not prompts_first:
        monkeypatch.setattr(scheduler_module, "decode_rows_wait", lambda *args: False)
    executor, runner = make(n_parallel=4, speculation=SpeculationSettings(spec_type="none"))
    stream = ListSink()
    executor.add_input(executor.open_session(params(max_tokens=12), stream), (BOS, 50, 51, 52), True)
    run_until(executor, lambda: len(stream.token_ids()) >= 2)
    sinks = [ListSink() for _ in range(3)]
    for sink, length in zip(sinks, (12, 10, 11)):
        executor.add_input(executor.open_session(params(max_tokens=4), sink), (BOS, *range(200 + length, 199 + 2 * length)), True)
    executor.drain(block=False)
    before, ubatches_before = len(stream.token_ids()), executor.profile.ubatches  # the profile counts from the start
    executor.step()
    ubatches, stream_tokens = executor.profile.ubatches - ubatches_before, len(stream.token_ids()) - before
    assert all(len(sink.token_ids()) == 1 for sink in sinks)  # the whole burst prefilled in that step
    run_until(executor, lambda: all(turn_ends(sink)() for sink in (stream, *sinks)))
    assert_kv_mirrors_slots(executor, runner)
    return ubatches, stream_tokens, [sink.token_ids() for sink in (stream, *sinks)]


def test_a_burst_beside_a_decoding_stream_gets_its_first_tokens_from_a_step_of_fewer_ubatches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, stream_tokens, replies = burst_beside_a_stream(monkeypatch, True)
    with monkeypatch.context() as patched:
        before, stream_tokens_before, replies_before = burst_beside_a_stream(patched, False)
    assert (first, before) == (3, 4)  # one ubatch per distinct length; the decode row's own before
    assert (stream_tokens, stream_tokens_before) == (0, 1)  # its token comes a step later
    assert replies == replies_before  # and every reply is the same
