"""Speculative decoding on the fake runner: n-gram drafts, verification in the batched
step, rollback of rejected rows, and the same output as without speculation."""

from __future__ import annotations

from dataclasses import replace

from llmserve.service.config import SpeculationSettings
from llmserve.service.domain.events import FinishReason, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams
from llmserve.service.engine.executor.draft_pricing import worth_drafting
from llmserve.service.engine.executor.scheduler import Scheduler, SeqDemand
from llmserve.service.engine.executor.speculation import START_ODDS, NgramIndex, SeqSpeculation
from llmserve.service.model.ubatches import num_ubatches

from .engine_harness import GREEDY, ListSink, assert_kv_mirrors_slots, make, one_turn, params, run_until, turn_ends
from .fake_runner import BOS, FakeRunner

COSTS = FakeRunner.costs  # what the runner's steps cost prices the drafts

SPEC = SpeculationSettings(spec_type="ngram-simple", draft_max=16, spec_ngram_size_n=2, spec_max_rows=16)
# The fake model continues with last + 1: after 10..20 and again 10, 11, it samples 12;
# the n-gram (11, 12) drafts 13..20, 10, 11: 13..20 are accepted, at 10 the model says 21.
PROMPT = (BOS, *range(10, 21), 10, 11)


def test_ngram_index_drafts_what_followed_the_latest_occurrence() -> None:
    index = NgramIndex(2)
    index.sync([1, 2, 3, 4, 1, 2, 5, 6, 1])
    # (1, 2) last ended before 5; past the end the copy goes on from the last token and
    # from itself, as LZ77 does: the pattern 1 2 5 6 repeats
    assert index.draft(2, 8) == [5, 6, 1, 2, 5, 6, 1, 2]
    assert index.draft(2, 2) == [5, 6]
    assert index.draft(9, 8) == []
    index.sync([1, 2, 3])  # cut: rebuilt
    assert index.draft(1, 8) == []


def test_the_occurrence_that_matches_further_back_is_drafted() -> None:
    """A copy follows its source: (1, 2) occurs after 7 and later after 8; the history
    ends 7 1 and the next token is 2, so the draft is what followed 7 1 2."""
    index = NgramIndex(2)
    index.sync([7, 1, 2, 3, 4, 8, 1, 2, 5, 6, 0, 7, 1])
    assert index.draft(2, 3) == [3, 4, 8]
    index = NgramIndex(2)
    index.sync([7, 1, 2, 3, 4, 8, 1, 2, 5, 6, 0, 9, 1])  # neither matches further: the latest
    assert index.draft(2, 3) == [5, 6, 0]


def test_a_repeating_tail_drafts_the_repetition_in_full() -> None:
    """A small model stuck repeating one word: the latest occurrence of the n-gram is the
    history's own tail, and the draft is the repetition, not nothing."""
    index = NgramIndex(3)
    index.sync([7, 9, 9, 9])
    assert index.draft(9, 6) == [9] * 6
    index.sync([7, 9, 9, 9, 4, 9, 9, 9, 4])
    assert index.draft(9, 5) == [9, 9, 4, 9, 9]  # period 4: (9, 4, 9) last ended at 6


def test_adaptive_length_and_rest() -> None:
    earlier = SeqSpeculation(SPEC)
    for _ in range(5):
        earlier.record(8, 8)  # another sequence's drafts all landed ...
    spec = SeqSpeculation(SPEC, max_misses=2, rest_tokens=3)
    assert abs(spec.odds.chance - START_ODDS) < 1e-9  # ... a new one starts from the same odds
    spec.record(8, 2)
    assert spec.max_len == 3
    assert abs(spec.acceptance - (0.7 * 0.5 + 0.3 * 2 / 8)) < 1e-9  # the moving accepted share
    accepted, missed = 0.8 * START_ODDS + 2, 0.8 * (1 - START_ODDS) + 1  # 2 accepted, then a miss: per-token odds
    assert abs(spec.odds.chance - accepted / (accepted + missed)) < 1e-9
    spec.record_shadow(True)
    assert abs(spec.acceptance - (0.8 * (0.35 + 0.075) + 0.2)) < 1e-9  # a proposal not verified
    accepted, missed = 0.8 * accepted + 1, 0.8 * missed  # ... counts as its first token
    assert abs(spec.odds.chance - accepted / (accepted + missed)) < 1e-9
    spec.record(3, 3)
    assert spec.max_len == 6
    spec.record(4, 0)
    spec.record(4, 0)
    assert [spec.propose([1, 2, 1], 2, 8) for _ in range(3)] == [[], [], []]


