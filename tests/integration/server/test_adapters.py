"""LoRA adapters on the real server and model (docs/adapters.md): adapters made here by
tools/make_adapters.py, named per request over gRPC and HTTP, batched by adapter set,
loaded and unloaded at run time, refused with a clear status when they cannot be served."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
from llmserve.client import pb, session_config
from llmserve.service.model.default_model import cache_dir, default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import scrape
from harness.server import RunningServer, free_port, serving
from tools.make_adapters import ADAPTERS, BROKEN_ADAPTERS, make_all

PROMPT = "The capital of France is"
TOKENS = 24


@pytest.fixture(scope="module")
def adapter_dir() -> Path:
    """The test adapters, made once per machine (the gguf package reads the base for ~10 s)."""
    directory = cache_dir() / "test-adapters"
    make_all(directory, default_model_path(), ADAPTERS + BROKEN_ADAPTERS)
    if not (directory / "base-model.gguf").exists() or (directory / "base-model.gguf").is_symlink():
        (directory / "base-model.gguf").unlink(missing_ok=True)  # a real GGUF that is no LoRA
        os.link(default_model_path(), directory / "base-model.gguf")
    if not (directory / "base-link.gguf").is_symlink():  # a way out of the directory
        (directory / "base-link.gguf").symlink_to(default_model_path())
    (directory / "not-gguf.gguf").write_text("not a GGUF file\n")
    return directory


@pytest.fixture(scope="module")
def server(adapter_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ["-np", "8", "-c", "8192", "-t", "2", "--lora", f"strong={adapter_dir / 'strong.gguf'}",
             "--lora", f"mild={adapter_dir / 'mild.gguf'}:1.0", "--adapter-dir", str(adapter_dir),
             "--allow-adapter-updates", "--max-loras-per-batch", "2"]
    with serving(flags, tmp_path_factory.mktemp("adapters") / "server.log", http_port=free_port(),
                 metrics=True) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.LLMServiceStub:
    return pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))


def _start(stub: pb_grpc.LLMServiceStub, prompt: str = PROMPT, **config: object) -> grpc.Future:
    cfg = session_config(**{"max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, **config})  # type: ignore[arg-type]
    return stub.GenerateText.future(pb.GenerateTextRequest(config=cfg, input=pb.Input(text=prompt)), timeout=120)


def _turn(stub: pb_grpc.LLMServiceStub, prompt: str = PROMPT, **config: object) -> pb.GenerateTextResponse:
    return _start(stub, prompt, **config).result()


def _ids(reply: pb.GenerateTextResponse) -> list[int]:
    return list(reply.samples[0].token_ids)


def test_an_adapter_changes_the_output_and_scale_zero_is_the_base(stub: pb_grpc.LLMServiceStub,
                                                                  server: RunningServer) -> None:
    base = _ids(_turn(stub))
    strong = _ids(_turn(stub, adapter="strong"))
    assert strong[:4] != base[:4]
    assert _ids(_turn(stub, adapter="strong", adapter_scale=0.0)) == base
    http = f"http://127.0.0.1:{server.http_port}"
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    as_model = requests.post(f"{http}/v1/completions", json={**body, "model": "strong"}, timeout=60).json()
    assert as_model["model"] == "strong" and as_model["usage"]["completion_tokens"] == TOKENS
    by_id = requests.post(f"{http}/v1/completions", json={**body, "lora": [{"id": 0, "scale": 0}]}, timeout=60).json()
    assert by_id["choices"][0]["text"] == _turn(stub).samples[0].text  # scale 0: the base's reply


def _agrees(alone: pb.GenerateTextResponse, together: pb.GenerateTextResponse, tolerance: float = 0.5) -> bool:
    """The same tokens, or a first difference where the two top choices were within
    `tolerance` nats of each other (batch shapes round differently; a near tie may flip)."""
    a, b = alone.samples[0], together.samples[0]
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            top = sorted((t.logprob for t in b.logprobs[i].top), reverse=True)
            return len(top) > 1 and top[0] - top[1] <= tolerance
    return True


def test_interleaved_adapters_give_what_each_gives_alone(stub: pb_grpc.LLMServiceStub) -> None:
    """Three adapter sets (the base, mild, mild at scale 4) on one server, three streams
    each, the same prompt: each stream's tokens are those its set gives alone. A decode
    that mixed sets, or a prompt cached under one set reused under another, changes them.
    (Not "strong": it makes the model chaotic, and batch shapes alone then move its logits
    by tenths of a nat within a few tokens, with or without other adapters beside it.)"""
    sets = [{}, {"adapter": "mild"}, {"adapter": "mild", "adapter_scale": 4.0}]
    alone = [_turn(stub, "Write a short story about a cat.", top_logprobs=2, **s) for s in sets]
    assert len({tuple(_ids(r)) for r in alone}) == 3
    futures = [(i, _start(stub, "Write a short story about a cat.", top_logprobs=2, **s))
               for i, s in enumerate(sets) for _ in range(3)]
    together = [(i, f.result()) for i, f in futures]
    for i, reply in together:
        assert len(_ids(reply)) == TOKENS and _agrees(alone[i], reply), (sets[i], _ids(alone[i]), _ids(reply))


def test_a_prefix_cached_under_one_adapter_is_never_reused_under_another(stub: pb_grpc.LLMServiceStub) -> None:
    prompt = "Here is a list of the rivers of Europe, longest first, with their lengths: " * 6
    first = _turn(stub, prompt, adapter="mild")
    again = _turn(stub, prompt, adapter="mild")
    other_scale = _turn(stub, prompt, adapter="mild", adapter_scale=0.5)
    base = _turn(stub, prompt)
    num_prompt = first.samples[0].turn_end.usage.prompt_tokens
    assert again.samples[0].turn_end.usage.cached_tokens >= num_prompt - 1  # the same set reuses it
    assert other_scale.samples[0].turn_end.usage.cached_tokens == 0
    assert base.samples[0].turn_end.usage.cached_tokens == 0


def _steps_over(port: int | None, num_tokens: int) -> float:
    """Generation steps so far that carried more than `num_tokens` tokens (a bucket bound)."""
    page = scrape(port)
    return (page.counted("llmserve_batch_tokens_count", kind="generate")
            - page.counted("llmserve_batch_tokens_bucket", kind="generate", le=f"{float(num_tokens)}"))


def test_an_adapters_long_prompt_is_chunked_while_the_base_decodes(stub: pb_grpc.LLMServiceStub,
                                                                  server: RunningServer) -> None:
    """The base's streams decode while a ~700-token prompt arrives under an adapter: its
    steps run apart from the base's, and its prompt goes in paced chunks (no step of more
    than 256 tokens), not in one step that would stall the base's streams for its whole
    prefill (docs/adapters.md, "Batched together, fairly")."""
    before = _steps_over(server.metrics_port, 256)
    prompt = " ".join(f"The river number {i} runs past the mill." for i in range(70))
    base = [_start(stub, f"Count to {i}:", max_tokens=400, temperature=0.8) for i in range(2)]
    time.sleep(1.0)  # the base's streams decode
    long = _turn(stub, prompt, adapter="mild", max_tokens=4)
    assert all(not f.done() for f in base), "the base's streams ended before the adapter's prompt came"
    for f in base:
        f.cancel()
    assert 600 <= long.samples[0].turn_end.usage.prompt_tokens <= 1000
    assert _steps_over(server.metrics_port, 256) == before


def test_a_set_beyond_max_loras_per_batch_waits_for_a_running_one(stub: pb_grpc.LLMServiceStub) -> None:
    """--max-loras-per-batch 2 and slots to spare: `mild` at two scales run (two sets); a
    call under a third scale waits in the queue until one of them is done, then runs."""
    running = [_start(stub, adapter="mild", adapter_scale=scale, max_tokens=48, temperature=0.8) for scale in (1.0, 0.5)]
    time.sleep(0.3)
    third = _turn(stub, adapter="mild", adapter_scale=2.0, max_tokens=4, temperature=0.8)
    firsts = [f.result() for f in running]
    queued = third.samples[0].turn_end.timings.queue_ms
    assert len(_ids(third)) == 4 and all(len(_ids(r)) == 48 for r in firsts)
    assert queued >= 300 and all(r.samples[0].turn_end.timings.queue_ms < queued / 4 for r in firsts), queued


def test_files_that_cannot_be_served_get_a_clear_status_and_the_server_goes_on(
        stub: pb_grpc.LLMServiceStub) -> None:
    """Each refused with a status naming the file's fault, while short turns beside them
    keep being answered (the file checks run off the loop and off the executor)."""
    cases = {
        "f64.gguf": (grpc.StatusCode.FAILED_PRECONDITION, "type F64"),  # llama.cpp would crash at a decode
        "llama-arch.gguf": (grpc.StatusCode.FAILED_PRECONDITION, "'llama'"),
        "not-gguf.gguf": (grpc.StatusCode.FAILED_PRECONDITION, "not a readable GGUF"),
        "base-model.gguf": (grpc.StatusCode.FAILED_PRECONDITION, "not a LoRA adapter"),
        "../escape.gguf": (grpc.StatusCode.INVALID_ARGUMENT, "outside --adapter-dir"),
        "base-link.gguf": (grpc.StatusCode.INVALID_ARGUMENT, "outside --adapter-dir"),  # a symlink out
        "absent.gguf": (grpc.StatusCode.INVALID_ARGUMENT, "no adapter file"),
    }
    done = threading.Event()
    latencies: list[float] = []

    def short_turns() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            stub.GenerateText(pb.GenerateTextRequest(config=session_config(max_tokens=4), input=pb.Input(text="Hi")),
                              timeout=30)
            latencies.append(time.monotonic() - t0)

    beside = threading.Thread(target=short_turns)
    beside.start()
    try:
        for path, (code, words) in cases.items():
            with pytest.raises(grpc.RpcError) as refused:
                stub.LoadAdapter(pb.LoadAdapterRequest(name="x", path=path), timeout=60)
            assert refused.value.code() == code and words in refused.value.details(), (path, refused.value.details())
    finally:
        done.set()
        beside.join()
    assert latencies and max(latencies) < 1.0, f"short turns took up to {max(latencies):.2f} s"
    with pytest.raises(grpc.RpcError) as unknown:
        _turn(stub, adapter="nope")
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in str(unknown.value.details())
    assert [a.name for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters] == ["strong", "mild"]


def test_load_and_unload_at_run_time_lose_no_call(stub: pb_grpc.LLMServiceStub, server: RunningServer) -> None:
    t0 = time.monotonic()
    loaded = stub.LoadAdapter(pb.LoadAdapterRequest(name="late", path="other.gguf"), timeout=60)
    assert loaded.rank == 8 and time.monotonic() - t0 < 5
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = [pool.submit(_turn, stub, f"Story {i}:", adapter="late") for i in range(3)]
        deadline = time.monotonic() + 30
        while sum(a.num_sessions for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters if a.name == "late") < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # what the inference gateway's lora-affinity scorer reads, as of the executor's last step (it
        # publishes after the sessions open: polled, bounded)
        deadline = time.monotonic() + 10
        while not (gauge := scrape(server.metrics_port)).has("llmserve_lora_requests_info", running_lora_adapters="late",
                                                              waiting_lora_adapters="", max_lora="2"):
            assert time.monotonic() < deadline, [key for key in gauge.samples if "lora_requests_info" in str(key)]
            time.sleep(0.02)
        assert stub.UnloadAdapter(pb.UnloadAdapterRequest(name="late")).freed is False  # in use: freed later
        with pytest.raises(grpc.RpcError) as refused:
            _turn(stub, adapter="late")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        replies = [f.result() for f in running]
    assert all(len(_ids(r)) == TOKENS for r in replies)  # the running calls finished whole
    deadline = time.monotonic() + 10
    while "late" in [a.name for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters]:
        assert time.monotonic() < deadline, "the unloaded adapter was never freed"
        time.sleep(0.05)
    http = f"http://127.0.0.1:{server.http_port}"
    added = requests.post(f"{http}/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": "other.gguf"},
                          timeout=60)
    assert added.status_code == 200 and "late" in [m["id"] for m in requests.get(f"{http}/v1/models").json()["data"]]
    removed = requests.post(f"{http}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=60)
    assert removed.status_code == 200
    gone = requests.post(f"{http}/v1/completions", json={"model": "late", "prompt": "x"}, timeout=60)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"


def test_a_named_session_keeps_its_adapter_across_a_restart(adapter_dir: Path, tmp_path: Path) -> None:
    """A named session's KV is saved with its adapter set: the next process resumes it under
    that set from the saved state, and under another set prefills the history again."""
    flags = ["-np", "2", "-c", "4096", "-t", "2", "--lora", f"mild={adapter_dir / 'mild.gguf'}",
             "--session-dir", str(tmp_path / "sessions")]
    story = "Here is the beginning of a long story about a lighthouse keeper and his cat. " * 3
    with serving(flags, tmp_path / "first.log") as first:
        first_stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(first.address))
        opened = _turn(first_stub, story, adapter="mild", session_id="keeper")
    history = opened.samples[0].turn_end.usage.prompt_tokens + TOKENS
    with serving(flags, tmp_path / "second.log") as second:
        stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(second.address))
        resumed = _turn(stub, " Then", adapter="mild", session_id="keeper")
        assert resumed.samples[0].turn_end.usage.cached_tokens >= history - 1  # the saved KV, under mild
        under_base = _turn(stub, " Then", session_id="keeper")
        assert under_base.samples[0].turn_end.usage.cached_tokens == 0  # mild's KV is no prefix for the base


def _wait_idle(stub: pb_grpc.LLMServiceStub) -> None:
    """Until no session runs under an adapter: a call's session closes just after its reply."""
    deadline = time.monotonic() + 10
    while any(a.num_sessions for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters):
        assert time.monotonic() < deadline, "a session under an adapter never closed"
        time.sleep(0.05)


