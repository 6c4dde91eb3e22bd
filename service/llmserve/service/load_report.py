"""A replica's load report in ORCA's format (Open Request Cost Aggregation), built once for
every transport: the gRPC server streams it and puts it in call trailers
(transport/orca.py); the OpenAI HTTP surface puts it in a response header (http/).

A report carries `application_utilization` (domain/load.py defines it; averaged over the
last UTILIZATION_WINDOW_S, or the current value when higher, so a jump shows at once;
at least MIN_UTILIZATION), `rps_fractional` (calls started on either surface per second
over the last RATE_WINDOW_S, at least MIN_RPS) and `named_metrics`, as they are now:
kv_cache_usage, running_sessions, waiting_sessions, prefill_tokens_waiting, slot_wait_s;
with further models (served_models.py) the default model's, and each further resident
model's running and waiting sessions and KV use as `model.<NAME>.<metric>` (the
utilization and call rate stay the default model's).
While the model loads there is no load to report: the reports are empty, which weighted
round robin reads as "no weight yet" (health checks keep the replica out of rotation
meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from .engine.engine import Engine
from .metrics import Metrics

TRAILER = "endpoint-load-metrics-bin"  # gRPC trailer and HTTP header (base64 there) alike
UTILIZATION_WINDOW_S = 5.0
# Longer: a replica whose callers all waited elsewhere for a few seconds still reports a
# call rate (0 reads as "no weight"; measured: the busy one then got 5 of 24 new calls).
RATE_WINDOW_S = 30.0
SAMPLE_S = 0.1
# Floors: weighted round robin reads a utilization or a call rate of 0 as "no weight yet"
# and gives the replica the median weight, so an idle replica (or one whose calls all
# ended between samples) would get no more calls than a saturated one (measured: 4-5 of
# 24 went to the busy one; in bench.routing the first burst went round robin). With
# both floors an idle replica weighs MIN_RPS / MIN_UTILIZATION, above any busy one.
MIN_UTILIZATION = 0.001  # a tenth of one session on a default replica (4 slots + 64 waiting)
MIN_RPS = 1 / RATE_WINDOW_S  # one call per window


class Window:
    """Values added over the last `window_s` seconds, in 1-second buckets."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.t_start = clock()
        self.buckets: deque[list[float]] = deque()  # [second, sum, count]

    def add(self, value: float = 1.0) -> None:
        second = int(self.clock())
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += value
            self.buckets[-1][2] += 1
        else:
            self.buckets.append([second, value, 1])
        self._expire(second)

    def per_second(self) -> float:
        """The sum per second (a young window: over its life so far)."""
        now = self.clock()
        self._expire(int(now))
        return sum(b[1] for b in self.buckets) / min(self.window_s, max(now - self.t_start, 1.0))

    def mean(self) -> float:
        self._expire(int(self.clock()))
        count = sum(b[2] for b in self.buckets)
        return sum(b[1] for b in self.buckets) / count if count else 0.0

    def _expire(self, second: int) -> None:
        while self.buckets and self.buckets[0][0] <= second - self.window_s:
            self.buckets.popleft()


class LoadReporter:
    """Builds ORCA reports from the engine's load; `engine()` is None while loading.

    Weighted round robin weights a replica by rps / utilization: calls served per
    slot-second (Little's law), the replica's capacity, which falls as its calls queue
    or slow down. An instantaneous utilization would read 0 between short calls (no
    weight at all), so it is sampled every SAMPLE_S and averaged."""

    def __init__(self, engine: Callable[[], Engine | None], metrics: Metrics,
                 others: Callable[[], list[Engine]] = list) -> None:
        """On the server's event loop: samples from now on (into Prometheus too). `others()`:
        the further models resident now."""
        self.engine = engine
        self.others = others
        self.metrics = metrics
        self.rate = Window(RATE_WINDOW_S)
        self.utilization = Window(UTILIZATION_WINDOW_S)
        self._sampler = asyncio.get_running_loop().create_task(self._sample())

    def call_started(self) -> None:
        self.rate.add()

    def report(self) -> OrcaLoadReport:
        engine = self.engine()
        if engine is None:
            return OrcaLoadReport()
        load, rps = engine.load, self.rate.per_second()
        utilization = max(self.utilization.mean(), load.utilization)
        named = {
            "kv_cache_usage": load.kv_cache_usage,
            "running_sessions": float(load.running_sessions),
            "waiting_sessions": float(load.waiting_sessions),
            "prefill_tokens_waiting": float(load.prefill_tokens_waiting),
            "slot_wait_s": load.slot_wait_s,
        }
        for other in self.others():
            other_load = other.load
            named |= {f"model.{other.model_name}.running_sessions": float(other_load.running_sessions),
                      f"model.{other.model_name}.waiting_sessions": float(other_load.waiting_sessions),
                      f"model.{other.model_name}.kv_cache_usage": other_load.kv_cache_usage}
        return OrcaLoadReport(application_utilization=max(utilization, MIN_UTILIZATION),
                              rps_fractional=max(rps, MIN_RPS), named_metrics=named)

    async def _sample(self) -> None:
        while True:
            engine = self.engine()
            if engine is not None:
                load = engine.load
                self.utilization.add(load.utilization)
                self.metrics.utilization.set(load.utilization)
                self.metrics.slot_wait.set(load.slot_wait_s)
            await asyncio.sleep(SAMPLE_S)
