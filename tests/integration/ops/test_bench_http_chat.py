"""bench.http_chat (the bench's HTTP mode) against the real server's OpenAI HTTP API:
a smoke test with a tiny load, not a benchmark."""

from __future__ import annotations

import asyncio

from harness.server import CHAT_SERVER_ARGS, free_port, start_server, stop_server


def test_chat_level_counts_streamed_tokens_and_usage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench import http_chat

    server = start_server(CHAT_SERVER_ARGS, tmp_path / "server.log", http_port=free_port())
    try:
        url = f"http://127.0.0.1:{server.http_port}"
        result = asyncio.run(http_chat.chat_level(url, concurrency=2, rounds=2, max_tokens=4))
    finally:
        assert stop_server(server) == 0
    summary = result.summary()
    assert result.errors == 0 and result.tokens == 16  # 2 workers x 2 requests x 4 tokens, from usage
    assert len(result.ttft_ms) == 4 and summary["tokens_per_s"] > 0 and summary["ttft_p50_ms"] > 0
    assert len(result.prompt_tokens) == 4 and summary["prompt_tokens"] > 10  # the chat template's turn markers too


def test_section_replaces_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from bench import http_chat
    from bench.embed_model import write_section

    def run(tok: float, ttft: float) -> dict[str, float]:
        return {"tokens_per_s": tok, "ttft_p50_ms": ttft, "prompt_tokens": 24.0, "errors": 0.0}

    args = argparse.Namespace(argv=[], levels=[1, 16], rounds=2, repeat=3, max_tokens=64, grpc_concurrency=16,
                              grpc_rounds=4, grpc_pairs=2)
    chat = {"llmserve": {1: [run(80, 30)] * 3, 16: [run(240, 200)] * 3},
            "llama-server": {1: [run(80, 40)] * 3, 16: [run(200, 400)] * 3}}
    grpc_runs = {"without --http-port": [run(250, 0), run(240, 0)], "with --http-port": [run(245, 0), run(245, 0)]}
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nGenerate table\n")
    for _ in range(2):
        write_section(out, http_chat.section(args, chat, grpc_runs), http_chat.BEGIN, http_chat.END)
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nGenerate table\n") and text.count(http_chat.BEGIN) == 1
    assert "| 16 | 240.0 | 200.0 | 1.20x | 200 | 400 | 0.50x | 24 / 24 | 0 |" in text
    assert "+0.0% gRPC tokens/s" in text  # 245 vs median(250, 240) = 245
