"""In-process engine benchmark (no gRPC): the executor driven directly, to separate
engine cost from transport cost, with a per-step profile of where host time goes.

    python -m bench.engine [--concurrency 1,4,8,16] [--max-tokens 64] [--threads 2] [--temperature 0]

For each level, `concurrency` sessions (greedy unless `--temperature`, then top_k 40 and
llama-server's other defaults; ignore_eos) start together; reported:
aggregate tokens/s, and per step: wall ms, llama_decode ms, sampling ms, and host ms
(everything else: batch filling, bookkeeping, detokenizing, event hand-off) with its
share of the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time

from llmserve.client.loadgen import PROMPTS
from llmserve.service.config import SpeculationSettings
from llmserve.service.domain.events import SessionFailed, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams, SessionParams, StoppingParams
from llmserve.service.engine.executor.executor import Executor, ExecutorConfig
from llmserve.service.engine.executor.generation_step import StepProfile
from llmserve.service.model.default_model import default_model_path
from llmserve.service.model.runner import LlamaRunner
from llmserve.service.model.runner_config import RunnerConfig


class _Sink:
    backlog = 0

    def __init__(self) -> None:
        self.done = threading.Event()

    def put(self, event: object) -> None:
        if isinstance(event, (TurnEndEvent, SessionFailed)):
            self.done.set()


def run_level(
    executor: Executor, runner: LlamaRunner, concurrency: int, max_tokens: int, temperature: float = 0.0
) -> tuple[float, dict[str, float]]:
    sampling = SamplingParams(temperature=temperature, seed=1)
    params = SessionParams("bench", sampling, StoppingParams(max_tokens=max_tokens, ignore_eos=True))
    before = dataclasses.replace(executor.profile)
    sinks = []
    start = time.perf_counter()
    for i in range(concurrency):
        sink = _Sink()
        key = executor.open_session(params, sink)
        executor.add_input(key, tuple(runner.tokenizer.tokenize(f"{PROMPTS[i % len(PROMPTS)]} ({i})", True, True)), True)
        sinks.append((key, sink))
    for key, sink in sinks:
        sink.done.wait(600)
        executor.close(key)
    elapsed = time.perf_counter() - start
    after = executor.profile
    delta = StepProfile(**{f.name: getattr(after, f.name) - getattr(before, f.name) for f in dataclasses.fields(after)})
    return concurrency * max_tokens / elapsed, delta.as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--spec-type", default=SpeculationSettings.spec_type, help="as the server's flag (none: no drafts)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    runner = LlamaRunner(RunnerConfig(default_model_path(), 16384, max(levels), 512, 512, args.threads, True))
    executor = Executor(runner, ExecutorConfig(max(levels), 16384 // max(levels), 512, 512,
                                                  speculation=SpeculationSettings(spec_type=args.spec_type)))
    executor.start()
    try:
        run_level(executor, runner, 1, 4)  # warm-up
        print("| streams | tokens/s | step ms | rows/step | generated/step | ubatches/step | decode ms | sample ms | host ms | host share |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for level in levels:
            tps, p = run_level(executor, runner, level, args.max_tokens, args.temperature)
            print(
                f"| {level} | {tps:.1f} | {p['step_ms']:.2f} | {p['tokens_per_step']:.2f} "
                f"| {level * args.max_tokens / max(p['steps'], 1):.2f} | {p['ubatches_per_step']:.2f} | {p['decode_ms']:.2f} "
                f"| {p['sample_ms']:.3f} "
                f"| {p['host_ms']:.3f} | {100 * p['host_share']:.1f}% |",
                flush=True,
            )
    finally:
        executor.stop()
        runner.close()


if __name__ == "__main__":
    main()
