"""The grammar worker: a subprocess that converts JSON schemas and parses GBNF.

llama.cpp's grammar parser recurses without bound (a deep grammar overflows the
stack: SIGSEGV), llama-cpp-python's schema converter can build strings of any size
(`minItems: 100000000` grows RSS by gigabytes), and both run for as long as they
like. Run in a process of their own, with a memory limit (RLIMIT_DATA), a smaller
stack than the server's executor thread, and a budget of its own CPU time for each
request (RLIMIT_CPU, raised before each one to what the worker has used plus the budget:
past it the kernel ends the worker with SIGXCPU), none of that can reach the server.
CPU time, not the wall clock: waiting for a busy machine's CPU is not the schema's cost.

Protocol: {"ready": true} once the vocabulary is loaded; then one JSON object per line on stdin ({"kind": one of grammar_sources.KINDS,
"text": ...}); one per line on the protocol fd ({"ok": true, "gbnf": ...} or
{"ok": false, "error": ...}). llama.cpp's own output (fd 1 and 2, and its log
callback) is captured and becomes the error's reason.

    python -m llmserve.service.model.grammar_worker MODEL_PATH MAX_DATA_BYTES CPU_SECONDS
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import sys
import tempfile
import threading

STACK_BYTES = 2 << 20  # the executor thread has the default 8 MiB: what parses here fits there


def _cpu_budget(seconds: float) -> None:
    """SIGXCPU once this process has used `seconds` more CPU time (whole seconds: the
    kernel counts RLIMIT_CPU in seconds, so the budget is `seconds` to `seconds` + 1)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _serve(model_path: str, protocol: int, cpu_seconds: float) -> None:
    import llama_cpp
    from llmserve.service.model.grammar_sources import to_gbnf

    log: list[str] = []

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        if level >= 3:  # warnings and errors: a grammar's reason arrives here
            log.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise SystemExit(f"grammar worker: cannot load the vocabulary of {model_path}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    captured = tempfile.TemporaryFile()
    os.dup2(captured.fileno(), 1)
    os.dup2(captured.fileno(), 2)
    out = os.fdopen(protocol, "w", buffering=1)
    out.write('{"ready": true}\n')  # loaded: from here on, the CPU time is the requests'
    for line in sys.stdin:
        request = json.loads(line)
        _cpu_budget(cpu_seconds)
        log.clear()
        captured.seek(0)
        captured.truncate()
        try:
            gbnf = to_gbnf(request["kind"], request["text"])
            smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        except Exception as exc:  # noqa: BLE001 - the converter raises many kinds on bad schemas
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        else:
            if smpl:
                llama_cpp.llama_sampler_free(smpl)
                reply = {"ok": True, "gbnf": gbnf}
            else:
                captured.seek(0)
                detail = " ".join((captured.read().decode("utf-8", "replace") + " ".join(log)).split())
                reply = {"ok": False, "error": detail[:400] or "the grammar does not parse"}
        out.write(json.dumps(reply) + "\n")


def main() -> None:
    os.nice(10)  # yield the CPU to the server's decode threads
    model_path, max_data, cpu_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    protocol = os.dup(1)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (max_data, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU and SIGSEGV would dump a core
    threading.stack_size(STACK_BYTES)
    worker = threading.Thread(target=_serve, args=(model_path, protocol, cpu_seconds), name="grammar-worker")
    worker.start()
    worker.join()


if __name__ == "__main__":
    main()
