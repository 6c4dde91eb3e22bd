"""The `llmserve` client commands, run as a user would (real processes, real server)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _env(**variables: str) -> dict[str, str]:
    """This process's environment without LLMSERVE_* variables, plus `variables`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LLMSERVE_")}, **variables}


def _llmserve(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmserve.service", *args], input=stdin, capture_output=True, text=True, timeout=120,
        env=env or _env(), cwd=cwd,
    )


def test_generate_prints_text_and_json(server) -> None:  # type: ignore[no-untyped-def]
    out = _llmserve("generate", "--address", server.address, "-n", "6", "--temperature", "0", "The capital of France is")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "LENGTH: 6 tokens" in out.stderr
    out = _llmserve("generate", "--address", server.address, "-n", "3", "--json", "Hello")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[-1]["turnEnd"]["usage"]["completionTokens"] == 3
    assert all("chunk" in line for line in lines[:-1])


def test_embed_files_and_stdin_to_jsonl(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "docs.txt"
    doc.write_text("first line\n\nsecond line\n")
    out = _llmserve("embed", "--address", server.address, str(doc))
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["first line", "second line"] and [r["index"] for r in rows] == [0, 1]
    out = _llmserve("embed", "--address", server.address, stdin="from stdin\n")
    assert json.loads(out.stdout)["text"] == "from stdin"


def test_tokenize_info_health_and_errors(server) -> None:  # type: ignore[no-untyped-def]
    tokens = json.loads(_llmserve("tokenize", "--address", server.address, "Hello world").stdout)
    assert tokens["ids"][0] == 2 and "".join(tokens["pieces"][1:]).replace("▁", " ") == "Hello world"
    info = json.loads(_llmserve("info", "--address", server.address).stdout)
    assert info["architecture"] == "gemma3"
    assert _llmserve("health", "--address", server.address).returncode == 0
    bad = _llmserve("generate", "--address", server.address, "--temperature", "-1", "hi")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr


def test_chat_keeps_one_session_over_turns(server) -> None:  # type: ignore[no-untyped-def]
    out = _llmserve("chat", "--address", server.address, "-n", "4", "--temperature", "0", stdin="Hello\nAnd again\n")
    assert out.returncode == 0, out.stderr
    assert "chat template" in out.stderr and "plain text" not in out.stderr  # the package's, for the default model
    assert out.stdout.count("> ") == 3  # two turns answered, then end of input


def test_bench_command_runs_the_load_generator_outside_a_checkout(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # From an empty directory, with only the installed packages' folders on the path
    # (not the checkout's root, which holds bench/ and tests/).
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env = _env(PYTHONPATH=os.pathsep.join(paths))
    probe = "import importlib.util as u; assert u.find_spec('bench') is None and u.find_spec('tests') is None"
    subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, check=True)
    out = _llmserve("bench", "--address", server.address, "--concurrency", "2", "--rounds", "1", "--max-tokens", "4",
                    env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("| llmserve | 2 |"))
    assert row.rstrip().endswith("| 0 |")  # no errors


def test_version() -> None:
    out = _llmserve("--version")
    assert out.returncode == 0 and out.stdout.strip() == "llmserve 0.1.0"


def test_health_reads_the_address_from_the_environment(server) -> None:  # type: ignore[no-untyped-def]
    out = _llmserve("health", env=_env(LLMSERVE_ADDRESS=server.address))
    assert out.returncode == 0 and out.stdout.strip() == f"{server.address}: SERVING"
    # Inside the server's container: no address, the server's own LLMSERVE_HOST and LLMSERVE_PORT.
    port = server.address.rsplit(":", 1)[1]
    out = _llmserve("health", env=_env(LLMSERVE_HOST="0.0.0.0", LLMSERVE_PORT=port))
    assert out.returncode == 0 and out.stdout.strip() == f"127.0.0.1:{port}: SERVING"
    out = _llmserve("info", env=_env(LLMSERVE_ADDRESS=server.address))
    assert out.returncode == 0 and json.loads(out.stdout)["architecture"] == "gemma3"


def test_a_bad_environment_value_is_one_line_naming_it(server) -> None:  # type: ignore[no-untyped-def]
    bad = _env(LLMSERVE_PORT="abc")
    for command in (["serve"], ["generate", "hi"], ["chat"], ["embed"], ["tokenize", "hi"], ["info"], ["health"]):
        out = _llmserve(*command, env=bad, stdin="")
        assert out.returncode == 2, (command, out.stderr)
        assert out.stderr.strip() == "llmserve: LLMSERVE_PORT='abc' is not a valid int", command
    out = _llmserve("serve", env=_env(LLMSERVE_EMBEDDINGS="maybe"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "LLMSERVE_EMBEDDINGS='maybe'" in out.stderr
    # A flag on the command line wins: the variable is not even read.
    assert _llmserve("health", "--address", server.address, env=bad).returncode == 0


def test_serve_on_a_client_only_install_names_the_server_extra(tmp_path: Path) -> None:
    # A sitecustomize that makes llama_cpp impossible to import, as without the [server] extra.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoLlama:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'llama_cpp':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoLlama())\n"
    )
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = _llmserve("serve", env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        "llmserve serve: the server needs the [server] extra (module 'llama_cpp' is missing): "
        "pip install 'llmserve[server]'"
    )
    assert _llmserve("--version", env=env).returncode == 0  # the client side still works


def test_chat_timeout_limits_each_turn_not_the_conversation(server) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    out = _llmserve("chat", "--address", server.address, "-n", "1500", "--temperature", "0", "--timeout", "1",
                    stdin="Tell me a very long story.\nAnd another one.\n")
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[stopped: the turn took longer than 1 s]") == 2  # both turns cut, the chat went on
    assert elapsed > 2


def test_embed_streams_its_input(server) -> None:  # type: ignore[no-untyped-def]
    process = subprocess.Popen(
        [sys.executable, "-m", "llmserve.service", "embed", "--address", server.address],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write("".join(f"streamed line {i}\n" for i in range(40)))
        process.stdin.flush()
        # Vectors come back while the input is still open: it is not read to the end first.
        assert select.select([process.stdout], [], [], 60)[0], "no output before the input ended"
        first = json.loads(process.stdout.readline())
        assert process.poll() is None
        process.stdin.write("the last line\n")
        process.stdin.close()
        rows = [first, *(json.loads(line) for line in process.stdout.read().splitlines())]
        assert process.wait(60) == 0
    finally:
        process.kill()
    assert [r["index"] for r in rows] == list(range(41))
    assert rows[0]["text"] == "streamed line 0" and rows[-1]["text"] == "the last line"


def test_embed_shows_a_tqdm_bar_on_a_terminal(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "lines.txt"
    doc.write_text("".join(f"line number {i}\n" for i in range(50)))
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0x0
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the terminal's last holder closed it
                return
            if not data:
                return
            seen.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = subprocess.run(
        [sys.executable, "-m", "llmserve.service", "embed", "--address", server.address, str(doc)],
        stdout=subprocess.PIPE, stderr=terminal, text=True, env=_env(), timeout=120,
    )
    os.close(terminal)
    reader.join(10)
    os.close(master)
    progress = b"".join(seen).decode(errors="replace")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 50
    assert "50 inputs" in progress and "inputs/s" in progress, progress
