"""The Go client built from `make gen`'s stubs (client/examples/go) runs the client scenario against the real server."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.server import RunningServer
from tests import toolchains
from tests.client_scenario import check

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "client" / "examples" / "go"
STUBS = ROOT / "gen" / "go" / "llmserve" / "v1"


def skip_reason() -> str | None:
    """Why this machine cannot build the Go client, or None when it can."""
    if shutil.which("go") is None:
        return toolchains.missing(
            "go not installed (golang-go protoc-gen-go protoc-gen-go-grpc golang-github-golang-protobuf-1-5-dev "
            "golang-google-grpc-dev golang-google-genproto-dev, Debian 12)", "make client-tools")
    if not (STUBS / "llmserve.pb.go").exists() or not (STUBS / "llmserve_grpc.pb.go").exists():
        return toolchains.missing("gen/go has no Go stubs", "make gen")
    return None


SKIP_REASON = skip_reason()


# Decided before the `server` fixture starts a server for nothing.
@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_go_client_runs_the_scenario(server: RunningServer, tmp_path: Path) -> None:
    binary = tmp_path / "llmserve-go-example"
    build = subprocess.run(
        [str(EXAMPLE / "build.sh"), str(binary)], capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    out = subprocess.run(
        [str(binary)], capture_output=True, text=True, timeout=180,
        env={**os.environ, "LLMSERVE_ADDRESS": server.address},
    )
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    check(out.stdout, server.address)
