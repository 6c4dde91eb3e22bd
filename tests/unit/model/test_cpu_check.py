"""The start-up check of llama.cpp's CPU kernels (model/cpu_check.py): a build with AMX kernels
decodes in a child process first, and a child that dies by a signal stops the start with a
RuntimeError that says how to rebuild, instead of the server dying at its first decode."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmserve.service.model import cpu_check
from llmserve.service.model.default_model import default_model_path

AMX_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | OPENMP = 1 | "
NO_AMX_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 | "
DIES = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"  # what ldtilecfg's fault does to a decode


def _recording(marker: Path) -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"


@pytest.fixture(autouse=True)
def fresh_checks() -> None:
    cpu_check._checked.clear()


def test_a_build_without_amx_runs_no_child(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cpu_check.check_cpu_kernels(tmp_path / "model.gguf", NO_AMX_BUILD, _recording(marker))
    assert not marker.exists()


def test_a_child_that_dies_by_a_signal_stops_the_start_saying_how_to_rebuild(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as raised:
        cpu_check.check_cpu_kernels(tmp_path / "model.gguf", AMX_BUILD, DIES)
    message = str(raised.value)
    assert "SIGSEGV" in message and "model.gguf" in message and "-mno-amx-int8" in message


def test_a_build_that_runs_is_checked_once_per_process(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cpu_check.check_cpu_kernels(tmp_path / "model.gguf", AMX_BUILD, _recording(marker))
    assert marker.read_text() == "ran"
    marker.unlink()
    cpu_check.check_cpu_kernels(tmp_path / "model.gguf", AMX_BUILD, _recording(marker))
    assert not marker.exists()  # the second model of the process: no second child


def test_a_child_that_fails_without_a_signal_is_left_to_the_load(tmp_path: Path) -> None:
    """A file llama.cpp cannot load fails in the child too: the server's own load says so."""
    cpu_check.check_cpu_kernels(tmp_path / "not-a-model.gguf", AMX_BUILD, "raise SystemExit(1)\n")


def test_the_real_probe_decodes_the_default_model_here() -> None:
    """The probe as shipped (a real decode of the default model) passes on a build that runs."""
    cpu_check.check_cpu_kernels(default_model_path(), AMX_BUILD)
    assert AMX_BUILD in cpu_check._checked
