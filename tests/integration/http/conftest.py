"""A real server with the OpenAI HTTP API on (--http-port), a chat template and an API key,
and the official `openai` SDK pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

API_KEY = "test-http-key"
MAX_BODY = 1 << 20  # --max-message-bytes: the largest body the HTTP API reads too


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*CHAT_SERVER_ARGS, "--api-key", API_KEY, "--max-message-bytes", str(MAX_BODY)]
    running = start_server(args, tmp_path_factory.mktemp("http") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


@pytest.fixture(scope="module")
def base_url(http_server: RunningServer) -> str:
    return f"http://127.0.0.1:{http_server.http_port}"


@pytest.fixture(scope="module")
def client(base_url: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id
