"""What every SDK channel is opened with: llmserve's published gRPC service config
(`service_config.json`: retries and wait-for-ready) and keepalive settings that stay
within the server's ping enforcement. Other languages load the same JSON (README,
"Retries and keepalive").

Retries: a call that ends UNAVAILABLE (the server is loading, draining or gone; with
several addresses the next attempt may reach another one) or RESOURCE_EXHAUSTED (the
waiting queue is full) is tried again, 5 attempts in all, after a random backoff of up
to 0.5 s, 1 s, 2 s, 4 s (a model loads in seconds); a server's `grpc-retry-pushback-ms`
trailer replaces the backoff. retryThrottling keeps a token bucket of 10 (a failed
attempt takes one, a success gives back 0.1) and retries nothing while half or less is
left, so an overloaded server is not hit five times harder. gRPC retries a call only
until the first response arrives (or more than 256 KiB of requests were sent): the
unary calls; Embed; Generate before its first response, i.e. a session that was
refused, never a turn that has streamed tokens. The policy cannot see one case: a proxy
(Envoy) that resets a stream before any response because its replica died reports
INTERNAL; the SDK's one-shot calls make that call again themselves (`resets`).

waitForReady: while the server is down or restarting a call waits for the channel to
connect, until its deadline, instead of failing at once. (A call without a deadline
waits for ever: give the client a `timeout`.)

Keepalive: the server refuses client pings more often than `--keepalive-min-time`
(10 s by default; more often: GOAWAY too_many_pings) and pings idle connections itself
every `--keepalive-time` (60 s). The client pings every 30 s while calls are open, also
on a stream that is quiet for a long time (a session waiting for a slot or for its next
turn), none on a connection without calls (so it stays within gRPC's default
enforcement too), and drops a connection whose ping is not answered within 20 s.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SERVICE_CONFIG_JSON: str = resources.files(__package__).joinpath("service_config.json").read_text(encoding="utf-8")
SERVICE_CONFIG: dict[str, Any] = json.loads(SERVICE_CONFIG_JSON)

KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 30_000),  # the server accepts one every 10 s (--keepalive-min-time)
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),  # a long-quiet stream keeps being checked
)


def default_channel_options(*, retries: bool = True) -> list[tuple[str, Any]]:
    """The service config and keepalive options; `retries=False` keeps wait-for-ready only."""
    return [
        ("grpc.service_config", SERVICE_CONFIG_JSON),
        ("grpc.enable_retries", 1 if retries else 0),
        *KEEPALIVE_OPTIONS,
    ]
