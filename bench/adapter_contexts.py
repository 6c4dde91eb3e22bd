"""What an adapter switch costs, and what a context per adapter set would save (issue 43).

    python -m bench.adapter_contexts [--steps 64] [--streams 4] [--slots 16] [--ctx 16384]

Raw llama.cpp through llama-cpp-python, the server's context shape (`-np`, `-c`, n_batch
2048, n_ubatch 512, one KV stream per slot, -t 2), two of bench.adapters' rank-8 adapters.
Each setting decodes `--streams` sequences one token each per step (after a 32-token
prompt each) and reports ms per step:

- `one set`: one context, adapter A all along (what S_TG measures);
- `switching`: one context, A and B alternating every step (llmserve's rotation of two
  groups: `llama_set_adapters_lora` changes the set, so llama.cpp reserves its graphs
  again on the next decode);
- `two contexts`: one context under A and one under B on the same model, alternating
  steps (the sets never change, so nothing is reserved again); also the resident memory
  the second context adds.

The pinned llama.cpp applies every adapter of a context to every row of a decode
(`llm_graph_context::build_lora_mm` in src/llama-graph.cpp: no per-row or per-sequence
selection), so two adapter sets cannot share one decode; these are the two ways left.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import time

import llama_cpp
from llmserve.service.model.default_model import cache_dir, default_model_path

from tools.make_adapters import make_all

from .adapters import BENCH_ADAPTERS
from .raw_llama import decode_rows, load_default_model, server_context

PROMPT_TOKENS = 32


def _use(ctx: llama_cpp.llama_context_p, adapter: llama_cpp.llama_adapter_lora_p) -> None:
    handles = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
    llama_cpp.llama_set_adapters_lora(ctx, handles, 1, (ctypes.c_float * 1)(1.0))


def _timed_steps(plan: list[tuple[llama_cpp.llama_context_p, llama_cpp.llama_adapter_lora_p]], steps: int,
                 streams: int, batch: llama_cpp.llama_batch) -> float:
    """Median ms per step of `steps` one-token steps, cycling through (context, adapter)."""
    times = []
    positions = {id(ctx): PROMPT_TOKENS for ctx, _ in plan}
    for step in range(steps):
        ctx, adapter = plan[step % len(plan)]
        pos = positions[id(ctx)]
        positions[id(ctx)] += 1
        start = time.perf_counter()
        _use(ctx, adapter)
        decode_rows(ctx, batch, [(s, pos, 1000 + s) for s in range(streams)])
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _prefill(ctx: llama_cpp.llama_context_p, adapter: llama_cpp.llama_adapter_lora_p, streams: int,
             batch: llama_cpp.llama_batch) -> None:
    _use(ctx, adapter)
    decode_rows(ctx, batch, [(s, p, 2 if p == 0 else 300 + p + s) for s in range(streams) for p in range(PROMPT_TOKENS)])


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=16384)
    args = parser.parse_args()
    files = list(make_all(cache_dir() / "bench-adapters", default_model_path(), BENCH_ADAPTERS).values())
    model = load_default_model()
    a, b = (llama_cpp.llama_adapter_lora_init(model, str(path).encode()) for path in files[1:3])  # rank 8 both
    batch = llama_cpp.llama_batch_init(2048, 0, 1)
    first = server_context(model, args.slots, args.ctx)
    _prefill(first, a, args.streams, batch)
    rss_one = _rss_mib()
    second = server_context(model, args.slots, args.ctx)
    _prefill(second, b, args.streams, batch)
    rss_two = _rss_mib()
    rows = {}
    for _round in range(3):  # settings interleaved: the machine's noise falls on each
        for name, plan in (("one set", [(first, a)]), ("switching", [(first, a), (first, b)]),
                           ("two contexts", [(first, a), (second, b)])):
            # each round from fresh KV positions: clear the decoded tokens beyond the prompts
            for ctx in (first, second):
                for s in range(args.streams):
                    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), s, PROMPT_TOKENS, -1)
            rows.setdefault(name, []).append(_timed_steps(plan, args.steps, args.streams, batch))
    for name, values in rows.items():
        print(f"{name}: {statistics.median(values):.1f} ms per {args.streams}-row step "
              f"(rounds: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"resident memory: {rss_one:.0f} MiB with one context, {rss_two:.0f} MiB with two "
          f"(-np {args.slots} -c {args.ctx})")
    llama_cpp.llama_batch_free(batch)
    for ctx in (first, second):
        llama_cpp.llama_free(ctx)


if __name__ == "__main__":
    main()
