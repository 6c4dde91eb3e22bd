"""Prompt chunks of one step with one KV stream per slot: trimmed to one length when that
brings the prompts their first token sooner (executor/prefill_shares.py)."""

from __future__ import annotations

from llmserve.service.engine.executor.prefill_shares import equal_chunks
from llmserve.service.engine.executor.scheduler import Scheduler, SeqDemand
from llmserve.service.model.step_costs import MeasuredCosts
from llmserve.service.model.ubatches import ubatch_sizes

# The shape measured at start-up on a 2-core machine (gemma-3-270m, 2 threads): a graph
# run costs about a one-row step whatever it holds, then each prompt token ~7% of one
COSTS = MeasuredCosts(decode_ms=((1, 22.0), (4, 34.0), (16, 80.0), (64, 260.0)),
                      prefill_ms=((1, 22.0), (17, 47.0), (68, 130.0), (512, 830.0)))


def prompts(*lengths: int) -> list[SeqDemand]:
    return [SeqDemand(key, False, n, seq_id=key) for key, n in enumerate(lengths) if n]


def num_runs(demands: list[SeqDemand], chunks: list[tuple[int, int]]) -> int:
    seq = {d.key: d.seq_id for d in demands}
    rows = sorted([(d.seq_id, 1) for d in demands if d.decode_token] + [(seq[key], n) for key, n in chunks])
    return len(ubatch_sizes(rows, 512, True))


def test_a_burst_of_close_lengths_takes_fewer_ubatches_and_some_prompts_complete() -> None:
    demands = prompts(17, 18, 19, 20)  # as one chunk each: runs of 68, 3, 2 and 1 tokens
    grants = [(d.key, d.num_prefill) for d in demands]
    chunks = equal_chunks(grants, demands, {}, COSTS, 512)
    assert num_runs(demands, grants) == 4
    assert num_runs(demands, chunks) <= 2
    assert all(0 < n <= d.num_prefill for d, (_, n) in zip(demands, chunks))
    assert any(n == d.num_prefill for d, (_, n) in zip(demands, chunks))  # its first token after this step


def test_tails_ride_beside_the_decode_rows() -> None:
    """The burst's next step: the first prompt decodes, the others have 1-3 tokens left."""
    demands = [SeqDemand(9, True, 0, seq_id=0), *prompts(0, 1, 2, 3)]
    grants = [(1, 1), (2, 2), (3, 3)]
    chunks = equal_chunks(grants, demands, {}, COSTS, 512)
    assert num_runs(demands, grants) == 3
    assert num_runs(demands, chunks) < 3
    assert chunks[0] == (1, 1)


def test_a_short_prompt_beside_a_long_one_leaves_it_its_chunk() -> None:
    """Trimmed to 17 the long prompt would lose most of its step: never more than half."""
    demands = prompts(17, 500)
    assert equal_chunks([(0, 17), (1, 500)], demands, {}, COSTS, 512) == [(0, 17), (1, 500)]


def test_the_scheduler_trims_only_with_per_slot_streams() -> None:
    demands = prompts(17, 18, 19, 20)
    per_slot = Scheduler(512, 512, 4, per_slot_streams=True, costs=COSTS).plan(demands, [])
    unified = Scheduler(512, 512, 4, per_slot_streams=False, costs=COSTS).plan(demands, [])
    assert num_runs(demands, list(per_slot.prefill)) <= 2
    assert sorted(unified.prefill) == [(0, 17), (1, 18), (2, 19), (3, 20)]