def test_beyond_max_loras_an_idle_adapter_is_evicted_and_loads_again_when_named(adapter_dir: Path,
                                                                               tmp_path: Path) -> None:
    """--max-loras 1: a second --lora starts available; a run-time load evicts the idle
    resident adapter (listed "available"), a call naming it loads it again (evicting the
    other) and gets its tokens; with the resident one in use, a call naming the other is
    RESOURCE_EXHAUSTED."""
    flags = ["-np", "4", "-c", "4096", "-t", "2", "--max-loras", "1", "--lora", f"mild={adapter_dir / 'mild.gguf'}",
             "--lora", f"strong={adapter_dir / 'strong.gguf'}", "--adapter-dir", str(adapter_dir),
             "--allow-adapter-updates"]
    with serving(flags, tmp_path / "server.log", http_port=free_port()) as running:
        stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(running.address))
        states = {a.name: a.state for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
        assert states == {"mild": "loaded", "strong": "available"}  # the --lora beyond --max-loras
        strong = _turn(stub, adapter="strong", top_logprobs=2)  # loads it, evicting the idle mild
        assert _ids(strong) != _ids(_turn(stub))
        states = {a.name: a.state for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
        assert states == {"mild": "available", "strong": "loaded"}
        _wait_idle(stub)
        mild = _turn(stub, adapter="mild", top_logprobs=2)
        _wait_idle(stub)
        stub.LoadAdapter(pb.LoadAdapterRequest(name="other", path="other.gguf"), timeout=60)
        states = {a.name: a.state for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
        assert states == {"mild": "available", "other": "loaded", "strong": "available"}
        again = _turn(stub, adapter="mild", top_logprobs=2)
        assert _agrees(mild, again) and _ids(again) != _ids(_turn(stub))  # mild's own output, not the base's
        states = {a.name: a.state for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
        assert states == {"mild": "loaded", "other": "available", "strong": "available"}
        cfg = session_config(max_tokens=400, ignore_eos=True, adapter="mild")
        busy = stub.Generate(iter([pb.GenerateRequest(config=cfg, input=pb.Input(text=PROMPT), end_of_turn=True)]),
                             timeout=120)
        next(busy)  # mild is in use while this streams
        with pytest.raises(grpc.RpcError) as refused:
            _turn(stub, adapter="other")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-loras" in (refused.value.details() or "")
        busy.cancel()
        models = requests.get(f"http://127.0.0.1:{running.http_port}/lora-adapters", timeout=10).json()
        assert {m["name"]: m["state"] for m in models} == {"mild": "loaded", "other": "available", "strong": "available"}
