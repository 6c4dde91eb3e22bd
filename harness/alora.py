"""The test aLoRA (docs/adapters.md, "Activated LoRA"): tools/make_adapters.py's `strong`
weights as an aLoRA invoked by the tokens `invoke` has when it follows `text`, made once per
machine under the test adapters' directory and loaded at run time on a server that allows it
(`--adapter-dir` that directory, `--allow-adapter-updates`). Used by the aLoRA tests and
bench.alora."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmserve.client import pb
from llmserve.service.model.default_model import cache_dir, default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tools.make_adapters import ADAPTERS, make_all


def adapter_dir() -> Path:
    """The test adapters (tools/make_adapters.py's ADAPTERS), made once per machine."""
    directory = cache_dir() / "test-adapters"
    make_all(directory, default_model_path(), ADAPTERS)
    return directory


def load_test_alora(stub: pb_grpc.LLMServiceStub, text: str, invoke: str, name: str = "act") -> Path:
    """Make (once) and load the test aLoRA as `name`; returns its file."""
    head = list(stub.Tokenize(pb.TokenizeRequest(text=text)).ids)
    whole = list(stub.Tokenize(pb.TokenizeRequest(text=text + invoke)).ids)
    assert whole[: len(head)] == head and len(whole) > len(head), "the invocation's tokens change the text's"
    invocation = tuple(whole[len(head):])
    strong = next(spec for spec in ADAPTERS if spec.name == "strong")
    spec = replace(strong, name=f"act-{'-'.join(map(str, invocation))}", invocation_tokens=invocation)
    path = make_all(adapter_dir(), default_model_path(), (spec,))[spec.name]
    stub.LoadAdapter(pb.LoadAdapterRequest(name=name, path=path.name), timeout=60)
    return path