def test_scheduler_grants_draft_rows_within_the_budget() -> None:
    scheduler = Scheduler(64, 64, 4, prefill_budget=None, max_draft_rows=8, costs=COSTS)
    one = scheduler.plan([SeqDemand(1, True, 0, 12, draft_acceptance=0.3, draft_odds=0.99)], [])
    assert one.drafts == ((1, 7),)  # a lone stream: priced by its per-token odds, not the share (8 rows: step_costs)
    assert scheduler.plan([SeqDemand(1, True, 0, 12, draft_acceptance=0.99, draft_odds=0.3)], []).drafts == ()
    four = scheduler.plan([SeqDemand(k, True, 0, 12, draft_acceptance=0.99) for k in (1, 2, 3, 4)], [])
    assert sorted(n for _, n in four.drafts) == [2, 2, 2, 2]  # the rows shared fairly
    uneven = scheduler.plan([SeqDemand(1, True, 0, 1, draft_acceptance=0.99), SeqDemand(2, True, 0, 12, draft_acceptance=0.99)], [])
    assert dict(uneven.drafts) == {1: 1, 2: 7}  # what one does not want goes to the next
    poor = scheduler.plan([SeqDemand(k, True, 0, 12, draft_acceptance=0.3 if k == 1 else 0.99, draft_odds=0.99) for k in (1, 2, 3)], [])
    assert poor.drafts == ()  # with 3-4 decoding only well-accepted drafts pay, and only all together
    # (one stream's drafts would slow every step of the others: plain c=4 lost 13%)
    assert scheduler.plan([SeqDemand(k, True, 0, 12 if k > 1 else 0, draft_acceptance=0.99) for k in (1, 2, 3)], []).drafts == ()
    assert scheduler.plan([SeqDemand(1, True, 0, 12)], []).drafts == ()  # even odds: one more row doubles the step
    assert scheduler.plan([SeqDemand(1, True, 0, 12, draft_odds=0.8)], []).drafts == ((1, 3),)  # START_ODDS: four rows
    many = scheduler.plan([SeqDemand(k, True, 0, 12, draft_acceptance=0.99) for k in range(1, 6)], [])
    assert many.drafts == ()  # a busy server does not draft (measured: c=8 lost a third)


def test_three_or_four_decoding_draft_equal_lengths_that_share_one_ubatch() -> None:
    # One KV stream per slot: split_equal puts consecutive sequences with equal rows in one
    # ubatch, so equal drafts cost no ubatch of their own (priced as one: 0.95 drafted nothing).
    scheduler = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=64, per_slot_streams=True, costs=COSTS)
    four = scheduler.plan([SeqDemand(k, True, 0, 16, seq_id=k, draft_acceptance=0.95) for k in (1, 2, 3, 4)], [])
    assert len(four.drafts) == 4 and len({n for _, n in four.drafts}) == 1 and four.drafts[0][1] >= 4
    assert num_ubatches([(key, 1 + n) for key, n in sorted(four.drafts)], 512, True) == 1
    short = scheduler.plan([SeqDemand(k, True, 0, 3 if k == 2 else 16, seq_id=k, draft_acceptance=0.99) for k in (1, 2, 3)], [])
    assert sorted(short.drafts) == [(1, 3), (2, 3), (3, 3)]  # as long as the shortest proposal
    assert worth_drafting(COSTS, 0.95, 4, 16, True) == 0


def test_two_or_three_decoding_draft_to_a_multiple_of_four_rows() -> None:
    # Per-slot streams: equal drafts share one ubatch, and a step of 2 (or 3) rows costs
    # nearly what one of 4 (or 12) does (step_costs), so their lengths fill the groups of four.
    scheduler = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=64, per_slot_streams=True, costs=COSTS)
    for keys in ((1, 2), (1, 2, 3)):
        plan = scheduler.plan([SeqDemand(k, True, 0, 16, seq_id=k, draft_acceptance=0.9) for k in keys], [])
        lengths = {n for _, n in plan.drafts}
        assert len(plan.drafts) == len(keys) and len(lengths) == 1, plan
        assert len(keys) * (1 + lengths.pop()) % 4 == 0
        assert num_ubatches([(key, 1 + n) for key, n in sorted(plan.drafts)], 512, True) == 1
    one_copies = scheduler.plan([SeqDemand(1, True, 0, 16, seq_id=1, draft_acceptance=0.9), SeqDemand(2, True, 0, 0, seq_id=2)], [])
    assert len(one_copies.drafts) <= 1  # the other has nothing to draft: priced with a ubatch of its own
    assert scheduler.plan([SeqDemand(k, True, 0, 16, seq_id=k, draft_acceptance=0.1) for k in (1, 2)], []).drafts == ()


def test_draft_rows_are_granted_only_where_they_pay() -> None:
    assert worth_drafting(COSTS, 0.3, 1, 16, False) == 0  # a lone stream whose drafts miss: none
    assert worth_drafting(COSTS, 0.9, 1, 16, False) >= 8  # a lone stream that copies: long drafts
    assert worth_drafting(COSTS, 0.9, 4, 16, True) == 0  # four streams, a ubatch of its own: not at 0.9
    assert worth_drafting(COSTS, 0.99, 4, 16, True) == 16
    for num_decoding in (1, 2, 4):  # never shorter for better drafts, never longer for busier steps
        lengths = [worth_drafting(COSTS, a / 20, num_decoding, 16, num_decoding > 1) for a in range(21)]
        assert lengths == sorted(lengths)
    assert all(worth_drafting(COSTS, a / 20, 2, 16, True) <= worth_drafting(COSTS, a / 20, 1, 16, False) for a in range(21))


