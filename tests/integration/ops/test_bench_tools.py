"""The benchmark tools run against the real server (tiny loads: a smoke test, not a benchmark)."""

from __future__ import annotations

import asyncio

from llmserve.client import loadgen


def test_loadgen_generate_and_embed(server) -> None:  # type: ignore[no-untyped-def]
    result = asyncio.run(loadgen.llmserve_level(server.address, concurrency=2, rounds=1, max_tokens=4))
    summary = result.summary()
    assert result.tokens == 8 and result.errors == 0
    assert summary["tokens_per_s"] > 0 and summary["ttft_p50_ms"] > 0 and summary["itl_p50_ms"] > 0
    texts_per_s, tokens_per_s = asyncio.run(loadgen.llmserve_embed(server.address, loadgen.CORPUS[:40]))
    assert texts_per_s > 0 and tokens_per_s > 20 * texts_per_s  # ~25-token texts


def test_embed_model_report_section_replaces_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench import embed_model

    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nGenerate table\n")
    results = {name: {"llmserve": [120.0, 100.0, 110.0], "llama-server": [50.0, 55.0, 60.0]} for name in embed_model.CORPORA}
    embed_model.write_section(out, embed_model.section(results, 3))
    embed_model.write_section(out, embed_model.section(results, 3))
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nGenerate table\n")
    assert text.count(embed_model.BEGIN) == 1 and "| 110.0 | 55.0 | 2.00x |" in text
