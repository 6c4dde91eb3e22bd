"""The benchmark tools run against the real server (tiny loads: a smoke test, not a benchmark)."""

from __future__ import annotations

import asyncio

from bench import loadgen


def test_loadgen_generate_and_embed(server) -> None:  # type: ignore[no-untyped-def]
    result = asyncio.run(loadgen.llmserve_level(server.address, concurrency=2, rounds=1, max_tokens=4))
    summary = result.summary()
    assert result.tokens == 8 and result.errors == 0
    assert summary["tokens_per_s"] > 0 and summary["ttft_p50_ms"] > 0 and summary["itl_p50_ms"] > 0
    texts_per_s, tokens_per_s = asyncio.run(loadgen.llmserve_embed(server.address, loadgen.CORPUS[:40]))
    assert texts_per_s > 0 and tokens_per_s > 20 * texts_per_s  # ~25-token texts
