"""The TypeScript client (client/node: @bufbuild/protobuf + Connect, generated types) against
the real server: its node:test suite, and the client scenario (tests/client_scenario.py).
The suite's test/openai.test.ts drives the same server's OpenAI HTTP API with the official
`openai` npm package (a devDependency of client/node).

Needs node >= 20.10 (`make tools` installs one when the system's is older), `npm ci` in
client/node (`make tools`) and the generated code in client/node/src/gen (`make gen`);
without them the tests skip and say which is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.server import RunningServer, free_port, start_server, stop_server
from tests import client_scenario, toolchains

NODE_DIR = Path(__file__).resolve().parents[3] / "client" / "node"
API_KEY = "node-client-key"
NODE_TESTS = 28  # test/*.test.ts, the API-key and OpenAI ones included


def _missing() -> str | None:
    node = shutil.which("node")
    if node is None:
        return toolchains.missing("node is not installed (client/node needs >= 20.10; npm fetches it)", "make tools")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    if (major, minor) < (20, 10):
        return toolchains.missing(f"node {version} is too old (client/node needs >= 20.10)", "make tools")
    if not (NODE_DIR / "node_modules" / ".bin" / "tsc").exists():
        return toolchains.missing("client/node has no node_modules", "make tools")
    if not (NODE_DIR / "src" / "gen" / "llmserve" / "v1" / "llmserve_pb.ts").exists():
        return toolchains.missing("client/node/src/gen is missing", "make gen")
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="module")
def built() -> Path:
    """`npm run build`: tsc compiles src/, examples/ and test/ into dist/."""
    out = subprocess.run(["npm", "run", "build"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return NODE_DIR / "dist"


@pytest.fixture(scope="module")
def key_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A small second server that requires `authorization: Bearer API_KEY`, on gRPC and on the
    OpenAI HTTP API (with a chat template, --embeddings, and two slots for n=2)."""
    directory = tmp_path_factory.mktemp("node-api-key")
    args = ["-np", "2", "-c", "4096", "-t", "2", "--embeddings", "--api-key", API_KEY]
    running = start_server(args, directory / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


def test_node_client_suite(server, key_server, built: Path) -> None:  # type: ignore[no-untyped-def]
    tests = sorted(str(p.relative_to(NODE_DIR)) for p in (built / "test").glob("*.test.js"))
    env = {
        **os.environ,
        "LLMSERVE_ADDRESS": server.address,
        "LLMSERVE_API_KEY_ADDRESS": key_server.address,
        "LLMSERVE_API_KEY": API_KEY,
        "LLMSERVE_OPENAI_BASE_URL": f"http://127.0.0.1:{key_server.http_port}/v1",
    }
    out = subprocess.run(
        ["node", "--test", "--test-concurrency=1", *tests],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=600, env=env,
    )
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    counts = dict(re.findall(r"^# (pass|fail|skipped|cancelled) (\d+)$", out.stdout, re.MULTILINE))
    assert counts == {"pass": str(NODE_TESTS), "fail": "0", "skipped": "0", "cancelled": "0"}, out.stdout[-3000:]


def test_node_client_scenario(server, built: Path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        ["node", str(built / "examples" / "scenario.js")],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=300,
        env={**os.environ, "LLMSERVE_ADDRESS": server.address},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    steps = client_scenario.check(out.stdout, server.address)
    assert steps["bad_request"]["field"] == "config.stopping.max_tokens"
