"""Greedy output equals llama-cpp-python's high-level `Llama` (an outside reference)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmserve.client import Client

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):",
    "My grandmother's favourite recipe was",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def reference_texts(model_path: Path) -> list[str]:
    from llama_cpp import Llama

    # The server's context uses flash attention (llama.cpp's "auto" turns it on
    # for the CPU); the reference must run the same attention kernel, since a
    # different kernel changes float sums and, after a dozen tokens, greedy picks.
    llm = Llama(model_path=str(model_path), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    try:
        texts = []
        for prompt in PROMPTS:
            llm.reset()  # evaluate each prompt whole: no prefix kept from the previous one
            out = llm.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0.0, repeat_penalty=1.0)
            texts.append(out["choices"][0]["text"])
        return texts
    finally:
        llm.close()


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_matches_high_level_llama(fresh_server, reference_texts, index: int) -> None:  # type: ignore[no-untyped-def]
    with Client(fresh_server.address, timeout=60) as client:
        result = client.generate(PROMPTS[index], max_tokens=MAX_TOKENS, temperature=0)
    assert result.text == reference_texts[index]
    assert result.turn_end.usage.completion_tokens <= MAX_TOKENS
