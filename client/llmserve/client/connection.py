"""Channel options shared by the sync and asyncio clients: TLS, API key, retries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach a server.

    tls: use TLS (with the system roots, or `root_certificates`); `client_cert` and
    `client_key` (PEM files) for mTLS; `api_key` is sent as `authorization: Bearer`
    on every call; `timeout` is the default deadline of every call in seconds;
    `wait_for_ready` makes calls wait for the channel instead of failing fast;
    `extra_metadata`: more (key, value) pairs sent on every call, e.g. a W3C `traceparent`.
    """

    tls: bool = False
    root_certificates: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    api_key: str | None = None
    timeout: float | None = None
    wait_for_ready: bool = False
    options: Sequence[tuple[str, object]] = ()
    extra_metadata: Sequence[tuple[str, str]] = ()

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls or self.root_certificates or self.client_cert):
            return None
        read = lambda p: p.read_bytes() if p else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.root_certificates), read(self.client_key), read(self.client_cert))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        auth = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()
        return (*auth, *self.extra_metadata)

    def call_kwargs(self, timeout: float | None = None) -> dict[str, object]:
        return {
            "timeout": timeout if timeout is not None else self.timeout,
            "metadata": self.metadata(),
            "wait_for_ready": self.wait_for_ready,
        }


def channel_target(target: str | Sequence[str], options: ConnectionOptions) -> tuple[str, list[tuple[str, object]]]:
    """gRPC target and channel options. Several addresses become one `ipv4:`/`ipv6:`
    target with the round_robin policy; a `dns:///` name also balances with round_robin."""
    channel_options = list(options.options)
    if not isinstance(target, str):
        addresses = list(target)
        if len(addresses) == 1:
            target = addresses[0]
        else:
            scheme = "ipv6" if any(a.startswith("[") for a in addresses) else "ipv4"
            target = f"{scheme}:{','.join(addresses)}"
    if "," in target or target.startswith("dns:"):
        channel_options.append(("grpc.lb_policy_name", "round_robin"))
    return target, channel_options
