"""The `llmserve` client commands, run as a user would (real processes, real server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _llmserve(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmserve.service", *args], input=stdin, capture_output=True, text=True, timeout=120
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
    assert "plain text" in out.stderr  # the default model has no chat template
    assert out.stdout.count("> ") == 3  # two turns answered, then end of input


def test_bench_command_runs_the_load_generator(server) -> None:  # type: ignore[no-untyped-def]
    out = _llmserve("bench", "--address", server.address, "--concurrency", "2", "--rounds", "1", "--max-tokens", "4")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("| llmserve | 2 |"))
    assert row.rstrip().endswith("| 0 |")  # no errors
