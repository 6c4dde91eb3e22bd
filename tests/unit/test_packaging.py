"""Packaging: stubs match the proto; the client imports without llama-cpp-python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("llmserve_pb2.py", "llmserve_pb2.pyi", "llmserve_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    from grpc_tools import protoc

    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(ROOT / "proto/llmserve/v1/llmserve.proto"),
    ]
    assert protoc.main(args) == 0
    for name in GENERATED:
        fresh = (tmp_path / "llmserve/v1" / name).read_text()
        committed = (ROOT / "client/llmserve/v1" / name).read_text()
        assert fresh == committed, f"{name} drifted from proto/: run `make proto`"


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
