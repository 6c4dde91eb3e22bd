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
from llmserve.service.model.default_model import default_model_path

SLOTS, N_CTX, N_BATCH = 16, 16384, 2048


def _context() -> tuple[llama_cpp.llama_context_p, llama_cpp.llama_batch]:
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(default_model_path()).encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = N_CTX, N_BATCH, 512, SLOTS
    params.n_threads = params.n_threads_batch = 2
    params.kv_unified = False
    return llama_cpp.llama_init_from_model(model, params), llama_cpp.llama_batch_init(N_BATCH, 0, 1)


def _decode(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch, rows: list[tuple[int, int, int]]) -> float:
    """`rows`: (sequence id, first position, tokens), logits on each row's last token; ms."""
    n = 0
    for seq, start, num_tokens in rows:
        for pos in range(start, start + num_tokens):
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = 1000 + (pos * 7 + seq) % 5000, pos, 1
            batch.seq_id[n][0], batch.logits[n] = seq, pos == start + num_tokens - 1
            n += 1
    batch.n_tokens = n
    t0 = time.perf_counter()
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    return (time.perf_counter() - t0) * 1000


def burst_ms(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch, lengths: list[int]) -> float:
    memory = llama_cpp.llama_get_memory(ctx)
    for seq in range(SLOTS):
        llama_cpp.llama_memory_seq_rm(memory, seq, 0, -1)
    _decode(ctx, batch, [(0, 0, 17)])
    return _decode(ctx, batch, [(0, 17, 1), *((seq + 1, 0, n) for seq, n in enumerate(lengths))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, default=8)
    parser.add_argument("--concurrency", default="4,8,16")
    args = parser.parse_args()
    ctx, batch = _context()
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
