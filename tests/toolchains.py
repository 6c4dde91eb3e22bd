"""Skips for a missing toolchain that turn into failures under CI.

Outside CI a test whose toolchain (Go, C++, Java, Node >= 20.10, docker-compose, Envoy)
is missing skips. Under CI (`CI=1`, exported by `.ci/run`) the same skip fails with the
reason and the `make` target that installs the toolchain, so that a CI run cannot go
green while skipping what docs/clients.md says it checks. `tests/conftest.py` turns the
skip into the failure (`pytest_runtest_makereport`)."""

from __future__ import annotations

import os

MARK = "toolchain missing"


def under_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


def missing(reason: str, target: str) -> str:
    """The skip reason for a missing toolchain; `target` is what installs it."""
    return f"{MARK}: {reason} (installed by `{target}`)"


def is_toolchain_skip(text: str) -> bool:
    return MARK in text
