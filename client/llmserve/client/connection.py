"""How the sync and asyncio clients open their channel and make their calls.

Channel: plaintext, TLS or mTLS credentials; the channel options of `policy` (the
published service config, which retries UNAVAILABLE and RESOURCE_EXHAUSTED and makes
calls wait for the channel to be ready, and keepalive within the server's
enforcement); several addresses become one round_robin target (`targets`).
Calls: the API key as `authorization: Bearer` metadata, and a deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from llmserve.v1 import llmserve_pb2 as pb

from .affinity import prefix_affinity_key
from .policy import default_channel_options
from .targets import list_target, split_host_port

Target = str | Sequence[str]


AFFINITY_HEADER = "x-llmserve-affinity"  # balancers route on it (docs/deployment.md)


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach a server.

    tls: use TLS, trusting the system roots or `root_certificates` (a PEM file, which
    implies TLS); `client_cert` and `client_key` (PEM files) for mTLS; `server_name`:
    the name the server's certificate must carry when the address does not name it.
    `api_key`: sent as `authorization: Bearer <key>` on every call. `timeout`: the
    default deadline of each call in seconds (a call's own `timeout=` wins; None: no
    deadline). `wait_for_ready`: None follows the service config (calls wait for the
    server to be reachable, until their deadline); False fails at once with
    UNAVAILABLE. `retries`: the service config's retry policy (False turns it off).
    `options`: further gRPC channel options; they win over the defaults.
    `extra_metadata`: more (key, value) pairs sent on every call, e.g. a W3C `traceparent`.
    `affinity_key`: sent as `x-llmserve-affinity` on Generate calls (a load balancer such
    as the project's Envoy config hashes it to one replica, e.g. a tenant id); without
    it a named session's `session_id` is sent; and with `derive_affinity`, without
    either, a key derived from the head of a one-shot call's input (affinity.py).
    """

    tls: bool = False
    root_certificates: Path | str | None = None
    client_cert: Path | str | None = None
    client_key: Path | str | None = None
    server_name: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    wait_for_ready: bool | None = None
    retries: bool = True
    options: Sequence[tuple[str, Any]] = ()
    extra_metadata: Sequence[tuple[str, str]] = ()
    affinity_key: str | None = None
    derive_affinity: bool = False  # opt-in: bench.routing's numbers in docs/deployment.md

    @property
    def secure(self) -> bool:
        return bool(self.tls or self.root_certificates or self.client_cert)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.secure:
            return None
        if bool(self.client_cert) != bool(self.client_key):
            raise ValueError("mTLS needs both client_cert and client_key")
        read = lambda p: Path(p).read_bytes() if p else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.root_certificates), read(self.client_key), read(self.client_cert))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        auth = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()
        return (*auth, *self.extra_metadata)

    def call_kwargs(self, timeout: float | None = None, config: pb.SessionConfig | None = None,
                    head: pb.Input | None = None) -> dict[str, Any]:
        """Keyword arguments of one call: `timeout` if given, else the client's default.
        A Generate call passes its `config` and, when one-shot, its input (`head`) for the
        affinity header: the caller's key, else the session id, else the LoRA adapter's
        name (`a-<name>`: calls for one adapter prefer a replica that has it loaded), else
        the model's (`m-<name>`, a model other than the default: likewise), else (with
        `derive_affinity`) a key derived from the head."""
        session_id = config.session_id if config is not None else ""
        adapter = config.adapter.name if config is not None and config.HasField("adapter") else ""
        model = config.model if config is not None else ""
        affinity = (self.affinity_key or session_id or (f"a-{adapter}" if adapter else "")
                    or (f"m-{model}" if model else ""))
        if not affinity and head is not None and self.derive_affinity:
            affinity = prefix_affinity_key(head)
        return {
            "timeout": timeout if timeout is not None else self.timeout,
            "metadata": (*self.metadata(), (AFFINITY_HEADER, affinity)) if affinity else self.metadata(),
            "wait_for_ready": self.wait_for_ready,  # None leaves it to the service config
        }


def channel_target(target: Target, options: ConnectionOptions) -> tuple[str, list[tuple[str, Any]]]:
    """The gRPC target and channel options.

    `target`: one address (`host:port`, or any gRPC target such as `dns:///name:port`),
    or a list of `host:port` addresses. A list, or a `dns:` name, is balanced with
    round_robin; the first entry of a list is the authority, and the name TLS checks.
    """
    args: dict[str, Any] = dict(default_channel_options(retries=options.retries))
    if not isinstance(target, str):
        entries = list(target)
        if not entries:
            raise ValueError("no server address")
        if len(entries) == 1:
            target = entries[0]
        else:
            target = list_target(entries)
            args["grpc.default_authority"] = entries[0]
            if options.secure:
                args["grpc.ssl_target_name_override"] = split_host_port(entries[0])[0]
    if options.server_name:
        args["grpc.ssl_target_name_override"] = options.server_name
    if "," in target or target.startswith("dns:"):
        args["grpc.lb_policy_name"] = "round_robin"
    args.update(dict(options.options))
    return target, list(args.items())


def open_channel(target: Target, options: ConnectionOptions, *, aio: bool = False) -> Any:
    """A `grpc.Channel` (or `grpc.aio.Channel` with `aio=True`) to `target`."""
    target, args = channel_target(target, options)
    creds = options.credentials()
    module: Any = grpc.aio if aio else grpc
    return module.secure_channel(target, creds, args) if creds else module.insecure_channel(target, args)
