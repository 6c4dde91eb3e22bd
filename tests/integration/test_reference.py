"""Greedy output equals llama-cpp-python's high-level `Llama` (an outside reference)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llmserve.client import Client

from tests.conftest import SERVER_ARGS, RunningServer, start_server, stop_server

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):",
    "My grandmother's favourite recipe was",
]


@pytest.fixture(scope="module")
def fresh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of its own, with the same flags: no prefix cached by another test.

    A cached prefix computed in another batch would be reused (the allocator's job),
    and llama.cpp's batched kernels change float sums with batch composition, which
    can flip a near-tie greedy pick (see the concurrency test).
    """
    running = start_server(SERVER_ARGS, tmp_path_factory.mktemp("fresh") / "server.log")
    yield running
    stop_server(running)
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def reference_texts(model_path: Path) -> list[str]:
    from llama_cpp import Llama

    # The server's context uses flash attention (llama.cpp's "auto" turns it on
    # for the CPU); the reference must run the same attention kernel, since a
    # different kernel changes float sums and, after a dozen tokens, greedy picks.
    llm = Llama(model_path=str(model_path), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    try:
        return [
            llm.create_completion(p, max_tokens=MAX_TOKENS, temperature=0.0, repeat_penalty=1.0)["choices"][0]["text"]
            for p in PROMPTS
        ]
    finally:
        llm.close()


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_matches_high_level_llama(fresh_server, reference_texts, index: int) -> None:  # type: ignore[no-untyped-def]
    with Client(fresh_server.address, timeout=60) as client:
        result = client.generate(PROMPTS[index], max_tokens=MAX_TOKENS, temperature=0)
    assert result.text == reference_texts[index]
    assert result.turn_end.usage.completion_tokens <= MAX_TOKENS
