"""The coding agents people point at local servers, against the real server and model:
Claude Code (npm @anthropic-ai/claude-code, `/v1/messages`) and Codex CLI (npm @openai/codex,
`/v1/responses`), both pinned in package.json and installed by `make tools`, run offline with
the base URL set to the server. Each gets a task that needs a tool call; the case passes
when the agent ran a tool the model called (Claude Code's Write, with the input its schema
requires; a command Codex executed) and went on to a second model turn with its result,
without an API error.

The tiny default model calls a tool on most replies, not all (Claude Code sends no
temperature, so it samples), so the Claude Code case tries up to six times; Codex calls
`exec_command` on most replies, so its case stops it after the second command, and tries
again when a reply ran on to the server's `-n 256` (Codex ends such a turn as incomplete).
The server's `-n` (llama-server's flag: a turn's max tokens when the request sets none) is
checked here too: the agents send no max tokens."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.server import RunningServer, free_port, start_server, stop_server
from tests.toolchains import missing

KEY = "agent-cli-key"
MODEL = "gemma-3-270m-q4_k_m"
BIN = Path(__file__).parents[3] / "node_modules" / ".bin"
QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
         "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def _tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(missing(f"{path} (npm)", "make tools"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["-np", "1", "-c", "16384", "-t", "2", "--api-key", KEY, "-n", "256"]  # -n: a reply that runs on ends
    running = start_server(args, tmp_path_factory.mktemp("agents") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


def _claude(server: RunningServer, home: Path, work: Path) -> list[dict[str, Any]]:
    """One Claude Code run's stream-json events."""
    env = {**os.environ, **QUIET, "HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.http_port}",
           "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512"}  # its default, 32000, is more than the slot's context
    done = subprocess.run(
        [str(_tool("claude")), "-p", "Write the word hi into a file named hello.txt", "--max-turns", "2",
         "--tools", "Write", "--allowedTools", "Write", "--output-format", "stream-json", "--verbose",
         "--system-prompt", "You are a coding agent. Always answer by calling the Write tool."],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _blocks(events: list[dict[str, Any]], role: str, kind: str) -> list[dict[str, Any]]:
    return [block for e in events if e.get("type") == role for block in e["message"].get("content", [])
            if isinstance(block, dict) and block.get("type") == kind]


def test_claude_code_calls_a_tool_and_goes_on(server: RunningServer, tmp_path: Path) -> None:
    tries = []
    for attempt in range(6):  # the model samples: most replies call the tool, not all
        work = tmp_path / f"work{attempt}"
        work.mkdir()
        events = _claude(server, tmp_path / "home", work)
        result = next(e for e in events if e.get("type") == "result")
        assert result.get("api_error_status") is None and "API Error" not in str(result.get("result")), result
        calls, results = _blocks(events, "assistant", "tool_use"), _blocks(events, "user", "tool_result")
        tries.append((len(calls), len(results), result["num_turns"]))
        # a call the model finished (one cut by the 512-token cap streams partial input, as Anthropic's does)
        whole = [c for c in calls if c["name"] == "Write" and {"file_path", "content"} <= set(c["input"])]
        answered = [c for c in whole if any(r["tool_use_id"] == c["id"] for r in results)]
        if answered:  # the model called Write, Claude Code ran it and sent the result back ...
            assert result["num_turns"] >= 2  # ... and the model answered it
            return
    pytest.fail(f"no attempt called the Write tool and went on: (calls, results, turns) {tries}")


CODEX_CONFIG = """model = "{model}"
model_provider = "llmserve"
approval_policy = "never"
sandbox_mode = "workspace-write"
web_search = "disabled"

[agents]
enabled = false

[features]
goals = false

[tools]
view_image = false

[model_providers.llmserve]
name = "llmserve"
base_url = "http://127.0.0.1:{port}/v1"
env_key = "LLMSERVE_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""  # no web search, subagents or goals (a prompt of ~25 KB, not ~30 KB); a failed turn fails at once


def _codex(server: RunningServer, home: Path, work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One Codex run's events, until it has run two tools (then it is stopped), it fails, or
    it ends; and the tools' items (commands, mostly)."""
    env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(home.parent), "LLMSERVE_KEY": KEY}
    codex = subprocess.Popen(
        [str(_tool("codex")), "exec", "--json", "--skip-git-repo-check", "Run the shell command: echo hi > hello.txt"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events: list[dict[str, Any]] = []
    commands: list[dict[str, Any]] = []
    deadline = time.monotonic() + 240
    try:
        assert codex.stdout is not None
        for line in codex.stdout:
            event = json.loads(line)
            events.append(event)
            item = event.get("item", {})
            if event["type"] == "item.completed" and item.get("type") not in ("agent_message", "reasoning", "error"):
                commands.append(item)  # a tool Codex ran on the model's call (a command, mostly)
            if len(commands) >= 2 or event["type"] in ("turn.failed", "error") or time.monotonic() > deadline:
                break
    finally:
        codex.kill()
        codex.wait()
    return events, commands


def test_codex_runs_a_command_the_model_called_and_goes_on(server: RunningServer, tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(model=MODEL, port=server.http_port))
    ends = []
    # The model samples; a reply it runs on to -n's cap ends Codex's turn ("incomplete"). Measured: the
    # first five attempts all ran on in 1 of 3 runs, before and after this file's last server change.
    for attempt in range(12):
        work = tmp_path / f"work{attempt}"
        work.mkdir()
        events, commands = _codex(server, home, work)
        errors = [e for e in events if e["type"] in ("turn.failed", "error")]
        # never an API error object, but the one that refuses a conversation the agent grew past the slot's
        # context (a CI run: an attempt whose replies ran on reached 16,437 tokens; the server's 400 is right)
        refused = [e for e in errors if '"type": "' in e.get("message", "") and "per-slot context" not in e["message"]]
        assert not refused, errors
        if len(commands) >= 2:  # a call ran, its output went back, and the next reply called again
            assert all(c.get("status") in ("completed", "failed") for c in commands), commands
            return
        ends.append(events[-1:])
    pytest.fail(f"no attempt ran two commands: {ends}")


def test_n_predict_caps_a_turn_that_sets_no_max_tokens(server: RunningServer) -> None:
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell a story."}],
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 256
