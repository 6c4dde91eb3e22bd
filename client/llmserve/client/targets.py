"""Turning a list of `host:port` addresses into one gRPC target.

gRPC's `ipv4:`/`ipv6:` schemes take several addresses (balanced with round_robin)
but only IP literals. Host names in a list are therefore resolved here, once, with
`socket.getaddrinfo` (every address a name has is used), and the target lists IPv4
addresses when every entry has one, else IPv6. Names are not resolved again later:
for a name whose addresses change, give one `dns:///name:port` target instead, which
gRPC re-resolves.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence


def split_host_port(entry: str) -> tuple[str, int]:
    """`host:port`, `1.2.3.4:port` or `[::1]:port` -> (host, port)."""
    if entry.startswith("["):
        host, _, port = entry[1:].partition("]:")
    else:
        host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{entry!r}: an address in a list must be host:port")
    return host, int(port)


def _addresses(entry: str) -> tuple[list[str], list[str]]:
    host, port = split_host_port(entry)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"{entry!r}: cannot resolve {host!r}: {exc.strerror}") from None
    v4 = [f"{info[4][0]}:{port}" for info in infos if info[0] == socket.AF_INET]
    v6 = [f"[{info[4][0]}]:{port}" for info in infos if info[0] == socket.AF_INET6]
    return v4, v6


def list_target(entries: Sequence[str]) -> str:
    """One `ipv4:a,b,...` or `ipv6:[a],[b],...` target for several host:port entries."""
    resolved = [_addresses(entry) for entry in entries]
    if all(v4 for v4, _ in resolved):
        scheme, addresses = "ipv4", [a for v4, _ in resolved for a in v4]
    elif all(v6 for _, v6 in resolved):
        scheme, addresses = "ipv6", [a for _, v6 in resolved for a in v6]
    else:
        raise ValueError(f"{list(entries)}: one channel cannot mix IPv4-only and IPv6-only servers")
    return f"{scheme}:{','.join(dict.fromkeys(addresses))}"  # without duplicates, in order
