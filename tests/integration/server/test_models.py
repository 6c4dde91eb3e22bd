"""Several models behind one endpoint (`-m NAME=PATH`, repeatable; docs/adapters.md): the
default model and a Q8_0 requantization of it (tools/requantize.py) on one real server,
each with its own executor and slots, picked per call over HTTP and gRPC."""

from __future__ import annotations

import base64
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
from llmserve.client import pb, session_config
from llmserve.service.model.default_model import default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from harness.metrics import scrape
from harness.models import OTHER_MODEL as OTHER
from harness.models import other_model_path
from harness.server import RunningServer, free_port, serving

TOKENS = 12


@pytest.fixture(scope="module")
def other_model() -> Path:
    """The second model, made once per machine (a few seconds)."""
    return other_model_path()


@pytest.fixture(scope="module")
def server(other_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ["-m", str(default_model_path()), "-m", f"{OTHER}={other_model},c=1536,np=3", "-np", "2", "-c", "2048", "-t", "2",
             "--session-dir", str(tmp_path_factory.mktemp("model-sessions"))]
    with serving(flags, tmp_path_factory.mktemp("models") / "server.log", http_port=free_port(),
                 metrics=True) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.LLMServiceStub:
    return pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))


def _url(server: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def _turns(server: RunningServer, model: str | None) -> float:
    """Turns the model's executor ended (the default model's samples carry no model_name)."""
    page = scrape(server.metrics_port)
    if model is None:
        return sum(v for (n, labels), v in page.samples.items()
                   if n == "llmserve_turns_total" and "model_name" not in dict(labels))
    return page.total("llmserve_turns_total", model_name=model)


def _text(stub: pb_grpc.LLMServiceStub, model: str = "", prompt: str = "The capital of France is") -> pb.GenerateTextResponse:
    config = session_config(max_tokens=TOKENS, temperature=0, ignore_eos=True, model=model)
    return stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text=prompt)), timeout=120)


def test_models_lists_both_and_model_info_tells_them_apart(server: RunningServer, stub: pb_grpc.LLMServiceStub,
                                                            other_model: Path) -> None:
    ids = [entry["id"] for entry in requests.get(_url(server, "/v1/models"), timeout=10).json()["data"]]
    assert OTHER in ids and ids[0] != OTHER  # the default model first
    default, other = stub.GetModelInfo(pb.GetModelInfoRequest()), stub.GetModelInfo(pb.GetModelInfoRequest(model=OTHER))
    assert Path(other.path) == other_model and Path(default.path) == default_model_path()
    assert (other.n_ctx, other.n_parallel, len(other.slots)) == (1536, 3, 3)  # its own -c/-np
    assert (default.n_ctx, default.n_parallel, len(default.slots)) == (2048, 2, 2)
    assert list(default.models) == list(other.models) and default.models[1] == OTHER
    assert stub.GetModelInfo(pb.GetModelInfoRequest(model=default.models[0])).path == default.path


