"""The generative models one process serves (model_settings.py): the default model's
engine, and one engine per further `--model NAME=PATH`, each with its own context,
executor thread, slots, session gate and admission; a surface picks one by the name a
call gives (HTTP `model`, gRPC `SessionConfig.model`, `GetModelInfoRequest.model`, ...).

Every model is loaded at start-up, one after another, off the event loop; all of them
stay resident. Only the default model serves Embed, LoRA adapters and --store-kv; each
model's named sessions and stored responses live under `--session-dir/models/NAME`.
Each further model's executor records into its own metrics registry, which the metrics
endpoint shows with a `model` label (metrics.py `Metrics.add_model`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from .config import AdapterSettings, ServerConfig
from .engine.engine import Engine
from .metrics import Metrics
from .model_settings import ModelSettings, NamedModel


def model_config(config: ServerConfig, model: NamedModel) -> ServerConfig:
    """A further model's settings: the server's, with its file and name, and no embeddings,
    adapters or stored KV (the default model's)."""
    session_dir = config.session_dir / "models" / model.name if config.session_dir is not None else None
    return replace(config, model_path=model.path, alias=model.name, models=ModelSettings(), embeddings=False,
                   embedding_model_path=None, adapters=AdapterSettings(), session_dir=session_dir, store_kv=False)


class ServedModels:
    """Name -> engine, set once every model has loaded (`load`)."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._others: dict[str, Engine] = {}  # the further models, by name

    async def load_others(self, default: Engine) -> list[Engine]:
        """The further models' engines, loaded one after another off the event loop (started
        and routed to once `publish` is called); stored responses are kept with the default
        model's, so that one id finds them whichever model answered. RuntimeError when one
        cannot load."""
        loaded: list[Engine] = []
        for model in self.config.models.extra:
            metrics = Metrics()
            engine = await asyncio.to_thread(Engine, model_config(self.config, model), metrics, default.conversations)
            self.metrics.add_model(model.name, metrics)
            loaded.append(engine)
        return loaded

    def publish(self, engines: list[Engine]) -> None:
        """Route calls to these engines from now on (their executors started)."""
        self._others = {engine.model_name: engine for engine in engines}

    def engine_for(self, name: str | None) -> Engine | None:
        """The further model called `name`; None for the default model's names, adapters
        and names nothing serves (the default engine answers those)."""
        return self._others.get(name) if name else None

    def others(self) -> list[Engine]:
        return list(self._others.values())
