"""Every snippet of the README's five-minute tour, run against a real server: the gRPC ones
against the session's server, the OpenAI HTTP one against a server with --http-port and a
chat template (as `make serve` has)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.server import RunningServer, free_port, start_server, stop_server
from tests import toolchains

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = "127.0.0.1:50051"
DEFAULT_HTTP = "127.0.0.1:8080"  # make serve's OpenAI HTTP API


def _tour_blocks() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def test_the_tour_has_every_kind_of_snippet() -> None:
    kinds = [kind for kind, _ in _tour_blocks()]
    assert {"console", "python", "js"} <= set(kinds)
    assert any(kind == "python" and DEFAULT_HTTP in body for kind, body in _tour_blocks())  # the openai SDK


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The OpenAI HTTP API on a small server with a chat template, started only for that snippet."""
    args = ["-np", "1", "-c", "2048", "-t", "2"]
    running = start_server(args, tmp_path_factory.mktemp("tour-http") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


@pytest.mark.parametrize("index", range(len(_tour_blocks())))
def test_tour_snippet_runs(server, request: pytest.FixtureRequest, index: int) -> None:  # type: ignore[no-untyped-def]
    kind, body = _tour_blocks()[index]
    body = body.replace(DEFAULT, server.address)
    if DEFAULT_HTTP in body:
        http_server = request.getfixturevalue("http_server")
        body = body.replace(DEFAULT_HTTP, f"127.0.0.1:{http_server.http_port}")
    if kind == "console":
        for line in body.splitlines():
            if not line.startswith("$ "):
                continue
            command = line[2:]
            if command.startswith("docker-compose") and shutil.which("docker-compose") is None:
                pytest.skip(toolchains.missing("docker-compose not installed", "make tools"))
            env = {**os.environ, "LLMSERVE_ADDRESS": server.address}
            out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
            assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
    elif kind == "python":
        out = subprocess.run([sys.executable, "-c", body], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        # the gRPC snippet: the second turn reused the KV; the openai one: the reply's completion tokens
        assert int(out.stdout.strip().splitlines()[-1]) > 0, out.stdout
    elif kind == "js":
        # An ES module importing the package by its name: run from client/node (self-reference).
        node_dir = ROOT / "client" / "node"
        if not (node_dir / "src" / "gen").exists():
            pytest.skip(toolchains.missing("client/node/src/gen is missing", "make gen"))
        if not (node_dir / "dist" / "src" / "index.js").exists():
            subprocess.run(["npm", "run", "build"], cwd=node_dir, check=True, capture_output=True, timeout=300)
        out = subprocess.run(["node", "--input-type=module", "-e", body], cwd=node_dir,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout.split()[-1]) > 0  # completion tokens
