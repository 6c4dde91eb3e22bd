"""Greedy output agrees with llama-cpp-python's high-level `Llama` (an outside reference).

Not as text: the reference is another context (512 cells, one sequence) than the server's
(8 per-slot KV streams), and llama.cpp's kernels round differently with the KV layout,
batch shape and CPU, so two correct greedy replies may part at a near tie
(tests/greedy.py). The reference's logprobs come from the logits of the same evaluation
that `Llama.create_completion` samples from (`Llama.eval`, then the last row), argmax by
hand. On this AVX2 machine the server's reply and the reference's agreed to the digit
(0.0 nats apart over 3 x 32 tokens).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llmserve.client import Client, pb

from tests.greedy import parting

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):",
    "My grandmother's favourite recipe was",
]
MAX_TOKENS = 32
TOP = 4


def _token_logprob(logits: np.ndarray) -> pb.TokenLogprob:
    shifted = logits.astype(np.float64) - float(logits.max())
    logprobs = shifted - np.log(np.exp(shifted).sum())
    top = [int(t) for t in np.argsort(-logprobs, kind="stable")[:TOP]]
    return pb.TokenLogprob(
        token_id=top[0], logprob=float(logprobs[top[0]]),
        top=[pb.TopLogprob(token_id=t, logprob=float(logprobs[t])) for t in top],
    )


@pytest.fixture(scope="module")
def reference_replies(model_path: Path) -> list[list[pb.TokenLogprob]]:
    """Each prompt's greedy reply by the high-level `Llama`: MAX_TOKENS tokens, EOS ignored."""
    import llama_cpp
    from llama_cpp import Llama

    # The server's context uses flash attention (llama.cpp's "auto" turns it on for the
    # CPU); the reference runs the same attention kernel, or the logprobs move further.
    llm = Llama(model_path=str(model_path), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    try:
        replies = []
        for prompt in PROMPTS:
            llm.reset()  # evaluate each prompt whole: no prefix kept from the previous one
            llm.eval(llm.tokenize(prompt.encode()))
            reply: list[pb.TokenLogprob] = []
            for _ in range(MAX_TOKENS):
                # llama-cpp-python 0.3.36 fills `Llama.scores` only with logits_all; without
                # it the context holds the last row, which is what its sampler reads.
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
                reply.append(_token_logprob(logits))
                llm.eval([reply[-1].token_id])
            replies.append(reply)
        return replies
    finally:
        llm.close()


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_matches_high_level_llama(fresh_server, reference_replies, index: int) -> None:  # type: ignore[no-untyped-def]
    with Client(fresh_server.address, timeout=60) as client:
        result = client.generate(PROMPTS[index], max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, top_logprobs=TOP)
    reference = reference_replies[index]
    assert len(result.logprobs) == len(result.token_ids) == MAX_TOKENS
    parted = parting(reference, result.logprobs)
    pairs = zip(reference[:parted], result.logprobs[:parted])
    worst = max((abs(a.logprob - b.logprob) for a, b in pairs), default=0.0)
    print(f"parted at {parted}; largest logprob difference before {worst:.4f} nats")
