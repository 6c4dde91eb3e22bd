"""buf lint (STANDARD, one documented exception in proto/buf.yaml) and buf breaking
against the last release's image (proto/releases/, built with `buf build proto -o`):
every FILE rule against v0.2.0, and the wire format and JSON names against v0.1.0
(v0.2.0 moved the baseline only for the file options go_package, java_package...,
which change generated code's names, not a byte on the wire). The vendored
google/rpc protos compile."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUF = ROOT / "node_modules" / ".bin" / "buf"
LAST_RELEASE = ROOT / "proto" / "releases" / "v0.2.0.binpb"
FIRST_RELEASE = ROOT / "proto" / "releases" / "v0.1.0.binpb"
WIRE_JSON = '{"version":"v2","modules":[{"path":".","excludes":["third_party"]}],"breaking":{"use":["WIRE_JSON"]}}'


def _buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert BUF.exists(), "buf is installed by `make tools` (npm @bufbuild/buf)"
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_is_clean() -> None:
    out = _buf("lint", "proto")
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_breaking_change_since_the_last_release() -> None:
    out = _buf("breaking", "proto", "--against", str(LAST_RELEASE))
    assert out.returncode == 0, out.stdout + out.stderr


def test_wire_and_json_unchanged_since_the_first_release() -> None:
    out = _buf("breaking", "--against", str(FIRST_RELEASE), "--config", WIRE_JSON, cwd=ROOT / "proto")
    assert out.returncode == 0, out.stdout + out.stderr


def test_vendored_error_detail_protos_compile(tmp_path: Path) -> None:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    third_party = ROOT / "proto" / "third_party"
    files = ["google/rpc/status.proto", "google/rpc/error_details.proto", "google/rpc/code.proto"]
    args = ["protoc", f"-I{third_party}", f"-I{include}", f"--python_out={tmp_path}", *files]
    assert protoc.main(args) == 0
    assert (tmp_path / "google" / "rpc" / "error_details_pb2.py").exists()
