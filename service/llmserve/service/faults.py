"""Test-only fault injection: `LLMSERVE_INJECT_FAULT=<kind>:<target>`, parsed here for every hook.

| kind | target | where |
|---|---|---|
| `die` | a request id | engine/executor/executor.py: the executor thread dies when that session opens |
| `stall` | a request id | engine/executor/executor.py: the executor thread blocks when that session opens |
| `save_halfway` | a session id | engine/session_store.py: every save of it after the first fails halfway (ENOSPC) |
| `slow_load` | seconds | process.py: the model load waits that long first |

Read when a hook's owner is built (not at import), so a test may set it first.
"""

from __future__ import annotations

import os
from typing import NamedTuple

ENV = "LLMSERVE_INJECT_FAULT"


class Fault(NamedTuple):
    kind: str  # "" when none is injected
    target: str


def injected_fault() -> Fault:
    """The fault the environment injects (kind "" for none)."""
    kind, _, target = os.environ.get(ENV, "").partition(":")
    return Fault(kind, target)


def injected_target(kind: str) -> str | None:
    """The target of an injected fault of `kind`, or None (none, or another kind)."""
    fault = injected_fault()
    return fault.target if fault.kind == kind else None
