"""Under CI a missing toolchain fails the test that needs it; elsewhere it skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _run_probe(ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", "tests/unit/tooling/toolchain_skip_probe.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("ci", ["1", "true"])
def test_under_ci_a_missing_toolchain_fails_with_its_make_target(ci: str) -> None:
    out = _run_probe(ci)
    assert out.returncode == 1, out.stdout
    assert "1 failed, 1 skipped" in out.stdout, out.stdout
    assert "frobnicator is not installed" in out.stdout and "make tools" in out.stdout


@pytest.mark.parametrize("ci", [None, "0"])
def test_outside_ci_it_skips(ci: str | None) -> None:
    out = _run_probe(ci)
    assert out.returncode == 0, out.stdout
    assert "2 skipped" in out.stdout, out.stdout


def test_ci_script_exports_ci() -> None:
    assert "export CI=1" in (ROOT / ".ci" / "run").read_text()
