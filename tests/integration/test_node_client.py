"""The Node.js client (client/node, @grpc/grpc-js + proto-loader) against the real server."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "client" / "node"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_client_streams_generate_and_embed(server) -> None:  # type: ignore[no-untyped-def]
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists(), "run `make tools` (npm ci in client/node)"
    out = subprocess.run(
        ["node", "--test", "test/"], cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
        env={**os.environ, "LLMSERVE_ADDRESS": server.address},
    )
    print(out.stdout[-2000:])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# pass 3" in out.stdout and "# fail 0" in out.stdout
