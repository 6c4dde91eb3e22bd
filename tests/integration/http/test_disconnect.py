"""A client that goes away mid-stream cancels its turn: the slot is free at once."""

from __future__ import annotations

import time

from llmserve.client import Client
from openai import OpenAI

from harness.server import RunningServer
from tests.helpers import busy_slots

from .conftest import API_KEY


def test_a_disconnect_mid_stream_frees_the_slot(client: OpenAI, model: str, http_server: RunningServer) -> None:
    with Client(http_server.address, api_key=API_KEY) as grpc_client:
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to 5000."}],
                                                stream=True, max_tokens=1500, temperature=0,
                                                extra_body={"ignore_eos": True})
        for _, chunk in zip(range(4), stream):
            assert chunk.choices
        assert busy_slots(grpc_client) == 1
        stream.close()  # the connection goes; 1,500 tokens would take far longer than the wait below
        deadline = time.monotonic() + 3.0
        while busy_slots(grpc_client) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert busy_slots(grpc_client) == 0