def test_speculative_greedy_output_equals_plain_output() -> None:
    plain, _ = make(speculation=SpeculationSettings(spec_type="none"), price_drafts=False)
    sink_plain, _ = one_turn(plain, PROMPT, params(max_tokens=30, ignore_eos=True))
    spec, runner = make(speculation=SPEC, price_drafts=False)
    sink_spec, _ = one_turn(spec, PROMPT, params(max_tokens=30, ignore_eos=True))
    assert sink_spec.token_ids() == sink_plain.token_ids()
    assert sink_spec.text() == sink_plain.text()
    end = sink_spec.of(TurnEndEvent)[0]
    assert end.draft_tokens > end.accepted_draft_tokens >= 8
    assert spec.profile.steps < plain.profile.steps  # accepted drafts saved decode steps
    assert_kv_mirrors_slots(spec, runner)


def test_rejected_rows_leave_the_kv_and_stops_still_apply() -> None:
    executor, runner = make(speculation=SPEC, price_drafts=False)
    stop = "q"  # piece of token 16: inside an accepted draft
    sink, key = one_turn(executor, PROMPT, params(max_tokens=30, stop=(stop,)))
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.STOP_SEQUENCE and end.matched_stop == stop
    assert sink.token_ids()[-1] == 16 and sink.token_ids()[0] == 12
    assert_kv_mirrors_slots(executor, runner)
    executor.add_input(key, (30,), True)  # the session goes on from the KV as it should be
    run_until(executor, turn_ends(sink, 2))
    assert_kv_mirrors_slots(executor, runner)


def test_max_tokens_counts_draft_tokens() -> None:
    executor, runner = make(speculation=SPEC, price_drafts=False)
    sink, _ = one_turn(executor, PROMPT, params(max_tokens=5, ignore_eos=True))
    assert len(sink.token_ids()) == 5
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH
    assert_kv_mirrors_slots(executor, runner)


def test_sampling_with_drafts_keeps_the_kv_consistent() -> None:
    executor, runner = make(speculation=SPEC, price_drafts=False)
    p = replace(params(max_tokens=40, ignore_eos=True), sampling=SamplingParams(temperature=1.0, seed=5), num_samples=2)
    sink, _ = one_turn(executor, PROMPT, p)
    assert len(sink.token_ids(0)) == 40 and len(sink.token_ids(1)) == 40
    assert_kv_mirrors_slots(executor, runner)
    _ = GREEDY


def test_a_call_drafts_the_same_whatever_calls_came_before() -> None:
    """What a sequence drafts (and so its batch shapes, whose float rounding a fixed seed's
    draws depend on) comes from its own tokens only: no state carries over from other calls."""
    # The model says 12 after 11, and (11, 12) was followed by 10: every draft misses.
    missing = (BOS, 10, 11, 12, 10, 11)

    def prompt_call(history: int) -> tuple[list[int], int, int]:
        executor, _ = make(speculation=SPEC, price_drafts=False)
        executor.scheduler.price_drafts = True  # drafts granted by their odds, as served
        for _ in range(history):
            _, key = one_turn(executor, missing, params(max_tokens=6, ignore_eos=True))
            executor.close(key)
        steps = executor.profile.steps
        sink, _ = one_turn(executor, PROMPT, params(max_tokens=30, ignore_eos=True))
        end = sink.of(TurnEndEvent)[0]
        return sink.token_ids(), end.draft_tokens, executor.profile.steps - steps

    fresh = prompt_call(0)
    assert fresh[1] > 0  # it drafts
    assert prompt_call(4) == fresh  # after four calls whose drafts all missed: the same drafts, the same steps


def test_no_drafts_close_to_the_call_deadline() -> None:
    """A lone stream's drafts double and its steps with them, so near its deadline a call
    drafts nothing: the step before the deadline stays short and the turn's end (DEADLINE)
    still reaches the client in time."""
    import time

    drafted = []
    for deadline_s in (None, 0.15):  # within DRAFT_FREE_STEPS steps of 20 ms
        executor, runner = make(speculation=SPEC, price_drafts=False)
        decode = runner.decode
        runner.decode = lambda decode=decode: (time.sleep(0.02), decode())[1]  # type: ignore[method-assign, misc]
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        sink = ListSink()
        key = executor.open_session(params(max_tokens=30, ignore_eos=True), sink, deadline)
        executor.add_input(key, PROMPT, True)
        run_until(executor, turn_ends(sink))
        drafted.append(sink.of(TurnEndEvent)[0].draft_tokens)
    assert drafted[0] > 0 and drafted[1] == 0
