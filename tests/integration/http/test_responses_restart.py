"""Stored responses survive a restart with --session-dir (engine/chat/stored.py): the
acknowledged response is retrieved and continued by the next process, from its saved KV
(engine/stored_kv.py)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from llmserve.client import pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI
from openai.types.responses import Response

from harness.server import free_port, start_server, stop_server

FLAGS = ["-np", "2", "-c", "4096", "-t", "2"]


def _stored_by_a_first_process(flags: list[str], tmp_path: Path) -> Response:
    """One response stored by a server that then stops cleanly."""
    first_server = start_server(flags, tmp_path / "first.log", http_port=free_port())
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{first_server.http_port}/v1", api_key="k", max_retries=0)
        return client.responses.create(model="gemma-3-270m-q4_k_m", input="My name is Ada.", max_output_tokens=4)
    finally:
        assert stop_server(first_server) == 0


def test_a_stored_response_outlives_the_process(tmp_path: Path) -> None:
    flags = [*FLAGS, "--session-dir", str(tmp_path / "sessions"), "--store-kv"]
    first = _stored_by_a_first_process(flags, tmp_path)
    second_server = start_server(flags, tmp_path / "second.log", http_port=free_port())
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{second_server.http_port}/v1", api_key="k", max_retries=0)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        after = client.responses.create(model="gemma-3-270m-q4_k_m", previous_response_id=first.id,
                                        input="What is my name?", max_output_tokens=4)
        assert after.usage.input_tokens > first.usage.input_tokens  # the stored turn and the new input
        # the stored turn's KV was saved with it: the next process starts from it, not prefilling it again
        assert after.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
        assert _num_saved(tmp_path / "sessions", 2) == 2  # the first turn's KV and the continuation's
        client.responses.delete(first.id)
        assert _num_saved(tmp_path / "sessions", 1) == 1  # the deleted one's KV went with it
    finally:
        assert stop_server(second_server) == 0


def _num_saved(directory: Path, expected: int, timeout_s: float = 10.0) -> int:
    """The saved KV files there, once they are `expected` (written after the reply) or the time is up."""
    deadline = time.monotonic() + timeout_s
    while len(found := list(directory.glob("*.session"))) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(found)


def test_a_background_response_running_at_shutdown_is_finished_and_kept(tmp_path: Path) -> None:
    """SIGTERM while a background response generates: the drain waits for it (an open call),
    it is stored, and the next process answers it. Without --store-kv its KV is not saved."""
    flags = [*FLAGS, "--session-dir", str(tmp_path / "sessions")]
    first_server = start_server(flags, tmp_path / "first.log", http_port=free_port())
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{first_server.http_port}/v1", api_key="k", max_retries=0)
        queued = client.responses.create(model="gemma-3-270m-q4_k_m", input="Tell a long story.",
                                         max_output_tokens=96, background=True)
        assert queued.status == "queued"
    finally:
        assert stop_server(first_server) == 0  # at once: the response is still generating
    assert not list((tmp_path / "sessions").glob("*.session"))  # without --store-kv no KV is saved
    second_server = start_server(flags, tmp_path / "second.log", http_port=free_port())
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{second_server.http_port}/v1", api_key="k", max_retries=0)
        kept = client.responses.retrieve(queued.id)
        assert kept.status in ("completed", "incomplete") and kept.output_text and kept.usage.output_tokens >= 1
    finally:
        assert stop_server(second_server) == 0


def test_grpc_continues_a_stored_response_after_a_restart_from_its_kv(tmp_path: Path) -> None:
    """`SessionConfig.continue_from` after a restart starts from the stored turn's saved KV, as
    `previous_response_id` does (engine/stored_kv.py `continued`), also on a server that
    saves none itself (no --store-kv there)."""
    flags = [*FLAGS, "--session-dir", str(tmp_path / "sessions")]
    first = _stored_by_a_first_process([*flags, "--store-kv"], tmp_path)
    second_server = start_server(flags, tmp_path / "second.log", http_port=free_port())
    try:
        stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(second_server.address))
        config = session_config(continue_from=first.id, max_tokens=2, temperature=0)
        ask = pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="What is my name?")]))
        reply = stub.GenerateText(pb.GenerateTextRequest(config=config, input=ask), timeout=120,
                                  metadata=(("authorization", "Bearer k"),))
        assert reply.samples[0].turn_end.usage.cached_tokens >= first.usage.input_tokens
    finally:
        assert stop_server(second_server) == 0