def test_a_call_runs_on_the_model_it_names(server: RunningServer, stub: pb_grpc.LLMServiceStub) -> None:
    before_default, before_other = _turns(server, None), _turns(server, OTHER)
    assert _text(stub, OTHER).samples[0].turn_end.usage.completion_tokens == TOKENS
    reply = requests.post(_url(server, "/v1/chat/completions"), timeout=120, json={
        "model": OTHER, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": TOKENS})
    assert reply.status_code == 200 and reply.json()["model"] == OTHER
    report = OrcaLoadReport.FromString(base64.b64decode(reply.headers["endpoint-load-metrics-bin"]))
    assert {f"model.{OTHER}.running_sessions", f"model.{OTHER}.kv_cache_usage"} <= set(report.named_metrics)
    assert _turns(server, OTHER) == before_other + 2  # both on the other model's executor
    assert _turns(server, None) == before_default
    _text(stub)  # and a call that names none runs on the default model
    assert _turns(server, None) == before_default + 1 and _turns(server, OTHER) == before_other + 2


def test_both_models_serve_at_once(server: RunningServer, stub: pb_grpc.LLMServiceStub) -> None:
    names = ["", OTHER] * 4  # 4 sessions per model on 2 slots each: some wait for theirs
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        replies = list(pool.map(lambda model: _text(stub, model, f"Count to ten for {model or 'me'}:"), names))
    assert [r.samples[0].turn_end.usage.completion_tokens for r in replies] == [TOKENS] * len(names)
    other_tokens = stub.Tokenize(pb.TokenizeRequest(text="hello world", model=OTHER)).ids
    assert list(other_tokens) == list(stub.Tokenize(pb.TokenizeRequest(text="hello world")).ids)  # one vocabulary


def test_a_name_nothing_serves_is_refused_on_both_surfaces(server: RunningServer, stub: pb_grpc.LLMServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _text(stub, "no-such-model")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and OTHER in (caught.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelInfo(pb.GetModelInfoRequest(model="no-such-model"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    reply = requests.post(_url(server, "/v1/chat/completions"), timeout=30, json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_a_response_stored_by_either_model_is_found_and_continued(server: RunningServer) -> None:
    first = requests.post(_url(server, "/v1/responses"), timeout=120, json={
        "model": OTHER, "input": "Name a colour.", "max_output_tokens": TOKENS})
    assert first.status_code == 200, first.text
    assert first.json()["model"] == OTHER
    stored = requests.get(_url(server, f"/v1/responses/{first.json()['id']}"), timeout=10)
    assert stored.status_code == 200 and stored.json()["model"] == OTHER
    before = _turns(server, OTHER)
    second = requests.post(_url(server, "/v1/responses"), timeout=120, json={
        "model": OTHER, "input": "Another one.", "previous_response_id": first.json()["id"], "max_output_tokens": 4})
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
    assert _turns(server, OTHER) == before + 1


def test_a_named_session_of_the_other_model_resumes(server: RunningServer, stub: pb_grpc.LLMServiceStub) -> None:
    config = session_config(max_tokens=4, temperature=0, session_id="model-session", model=OTHER)
    for _ in range(2):
        reply = stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text="Once upon a time")),
                                  timeout=120)
    assert reply.samples[0].turn_end.usage.cached_tokens > 0  # its KV was kept under the other model's name


@pytest.fixture(scope="module")
def lru_server(other_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Two further models (one file under two names) and room for one of them at a time."""
    flags = ["-m", str(default_model_path()), "-m", f"a={other_model}", "-m", f"b={other_model}", "--models-max", "2",
             "--models-load-timeout", "3", "-np", "2", "-c", "1024", "-t", "2"]
    with serving(flags, tmp_path_factory.mktemp("models-lru") / "server.log", http_port=free_port(),
                 metrics=True) as running:
        yield running


def _states(server: RunningServer) -> dict[str, str]:
    data = requests.get(_url(server, "/v1/models"), timeout=10).json()["data"]
    return {entry["id"]: entry["status"]["value"] for entry in data if "status" in entry}


def test_beyond_models_max_a_model_loads_when_named_and_the_idle_one_unloads(lru_server: RunningServer) -> None:
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(lru_server.address))
    assert _states(lru_server) == {"a": "unloaded", "b": "unloaded"}  # nothing further loads at start
    assert _text(stub, "a").samples[0].turn_end.usage.completion_tokens == TOKENS
    assert _states(lru_server) == {"a": "loaded", "b": "unloaded"}
    assert _text(stub, "b").samples[0].turn_end.usage.completion_tokens == TOKENS
    assert _states(lru_server) == {"a": "unloaded", "b": "loaded"}  # a was idle: it made room
    log = lru_server.log_path.read_text()
    assert log.count('"served_model_loaded"') == 2 and log.count('"served_model_unloaded"') == 1


def test_a_model_in_use_is_not_unloaded_and_the_call_waiting_for_room_is_told_to_retry(
        lru_server: RunningServer) -> None:
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(lru_server.address))
    _text(stub, "b")
    config = session_config(max_tokens=1, temperature=0, model="b")
    done = threading.Event()

    def requests_() -> Iterator[pb.GenerateRequest]:  # one turn, then the stream stays open: no half-close
        yield pb.GenerateRequest(config=config, input=pb.Input(text="Hi"), end_of_turn=True)
        done.wait(60)

    holding = stub.Generate(requests_())  # an open session on b
    next(holding)
    with pytest.raises(grpc.RpcError) as caught:
        _text(stub, "a")  # room only if b unloads: it cannot while its session is open
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in (caught.value.details() or "")
    reply = requests.post(_url(lru_server, "/v1/completions"), timeout=30, json={"model": "a", "prompt": "Hi"})
    assert reply.status_code == 429 and "Retry-After" in reply.headers
    done.set()
    holding.cancel()
    assert _text(stub, "a").samples[0].turn_end.usage.completion_tokens == TOKENS  # once b is idle, a loads


def test_calls_alternating_between_models_all_finish(lru_server: RunningServer) -> None:
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(lru_server.address))
    names = ["a", "b"] * 3

    def call(name: str) -> int:
        for _ in range(20):  # a call refused while the other model is in use retries, as a client would
            try:
                return _text(stub, name).samples[0].turn_end.usage.completion_tokens
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        raise AssertionError(f"{name} never loaded")

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        assert list(pool.map(call, names)) == [TOKENS] * len(names)
    assert set(_states(lru_server).values()) <= {"loaded", "unloaded"}


def test_callers_of_two_models_at_once_are_served_and_the_models_do_not_thrash(lru_server: RunningServer) -> None:
    """3 callers per model, at once, 3 calls each: every call runs, and each load serves at
    least one call. (Before a model loaded for waiting calls was kept until they held it,
    the two unloaded each other as each loaded: 95 loads in a minute, calls timed out.)"""
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(lru_server.address))
    loads_before = lru_server.log_path.read_text().count('"served_model_loaded"')

    def caller(name: str) -> int:
        served = 0
        for _ in range(3):
            for _ in range(60):  # refused while the other model is in use: retried, as a client would
                try:
                    served += _text(stub, name).samples[0].turn_end.usage.completion_tokens == TOKENS
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    time.sleep(0.2)
        return served

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert list(pool.map(caller, ["a", "b"] * 3)) == [3] * 6
    loads = lru_server.log_path.read_text().count('"served_model_loaded"') - loads_before
    assert 1 <= loads <= 18, loads


@pytest.mark.soak
def test_loading_and_unloading_models_keeps_the_memory_flat(lru_server: RunningServer) -> None:
    """40 swaps of the two further models (each call unloads the other): RSS from the 10th
    to the 40th grows less than 15 MiB (before the unload collected the engine's cycles and
    trimmed glibc's heap: about 1 MiB a swap, 946 -> 976 MiB over these 30)."""
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(lru_server.address))
    status = Path(f"/proc/{lru_server.process.pid}/status")
    rss: list[int] = []
    for i in range(40):
        for _ in range(20):  # a call refused while the other model's last session ends retries
            try:
                _text(stub, "ab"[i % 2])
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        rss.append(next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmRSS:")))
    assert (rss[-1] - rss[9]) / 1024 < 15, [kb // 1024 for kb in rss]


def test_a_model_file_llama_cpp_cannot_load_is_refused_by_name_and_the_rest_serve(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_text("not a GGUF file\n")
    flags = ["-m", str(default_model_path()), "-m", f"bad={bad}", "--models-max", "2", "-np", "2", "-c", "2048",
             "-t", "2"]
    with serving(flags, tmp_path / "server.log", http_port=free_port()) as running:
        stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(running.address))
        with pytest.raises(grpc.RpcError) as caught:
            _text(stub, "bad")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "bad" in (caught.value.details() or "")
        reply = requests.post(_url(running, "/v1/completions"), timeout=60, json={"model": "bad", "prompt": "hi"})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
        assert _text(stub).samples[0].turn_end.usage.completion_tokens == TOKENS  # the default model serves on
