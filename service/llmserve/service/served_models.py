"""The generative models one process serves (model_settings.py): the default model's
engine, and one engine per further `--model NAME=PATH`, each with its own context,
executor thread, slots, session gate and admission; a surface picks one by the name a
call gives (HTTP `model`, gRPC `SessionConfig.model`, `GetModelInfoRequest.model`, ...)
and holds it for the call (`held`): a model is never unloaded under a call.

Residency: without `--models-max` every model loads at start-up and stays. With it, at
most that many models are resident, the default one always; a further model loads when
a call first names it, and to make room the least recently used *idle* one (no call
holds it or waits for it, no session is open on it) is unloaded: a model loaded for the
calls waiting on it is not unloaded before they run (without that two models each wanted
by waiting calls unloaded each other as each loaded, and no call ran). A call for a model that is loading, or
that waits for room, waits up to `--models-load-timeout` seconds, then `Overloaded` (429 /
RESOURCE_EXHAUSTED with a retry hint). A model file llama.cpp cannot load: the call gets
`PreconditionFailed` naming it; the server goes on serving the others.

A further model whose GGUF declares a pooling (an embedding model: BERT, all-MiniLM-L6-v2, ...)
serves embeddings only (Embed, /v1/embeddings), on an executor of its own with no generation
context; a generation call naming it is refused (`PreconditionFailed` naming its field), as is
an embedding call naming a further generative model: of the generative models only the
default one embeds (--embeddings), and only it serves LoRA adapters and --store-kv. Each
model's named sessions live under `--session-dir/models/NAME`; stored responses are kept
once, with the default model's. Each further model records into its own metrics registry, shown on
/metrics with a `model_name` label (metrics.py `Metrics.add_model`). Event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Literal

import structlog

from .config import AdapterSettings, ServerConfig
from .domain.errors import FieldRef, Overloaded, PreconditionFailed
from .engine.engine import Engine
from .metrics import Metrics
from .model_settings import ModelSettings, NamedModel

log = structlog.get_logger("llmserve.models")

ROOM_POLL_S = 0.05  # how often a load waiting for room looks for an idle model again
Purpose = Literal["any", "generation", "embeddings"]  # what a call asks of the model it names


def model_config(config: ServerConfig, model: NamedModel) -> ServerConfig:
    """A further model's settings: the server's, with its file, name and shape (-c, -np, when
    it has its own), and no embeddings, adapters or stored KV (the default model's)."""
    session_dir = config.session_dir / "models" / model.name if config.session_dir is not None else None
    return replace(config, model_path=model.path, alias=model.name, models=ModelSettings(), embeddings=False,
                   embedding_model_path=None, adapters=AdapterSettings(), session_dir=session_dir, store_kv=False,
                   **model.shape(config.n_ctx, config.n_parallel))


@dataclass
class _Resident:
    engine: Engine
    num_holds: int = 0  # calls holding it (`held`)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def idle(self) -> bool:
        return self.num_holds == 0 and self.engine.session_gate.num_open == 0


class ServedModels:
    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._specs = {model.name: model for model in config.models.extra}
        self._resident: dict[str, _Resident] = {}  # the further models loaded, by name
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._num_waiting: collections.Counter[str] = collections.Counter()  # calls waiting for each model
        self._room = asyncio.Lock()  # one load (and its unloads) at a time
        self._default: Engine | None = None

    @property
    def max_resident(self) -> int:
        """Models resident at once, the default one included."""
        return self.config.models.models_max or 1 + len(self._specs)

    async def start(self, default: Engine) -> None:
        """The default model serves; without --models-max every further model loads now
        (RuntimeError when one cannot)."""
        self._default = default
        if self.config.models.models_max is None:
            for name in self._specs:
                await self._load(name)

    def names(self) -> list[str]:
        """Every model's name, the default first (None: not yet serving)."""
        return [self._default.model_name, *self._specs] if self._default is not None else []

    def others(self) -> list[Engine]:
        """The further models resident now."""
        return [resident.engine for resident in self._resident.values()]

    def spec(self, name: str) -> NamedModel:
        return self._specs[name]

    def state(self, name: str) -> str:
        """A further model's residency, as llama-server's router lists it: loaded, loading, unloaded."""
        return "loaded" if name in self._resident else "loading" if name in self._loading else "unloaded"

    @asynccontextmanager
    async def held(self, default: Engine, name: str | None, field: FieldRef = "model",
                   purpose: Purpose = "any") -> AsyncIterator[Engine]:
        """The engine of the model `name` names, resident and held for the block: a further
        model's (loaded now if it is not), else `default` (its own names, adapters, 404s).
        A further model that does not serve the call's `purpose` is refused naming `field`."""
        if not name or name not in self._specs:
            yield default
            return
        self._num_waiting[name] += 1  # a model loaded for waiting calls stays until they hold it
        try:
            resident = await self._resident_now(name, field)
        finally:
            self._num_waiting[name] -= 1
        _check_serves(resident.engine, name, purpose, field)
        resident.num_holds += 1
        try:
            yield resident.engine
        finally:
            resident.num_holds -= 1
            resident.last_used = time.monotonic()

    async def _resident_now(self, name: str, field: FieldRef) -> _Resident:
        timeout_s = self.config.models.models_load_timeout_s
        while (resident := self._resident.get(name)) is None:
            task = self._loading.get(name)
            if task is None:
                task = self._loading[name] = asyncio.create_task(self._load(name))
                task.add_done_callback(lambda _: self._loading.pop(name, None))
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                raise Overloaded(f"the model {name!r} is still loading, or waits for an idle model to unload "
                                 f"(--models-max {self.max_resident}); retry later", retry_after_s=1.0) from None
            except RuntimeError as exc:
                raise PreconditionFailed(f"the model {name!r} cannot load: {exc}", field) from None
        return resident

    async def _load(self, name: str) -> None:
        async with self._room:
            while 1 + len(self._resident) >= self.max_resident:
                await self._unload_one()
            default = self._default
            assert default is not None
            metrics = self.metrics.models.get(name) or Metrics()
            started = time.monotonic()
            engine = await asyncio.to_thread(Engine, model_config(self.config, self._specs[name]), metrics,
                                             default.conversations)
            engine.start()
            metrics.describe_model(engine.meta, engine.config.n_ctx, engine.config.n_parallel, engine.version)
            self.metrics.add_model(name, metrics)
            self._resident[name] = _Resident(engine)
            log.info("served_model_loaded", model=name, seconds=round(time.monotonic() - started, 3))

    async def _unload_one(self) -> None:
        """Unload the least recently used idle further model, waiting until one is idle."""
        while not (idle := [(r.last_used, name) for name, r in self._resident.items()
                            if r.idle and not self._num_waiting[name]]):
            await asyncio.sleep(ROOM_POLL_S)
        _, name = min(idle)
        engine = self._resident.pop(name).engine  # first: no new call, nor the watchdog, finds it
        await asyncio.to_thread(engine.stop)
        gc.collect()  # its sessions' cycles, before the model's memory goes back to the system (close)
        await asyncio.to_thread(engine.close)
        log.info("served_model_unloaded", model=name, reason="lru")

    async def stop(self) -> None:
        """At shutdown: loads given up, every further model's executor stopped (open sessions
        fail as the default model's do)."""
        for task in list(self._loading.values()):
            task.cancel()
        for engine in self.others():
            await asyncio.to_thread(engine.stop)

    async def close(self) -> None:
        """After `stop` and the surfaces: every further model freed."""
        for name in list(self._resident):
            await asyncio.to_thread(self._resident.pop(name).engine.close)


def _check_serves(engine: Engine, name: str, purpose: Purpose, field: FieldRef) -> None:
    if purpose == "generation" and not engine.generates:
        raise PreconditionFailed(f"the model {name!r} is an embedding model: it serves embeddings only "
                                 "(Embed, /v1/embeddings)", field)
    if purpose == "embeddings" and engine.embedding_model is None:
        raise PreconditionFailed(f"the model {name!r} does not serve embeddings: of the generative models only the "
                                 "default one embeds (--embeddings); serve an embedding model with -m NAME=PATH", field)
