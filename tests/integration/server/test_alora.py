"""Activated LoRA (aLoRA) on the real server and model (docs/adapters.md): an adapter file with
llama.cpp's `adapter.alora.invocation_tokens`, made here with the "strong" test adapter's
weights, applies from the last occurrence of its invocation in a session's context on."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import requests
from llmserve.client import pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.alora import adapter_dir, load_test_alora
from harness.server import RunningServer, free_port, serving

QUESTION = "Question: which river flows through Paris?"
INVOKE = " Answer:"
TOKENS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = adapter_dir()
    flags = ["-np", "4", "-c", "4096", "-t", "2", "--lora", f"strong={directory / 'strong.gguf'}",
             "--adapter-dir", str(directory), "--allow-adapter-updates"]
    with serving(flags, tmp_path_factory.mktemp("alora") / "server.log", http_port=free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.LLMServiceStub:
    """With `act` loaded: the strong adapter's weights as an aLoRA invoked by INVOKE's tokens."""
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    load_test_alora(stub, QUESTION, INVOKE)
    return stub


def _turn(stub: pb_grpc.LLMServiceStub, prompt: str, **config: object) -> pb.GenerateTextResponse.Sample:
    cfg = session_config(max_tokens=TOKENS, temperature=0, ignore_eos=True, top_logprobs=2, **config)  # type: ignore[arg-type]
    return stub.GenerateText(pb.GenerateTextRequest(config=cfg, input=pb.Input(text=prompt)), timeout=120).samples[0]


def test_an_alora_file_loads_at_run_time(stub: pb_grpc.LLMServiceStub) -> None:
    names = {a.name for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
    assert {"act", "strong"} <= names


def test_without_its_invocation_an_alora_leaves_the_base_s_reply(stub: pb_grpc.LLMServiceStub) -> None:
    """Both computed afresh (a head no other test sends), one after the other: the same rows."""
    prompt = "First, a word about rivers. " + QUESTION + " It is"
    base, under = _turn(stub, prompt), _turn(stub, prompt, adapter="act")
    assert list(under.token_ids) == list(base.token_ids)
    assert abs(under.logprobs[0].logprob - base.logprobs[0].logprob) < 0.01
    assert list(_turn(stub, prompt, adapter="strong").token_ids) != list(base.token_ids)  # the weights change it


def test_with_its_invocation_only_what_follows_runs_under_the_adapter(stub: pb_grpc.LLMServiceStub) -> None:
    """The reply differs from the base's and from the same weights' as a plain LoRA, which also
    computes the question under them (each computed afresh: a head no other test sends); an
    aLoRA applied to the whole prompt would give the plain LoRA's rows."""
    prompt = "Second, a word about rivers. " + QUESTION + INVOKE
    base, as_lora, as_alora = _turn(stub, prompt), _turn(stub, prompt, adapter="strong"), _turn(stub, prompt, adapter="act")
    assert len(as_alora.token_ids) == TOKENS and list(as_alora.token_ids) != list(base.token_ids)
    first = (as_alora.logprobs[0].logprob, as_lora.logprobs[0].logprob)
    assert as_alora.token_ids[0] != as_lora.token_ids[0] or abs(first[0] - first[1]) > 0.05, first


def test_an_alora_runs_alone(server: RunningServer, stub: pb_grpc.LLMServiceStub) -> None:
    """llama-server's `lora` list naming the aLoRA beside another adapter: 400 naming the field."""
    ids = {a.name: a.id for a in stub.ListAdapters(pb.ListAdaptersRequest()).adapters}
    body = {"prompt": QUESTION + INVOKE, "max_tokens": 2, "lora": [{"id": ids["act"]}, {"id": ids["strong"]}]}
    reply = requests.post(f"http://127.0.0.1:{server.http_port}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 400 and "runs alone" in reply.json()["error"]["message"], reply.text
    assert reply.json()["error"]["param"] == "lora"
    listed = {a["name"]: a for a in requests.get(f"http://127.0.0.1:{server.http_port}/lora-adapters", timeout=10).json()}
    assert listed["act"]["alora_invocation_string"] == INVOKE and "alora_invocation_tokens" not in listed["strong"]


def test_an_alora_reuses_the_base_s_cached_context_and_leaves_no_adapter_cells_to_it(
        stub: pb_grpc.LLMServiceStub) -> None:
    """The question cached by a base call is reused by the aLoRA call that adds the invocation
    (its cells before it are the base's); a base call sending that aLoRA call's whole prompt
    then reuses only the question, not the invocation the aLoRA computed under its weights."""
    question = "Third, a word about rivers. " + QUESTION
    num_question = len(stub.Tokenize(pb.TokenizeRequest(text=question, add_special=True)).ids)
    _turn(stub, question + " It is")
    under = _turn(stub, question + INVOKE, adapter="act")
    assert under.turn_end.usage.cached_tokens == num_question
    again = _turn(stub, question + INVOKE)
    assert again.turn_end.usage.cached_tokens == num_question
