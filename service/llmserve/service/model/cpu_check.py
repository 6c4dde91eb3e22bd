"""Whether this llama.cpp build's CPU kernels run on this machine, checked before the first decode.

A build made with `-march=native` on a CPU that reports Intel AMX uses ggml's AMX kernels,
and on a VM that reports AMX without running it every `llama_decode` dies (a general-protection
fault on `ldtilecfg` in `ggml_backend_amx_mul_mat`, seen on an AMX Xeon VM): a signal in the
server's own process, which no caller can catch. So a build that says it uses AMX decodes a few
tokens in a child process first, once per process; where that child dies by a signal the server
stops with a RuntimeError that says how to rebuild (`make install` builds without AMX).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import llama_cpp

AMX_MARK = "AMX_INT8 = 1"  # llama_print_system_info()'s word for a build with AMX kernels
PROBE_TOKENS = 32  # a batch, as a prompt chunk is: one token might not reach the matrix kernels
PROBE_TIMEOUT_S = 120.0
REBUILD = ("pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36 with "
           "CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
           "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" (what `make install` does)")
_PROBE = """
import sys
import llama_cpp
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_threads=1, verbose=False)
model.eval(list(range(1000, 1000 + int(sys.argv[2]))))
"""
_checked: set[str] = set()  # the builds found to run here (their system info)


def check_cpu_kernels(model_path: Path, system_info: str | None = None, probe: str = _PROBE) -> None:
    """Return when the build's kernels decode on this machine (or when its kernels need no
    check); RuntimeError naming the fix when a child that decodes dies by a signal.
    `system_info` and `probe` are the tests' (default: this build's, a real decode)."""
    info = system_info if system_info is not None else llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    if AMX_MARK not in info or info in _checked:
        return
    child = subprocess.run([sys.executable, "-c", probe, str(model_path), str(PROBE_TOKENS)],
                           capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        raise RuntimeError(
            f"llama.cpp's AMX kernels die on this machine ({name} in a test decode of {model_path.name}): "
            f"a CPU or VM that reports Intel AMX without running it. Rebuild llama-cpp-python without AMX: {REBUILD}")
    _checked.add(info)
