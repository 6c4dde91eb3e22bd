"""LoRA adapters over gRPC: a session's `SessionConfig.adapter`, the adapters in
GetModelInfo, and LoadAdapter / UnloadAdapter / ListAdapters (translation only: the
rules are the engine's AdapterRegistry)."""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.requests import AdapterSet
from ..engine.engine import AdapterInfo, Engine


def session_adapters(engine: Engine, config: pb.SessionConfig) -> AdapterSet:
    """The adapter set `config.adapter` names (() when unset); unknown: INVALID_ARGUMENT (config.adapter)."""
    if not config.HasField("adapter"):
        return ()
    ref = config.adapter
    return engine.adapters.resolve([(ref.name, ref.scale if ref.HasField("scale") else None)])


def adapter_infos(engine: Engine) -> list[pb.AdapterInfo]:
    running = {name: num_running + num_waiting for name, num_running, num_waiting in engine.snapshot.adapter_sessions}
    return [_info(info, running.get(info.name, 0)) for info in engine.adapters.listing()]


def _info(info: AdapterInfo, num_sessions: int) -> pb.AdapterInfo:
    return pb.AdapterInfo(name=info.name, path=info.path, scale=info.scale, id=info.id, rank=info.rank,
                          size_bytes=info.size_bytes, state=info.state, num_sessions=num_sessions)


async def load_adapter(engine: Engine, request: pb.LoadAdapterRequest) -> pb.AdapterInfo:
    info = await engine.load_adapter(request.name, request.path, request.scale if request.HasField("scale") else None)
    return _info(info, 0)


async def unload_adapter(engine: Engine, request: pb.UnloadAdapterRequest) -> pb.UnloadAdapterResponse:
    return pb.UnloadAdapterResponse(freed=await engine.adapters.unload(request.name))


def list_adapters(engine: Engine) -> pb.ListAdaptersResponse:
    return pb.ListAdaptersResponse(adapters=adapter_infos(engine), max_loras=engine.adapters.max_loras)
