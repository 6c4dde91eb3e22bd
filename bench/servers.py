"""Starting and stopping the servers the benchmarks compare: llmserve (as the tests
start it) and llama-server built from the same llama.cpp tree (bench/README.md)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from harness.server import free_port, start_server

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD = Path("/tmp/llama-build/bin")
THREADS = 2
NP = 16
CTX = 16384


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become healthy")


def start_llmserve(
    log: Path, embed_args: tuple[str, ...] = ("--embeddings",), extra: tuple[str, ...] = (), http_port: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """llmserve with the bench's slots, context and threads; `http_port`: also its OpenAI
    HTTP API there (`--http-port`). Returns the process and the gRPC address."""
    args = ["-np", str(NP), "-c", str(CTX), "-t", str(THREADS), *embed_args, *extra]
    server = start_server(args, log, http_port=http_port)
    return server.process, server.address


def start_llama_server(
    binary: Path, model: Path, log: Path, embeddings: bool, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(NP),
            "-c", str(CTX), "-t", str(THREADS), "--no-webui"]
    if embeddings:
        args += ["--embeddings", "--pooling", "mean"]
    args += list(extra)
    process = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url)
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
