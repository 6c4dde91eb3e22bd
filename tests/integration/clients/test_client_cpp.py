"""The C++ client (client/examples/cpp: stubs from `make gen`, Debian 12's gRPC) runs the
shared client scenario (tests/client_scenario.py) against the real server."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import toolchains
from tests.client_scenario import check

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "client" / "examples" / "cpp" / "build.sh"
GENERATED = ROOT / "gen" / "cpp" / "llmserve" / "v1" / "llmserve.grpc.pb.cc"


def missing_toolchain() -> str | None:
    """Why the C++ client cannot be built here, or None."""
    if shutil.which("g++") is None:
        return toolchains.missing("g++ is not installed", "make client-tools")
    if shutil.which("pkg-config") is None:
        return toolchains.missing("pkg-config is not installed", "make client-tools")
    if subprocess.run(["pkg-config", "--exists", "grpc++", "protobuf"]).returncode != 0:
        return toolchains.missing("pkg-config finds no grpc++/protobuf (libgrpc++-dev libprotobuf-dev)", "make client-tools")
    if not GENERATED.exists():
        return toolchains.missing("gen/cpp has no generated code", "make gen")
    return None


MISSING = missing_toolchain()


@pytest.mark.skipif(MISSING is not None, reason=f"C++ client not built: {MISSING}")
def test_cpp_client_runs_the_scenario(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    build = subprocess.run(["sh", str(BUILD), str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    built = time.monotonic()
    run = subprocess.run(
        [str(tmp_path / "scenario")],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=180,
        env={**os.environ, "LLMSERVE_ADDRESS": server.address},
    )
    print(f"C++ client: build {built - started:.0f} s, scenario {time.monotonic() - built:.0f} s")
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    check(run.stdout, server.address)
