"""model/ubatches.py mirrors llama.cpp's split of a batch into ubatches."""

from __future__ import annotations

from llmserve.service.model.ubatches import num_ubatches


def test_per_slot_streams_split_by_runs_of_consecutive_ids() -> None:
    assert num_ubatches([(0, 1), (1, 1), (2, 1), (3, 1)], 512, True) == 1
    assert num_ubatches([(0, 1), (2, 1), (5, 1), (6, 1)], 512, True) == 3  # runs {0}, {2}, {5, 6}
    assert num_ubatches([(0, 1), (1, 1), (2, 1), (3, 1), (4, 200)], 512, True) == 2  # then the prompt alone
    assert num_ubatches([(3, 1), (4, 1), (0, 1)], 512, True) == 2  # batch order counts: 0 after 4 starts anew
    assert num_ubatches([(0, 600)], 512, True) == 2
    assert num_ubatches([(i, 1) for i in range(8)], 4, True) == 2  # at most n_ubatch tokens per ubatch


def test_a_unified_cache_splits_by_tokens() -> None:
    assert num_ubatches([(0, 1), (5, 1), (9, 300)], 512, False) == 1
    assert num_ubatches([(0, 400), (5, 400)], 512, False) == 2
