"""buf lint (STANDARD, one documented exception in proto/buf.yaml) and buf breaking
against the last release's image (proto/releases/, built with `buf build`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"
LAST_RELEASE = ROOT / "proto" / "releases" / "v0.1.0.binpb"


def _buf(*args: str) -> subprocess.CompletedProcess[str]:
    assert BUF.exists(), "buf is installed by `make tools` (npm @bufbuild/buf)"
    return subprocess.run([str(BUF), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_buf_lint_is_clean() -> None:
    out = _buf("lint", "proto")
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_breaking_change_since_the_last_release() -> None:
    out = _buf("breaking", "proto", "--against", str(LAST_RELEASE))
    assert out.returncode == 0, out.stdout + out.stderr
