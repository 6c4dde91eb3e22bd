"""Packaging: stubs match the proto; the client imports without llama-cpp-python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GENERATED = tuple(f"llmserve/v1/llmserve_pb2{suffix}" for suffix in (".py", ".pyi", "_grpc.py")) + (
    "xds/data/orca/v3/orca_load_report_pb2.py", "xds/service/orca/v3/orca_pb2.py", "xds/service/orca/v3/orca_pb2_grpc.py",
)


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    """buf.gen.yaml's Python plugins (make gen / make proto) give the committed stubs."""
    assert (ROOT / "node_modules/.bin/buf").exists(), "run `make tools` (npm ci: buf)"
    subprocess.run([sys.executable, "-m", "tools.gen", "--lang", "python", "--out", str(tmp_path)], cwd=ROOT, check=True)
    for name in GENERATED:
        fresh = (tmp_path / "client" / name).read_text()
        committed = (ROOT / "client" / name).read_text()
        assert fresh == committed, f"{name} drifted from proto/: run `make proto`"
    assert not (tmp_path / "client/google").exists(), "google.rpc comes from grpcio-status, not our stubs"


def test_client_imports_without_llama_cpp() -> None:
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "import llmserve.client, llmserve.v1.llmserve_pb2\n"
        "assert 'llama_cpp' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_generic_top_level_packages(tmp_path: Path) -> None:
    # Run outside the checkout so only what is installed can be found.
    code = (
        "import importlib.util as u\n"
        "assert u.find_spec('service') is None and u.find_spec('client') is None\n"
        "assert u.find_spec('llmserve.service') and u.find_spec('llmserve.client')\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, cwd=tmp_path)
