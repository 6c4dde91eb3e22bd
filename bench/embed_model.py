"""Embed with a real embedding model: llmserve `--embedding-model` vs llama-server
`--embeddings`, both on the all-MiniLM-L6-v2 GGUF that `make embed-model` converts.

    python -m bench.embed_model [--llama-server PATH] [--repeat 3] [--out docs/benchmarks.md]

The load is the same as the Embed row of `make bench` (llmserve.client.loadgen): llmserve gets
one Embed stream with 32 texts per message, llama-server `/embedding` with 32 texts per
request and 4 requests in flight; both warm up first. Two corpora of 256 texts: short
(~25 tokens) and passages (~120 tokens). The servers run one at a time, alternately,
`--repeat` times; the table holds medians. Writes its section into `--out` between the
markers below (bench.run writes the whole file, this section included).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from pathlib import Path

from llmserve.client import loadgen

from tools.embedding_model import convert

from .servers import CTX, DEFAULT_BUILD, NP, ROOT, THREADS, start_llama_server, start_llmserve, stop

BEGIN, END = "<!-- embedding-model -->", "<!-- /embedding-model -->"
PASSAGES = [
    f"Passage {i}. " + " ".join(
        f"The {w} committee reviewed item {i * 7 + k}, noting that shipping costs, supplier delays and "
        f"seasonal demand shaped the {w} quarter's results."
        for k in range(4)
    )
    for i, w in enumerate(["northern", "southern", "eastern", "western"] * 64)
]
CORPORA = {"short (~25 tokens)": loadgen.CORPUS, "passages (~120 tokens)": PASSAGES}


def measure(llama_server: Path, repeat: int) -> dict[str, dict[str, list[float]]]:
    """texts/s per corpus and server, one figure per repetition."""
    model = convert()
    logs = Path("/tmp/llmserve-bench")
    logs.mkdir(exist_ok=True)
    results: dict[str, dict[str, list[float]]] = {name: {"llmserve": [], "llama-server": []} for name in CORPORA}
    for _ in range(repeat):
        process, address = start_llmserve(logs / "llmserve-minilm.log", ("--embedding-model", str(model)))
        try:
            for name, texts in CORPORA.items():
                results[name]["llmserve"].append(asyncio.run(loadgen.llmserve_embed(address, texts))[0])
        finally:
            stop(process)
        if llama_server.exists():
            process, url = start_llama_server(llama_server, model, logs / "llama-server-minilm.log", True)
            try:
                for name, texts in CORPORA.items():
                    results[name]["llama-server"].append(asyncio.run(loadgen.peer_embed(url, texts))[0])
            finally:
                stop(process)
    return results


def section(results: dict[str, dict[str, list[float]]], repeat: int) -> str:
    rows = ["| corpus | llmserve texts/s | llama-server texts/s | ratio | runs (llmserve / llama-server) |",
            "|---|---|---|---|---|"]
    for name, by_server in results.items():
        ours, peer = by_server["llmserve"], by_server["llama-server"]
        o = statistics.median(ours)
        p = statistics.median(peer) if peer else float("nan")
        runs = f"{', '.join(f'{x:.0f}' for x in ours)} / {', '.join(f'{x:.0f}' for x in peer)}"
        rows.append(f"| {name} | {o:.1f} | {p:.1f} | {o / p:.2f}x | {runs} |")
    return f"""{BEGIN}
## Embed with all-MiniLM-L6-v2 (`python -m bench.embed_model --repeat {repeat}`)

Both servers on the same GGUF (`make embed-model`: f16, 22.6M parameters, mean pooling):
llmserve `--embedding-model` (beside gemma-3-270m for Generate, as `make serve` runs it),
llama-server `--embeddings --pooling mean`; {NP} slots, {CTX} context, {THREADS} threads, ubatch 512.
256 texts per corpus; medians of {repeat} runs, servers alternately.

{chr(10).join(rows)}
{END}"""


def write_section(out: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the section between `begin` and `end` in `out` (or append it); `text`
    carries the markers."""
    current = out.read_text() if out.exists() else ""
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + text + rest.split(end, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    out.write_text(current)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", DEFAULT_BUILD / "llama-server")))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    text = section(measure(args.llama_server, args.repeat), args.repeat)
    write_section(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
