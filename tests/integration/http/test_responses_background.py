"""Background responses (`background: true`, http/background.py) through the `openai` SDK
against the real server and model, one slot (`-np 1`) so a response can be held in the
queue behind a long chat: answered `queued` at once, polled to `completed` and continued by
id; cancelled while queued (status `cancelled`, its slot never taken, the server serving on);
a bound server refuses one at creation; DELETE ends a running one."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

from .conftest import API_KEY


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """This module's server (conftest's `client` and `model` use it): one slot, a queue of two."""
    args = [*CHAT_SERVER_ARGS[:1], "1", *CHAT_SERVER_ARGS[2:], "--api-key", API_KEY, "--max-queue", "2"]
    running = start_server(args, tmp_path_factory.mktemp("background") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


def _polled(client: OpenAI, response_id: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_answered_queued_then_completed_and_continued(client: OpenAI, model: str) -> None:
    started = time.monotonic()
    queued = client.responses.create(model=model, input="My name is Ada. Say hello.", max_output_tokens=12,
                                     temperature=0, background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    assert time.monotonic() - started < 5.0
    done = _polled(client, queued.id)
    assert done.status in ("completed", "incomplete") and done.output_text and done.usage.output_tokens >= 1
    follow = client.responses.create(model=model, input="What is my name?", previous_response_id=queued.id,
                                     max_output_tokens=4, temperature=0)
    assert follow.usage.input_tokens > done.usage.input_tokens  # the stored conversation came first


def _hold_the_slot(client: OpenAI, model: str, started: threading.Event) -> None:
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell a story."}],
                                            max_tokens=300, stream=True, extra_body={"ignore_eos": True})
    for _ in stream:
        started.set()


@contextlib.contextmanager
def _slot_held(client: OpenAI, model: str) -> Iterator[None]:
    """The one slot busy with a long chat (300 tokens) while the block runs, and then until it ends."""
    started = threading.Event()
    holder = threading.Thread(target=_hold_the_slot, args=(client, model, started))
    holder.start()
    try:
        assert started.wait(60)
        yield
    finally:
        holder.join(120)


def test_cancelled_while_queued_behind_a_long_call(client: OpenAI, model: str) -> None:
    with _slot_held(client, model):
        queued = client.responses.create(model=model, input="Say hi.", max_output_tokens=8, background=True)
        assert client.responses.retrieve(queued.id).status == "in_progress"  # waiting for the one slot
        cancelled = client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled" and cancelled.id == queued.id
        assert client.responses.retrieve(queued.id).status == "cancelled"
        assert client.responses.cancel(queued.id).status == "cancelled"  # again: as it is
    after = client.responses.create(model=model, input="Say hi.", max_output_tokens=4)  # the server serves on
    assert after.status in ("completed", "incomplete")


def test_what_is_refused_and_what_is_not_found(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input="hi", max_output_tokens=4, background=True, stream=True)
    assert refused.value.body["param"] == "background"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_never_created")


def test_delete_ends_a_running_response(client: OpenAI, model: str) -> None:
    with _slot_held(client, model):
        queued = client.responses.create(model=model, input="Say hi.", max_output_tokens=8, background=True)
        client.responses.delete(queued.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(queued.id)


def test_a_full_server_refuses_one_at_creation(client: OpenAI, model: str) -> None:
    with _slot_held(client, model):
        queued = [client.responses.create(model=model, input="Say hi.", max_output_tokens=8, background=True)
                  for _ in range(2)]  # one slot, --max-queue 2: the holder and these two fill it
        with pytest.raises(openai.RateLimitError):
            client.responses.create(model=model, input="Say hi.", max_output_tokens=8, background=True)
        for response in queued:
            assert client.responses.cancel(response.id).status == "cancelled"
