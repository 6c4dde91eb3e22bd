"""Draft lengths (engine/executor/draft_pricing.py) by what a step of so many rows costs the llama.cpp
runner on the CPU (model/step_costs.py)."""

from llmserve.service.engine.executor.draft_pricing import best_draft_length
from llmserve.service.model.step_costs import LLAMA_CPU_COSTS, step_cost


def test_rows_past_a_multiple_of_four_cost_more_than_the_next_four() -> None:
    # llama-batched-bench here: 8 rows 50-67 ms, 6 rows 52-64, 5 rows 46-56, 4 rows 33-36.
    assert step_cost(8) < step_cost(6) < step_cost(7) and step_cost(16) < step_cost(15) < step_cost(17)
    assert [step_cost(n) for n in (1, 4, 8, 12, 16, 32)] == sorted(step_cost(n) for n in (1, 4, 8, 12, 16, 32))


def test_a_lone_stream_drafts_to_a_multiple_of_four_rows() -> None:
    lengths = [best_draft_length(LLAMA_CPU_COSTS, a / 100, 16) for a in range(0, 100)]
    assert all((1 + k) % 4 == 0 for k in lengths if k), lengths
    assert lengths == sorted(lengths)  # never shorter for better odds
    assert best_draft_length(LLAMA_CPU_COSTS, 0.5, 16) == 0  # a 1-token draft at even odds would double the step
    assert best_draft_length(LLAMA_CPU_COSTS, 0.99, 16) == 15  # 16 rows, not 17 (a gemv more for one token)
    assert best_draft_length(LLAMA_CPU_COSTS, 0.99, 6) == 3  # 5 to 7 rows cost more a token than 4
