"""The generated Java client (gen/java + client/examples/java) against the real server.

client/examples/java/build.sh compiles the stubs of `make gen` and Scenario.java with
Debian 12's jars; the program runs the scenario of tests/client_scenario.py, which checks
its output against the Python stubs. Skips, naming what is missing, without a JDK, a jar
or gen/java (`make client-tools`, then `make gen`; docs/clients.md).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import toolchains
from tests.client_scenario import check

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "client" / "examples" / "java" / "build.sh"


def missing_prerequisites() -> str | None:
    """What build.sh lacks (javac/java, a jar, gen/java), or None when it can build."""
    out = subprocess.run(["sh", str(BUILD), "--check"], capture_output=True, text=True, timeout=30)
    return None if out.returncode == 0 else (out.stderr.strip() or f"build.sh --check exit {out.returncode}")


def test_java_client_runs_the_scenario(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    missing = missing_prerequisites()
    if missing:
        pytest.skip(toolchains.missing(f"Java client not buildable here: {missing}", "make client-tools && make gen"))
    build = subprocess.run(
        ["sh", str(BUILD), str(tmp_path / "java")], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(
        [str(tmp_path / "java" / "run.sh")], capture_output=True, text=True, timeout=240,
        env={**os.environ, "LLMSERVE_ADDRESS": server.address},
    )
    print(run.stdout)
    print(run.stderr[-3000:])
    assert run.returncode == 0, run.stdout + run.stderr
    check(run.stdout, server.address)
