"""What the order of a burst's prompts over the sequence ids costs (issue 41 §3).

    python -m bench.split_order [--bursts 8] [--concurrency 4,8,16]

Raw llama.cpp through llama-cpp-python, the server's context shape (`-np 16 -c 16384`,
n_batch 2048, n_ubatch 512, one KV stream per slot, -t 2). Each burst: one sequence (id 0)
has prefilled a 17-token prompt and decodes one token, beside c - 1 fresh prompts of 17-20
tokens on ids 1..c-1, all in one `llama_decode`. With one stream per slot llama.cpp splits
that batch into ubatches of consecutive ids with equal tokens each (`split_equal`), each a
pass over every weight:

- `scattered`: the prompt lengths in arrival order (random);
- `by length`: the same lengths, longest on the lowest id (`GenerationStep.seat_by_length`).

Prints the median ms of the decode per setting.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import llama_cpp

from .raw_llama import decode_rows, load_default_model, server_context

SLOTS, N_CTX = 16, 16384


def _prompt(seq: int, start: int, num_tokens: int) -> list[tuple[int, int, int]]:
    return [(seq, pos, 1000 + (pos * 7 + seq) % 5000) for pos in range(start, start + num_tokens)]


def burst_ms(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch, lengths: list[int]) -> float:
    """Id 0 prefills 17 tokens, then decodes one beside a prompt of each of `lengths` on ids
    1, 2, ...: that decode's ms."""
    memory = llama_cpp.llama_get_memory(ctx)
    for seq in range(SLOTS):
        llama_cpp.llama_memory_seq_rm(memory, seq, 0, -1)
    decode_rows(ctx, batch, _prompt(0, 0, 17))
    rows = _prompt(0, 17, 1) + [row for seq, n in enumerate(lengths) for row in _prompt(seq + 1, 0, n)]
    start = time.perf_counter()
    decode_rows(ctx, batch, rows)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, default=8)
    parser.add_argument("--concurrency", default="4,8,16")
    args = parser.parse_args()
    ctx, batch = server_context(load_default_model(), SLOTS, N_CTX), llama_cpp.llama_batch_init(2048, 0, 1)
    rng = random.Random(0)
    for c in (int(x) for x in args.concurrency.split(",")):
        ms: dict[str, list[float]] = {"scattered": [], "by length": []}
        for _ in range(args.bursts):
            lengths = [rng.choice([17, 18, 19, 20]) for _ in range(c - 1)]
            ms["scattered"].append(burst_ms(ctx, batch, lengths))
            ms["by length"].append(burst_ms(ctx, batch, sorted(lengths, reverse=True)))
        print(f"c={c}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
