"""Every flag combination serves or is refused with a message naming its flags, never an
abort (issue 39 §6): llama.cpp's GGML_ASSERTs kill the process, so the combinations it
asserts on are refused in config.py or adjusted where the context is built. Each row
starts the real server, and a server that comes up answers one Generate (and one Embed
with embeddings on) before SIGTERM, which must exit 0. docs/reliability.md, "Start-up
flags", says which assert each row once hit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmserve.client import Client

from harness.server import READINESS, free_port
from tools.embedding_model import convert

MINILM = "minilm"  # replaced by the converted all-MiniLM-L6-v2 GGUF's path
ROWS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [  # flags; () serves, else the flags its refusal names
    # The issue's: the MiniLM context's reserve graph split 300 tokens over 64 sequences (ggml_can_mul_mat).
    (("-fa", "on", "-b", "300", "-ub", "300", "-c", "1024", "-np", "2", "--embedding-model", MINILM), ()),
    # A ubatch below the embedding context's 64 sequences (n_outputs_max), for both embedders.
    (("-ub", "1", "-c", "1024", "-np", "2", "--embedding-model", MINILM), ()),
    (("-ub", "7", "-c", "1024", "-np", "2", "--embeddings"), ()),
    # A batch below the slots: llama.cpp reserves an output per sequence (n_outputs_max).
    (("-b", "1", "-np", "4"), ("--batch-size", "--parallel")),
    (("-b", "2048", "-ub", "2", "-np", "4", "--embeddings"), ("--ubatch-size", "--parallel")),
    # Neighbours that serve as they are.
    (("-b", "4", "-ub", "1", "-np", "4", "-c", "1024"), ()),
    (("-b", "64", "-ub", "512", "-c", "1024", "-np", "2"), ()),
    (("-c", "16", "-np", "1", "-b", "1", "-ub", "1"), ()),
    (("-c", "1024", "-np", "7", "-ub", "300", "-kvu", "-fa", "off"), ()),
    (("-c", "2048", "-np", "2", "-ub", "1000", "--embedding-model", MINILM), ()),  # past MiniLM's 512 positions
    (("-c", "32", "-np", "4"), ("--ctx-size",)),
]


def _start(flags: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "llmserve.service", "serve", "--port", str(port), "-t", "2",
                                *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return process, f"127.0.0.1:{port}"


def _ready(process: subprocess.Popen[bytes], address: str) -> bool:
    """True once readiness is SERVING; False if the process exited first."""
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while process.poll() is None:
            assert time.monotonic() < deadline, "neither ready nor exited in 120 s"
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=READINESS), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


def _serves(address: str, embeds: bool) -> None:
    with Client(address, timeout=60) as client:
        result = client.generate("Hello", max_tokens=2, temperature=0)
        assert 1 <= len(result.token_ids) <= 2
        if embeds:
            vectors = list(client.embed(["hello world", "a", "b c d"], truncate=True))
            assert len(vectors) == 3


@pytest.mark.parametrize(("flags", "refusal"), ROWS, ids=[" ".join(flags) for flags, _ in ROWS])
def test_a_flag_combination_serves_or_is_refused_naming_its_flags(flags: tuple[str, ...],
                                                                   refusal: tuple[str, ...]) -> None:
    argv = [str(convert()) if flag == MINILM else flag for flag in flags]
    process, address = _start(argv)
    try:
        if _ready(process, address):
            assert not refusal, f"served, but should have been refused naming {refusal}"
            _serves(address, embeds="--embeddings" in flags or "--embedding-model" in flags)
            process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode >= 0, f"killed by signal {-process.returncode}: {output[-2000:]}"
    if not refusal:
        assert process.returncode == 0, output[-2000:]
        return
    message = next((line for line in output.splitlines() if line.startswith("llmserve: ")), None)
    assert process.returncode != 0 and message is not None, output[-2000:]
    assert all(flag in message for flag in refusal), message
