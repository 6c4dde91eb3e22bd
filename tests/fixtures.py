"""Fixture factories: a test module's own server, defined in one line.

    two_slot_server = module_server(["-np", "2", ...], "slow", metrics=True)

is a module-scoped fixture named `two_slot_server` that starts `llmserve serve` with these
flags once for the module and stops it after (its exit code must be 0: harness.server.serving)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.server import RunningServer, free_port, serving


def module_server(args: list[str], name: str, *, http: bool = False, doc: str = "", **options: Any) -> Any:
    """A module-scoped fixture serving `args` (its log under a temporary folder `name`);
    `http`: the OpenAI HTTP API too, on a port free when the fixture starts; `options`:
    start_server's (metrics=True, env=...)."""

    def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
        ports = {"http_port": free_port()} if http else {}
        with serving(args, tmp_path_factory.mktemp(name) / "server.log", **options, **ports) as server:
            yield server

    running.__doc__ = doc or f"A server for this module: {' '.join(args)}"
    return pytest.fixture(scope="module")(running)
