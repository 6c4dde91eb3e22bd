"""Shared fixtures: the real server, started once per test session on loopback (the
harness it uses, harness/server.py, is shared with bench/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.server import CHAT_SERVER_ARGS, SERVER_ARGS, RunningServer, serving

# The Node >= 20.10 that `make tools` installs when the system's is older (Makefile, node-tool):
# first on PATH, as `make test` has it, so that pytest run by hand finds the same node and npm.
LOCAL_NODE_BIN = Path(__file__).resolve().parents[1] / ".tools" / "node" / "node_modules" / ".bin"
if LOCAL_NODE_BIN.is_dir() and str(LOCAL_NODE_BIN) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{LOCAL_NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(SERVER_ARGS, tmp_path_factory.mktemp("server") / "server.log", metrics=True) as running:
        yield running


@pytest.fixture(scope="session")
def fresh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A second server with the same flags, for runs that must not share the main
    server's prefix cache: a cached prefix computed in another batch would be reused
    (the allocator's job), and llama.cpp's kernels round differently with batch shape."""
    with serving(SERVER_ARGS, tmp_path_factory.mktemp("fresh") / "server.log") as running:
        yield running


@pytest.fixture(scope="session")
def model_path() -> Path:
    from llmserve.service.model.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A second server with a chat template from a file (the default model has none)."""
    with serving(CHAT_SERVER_ARGS, tmp_path_factory.mktemp("chat") / "server.log", metrics=True) as running:
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under CI a skip for a missing toolchain fails (tests/toolchains.py says why)."""
    from tests import toolchains

    outcome = yield
    report = outcome.get_result()
    if report.skipped and toolchains.under_ci() and toolchains.is_toolchain_skip(str(report.longrepr)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=1 and this test's toolchain is missing, so it fails instead of skipping: {reason}"
