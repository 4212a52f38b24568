"""Node agent addresses: a Unix socket path or a loopback TCP port, nothing else."""

from __future__ import annotations

import ipaddress
import socket

from venusrl.sandbox.errors import InvalidRequest


def parse_address(address: str) -> tuple[str, object]:
    """`unix:/path` -> ("unix", "/path"); `tcp:127.0.0.1:7000` -> ("tcp", ("127.0.0.1", 7000))."""
    kind, sep, rest = address.partition(":")
    if kind == "unix" and sep and rest.startswith("/"):
        return "unix", rest
    if kind == "tcp" and sep:
        host, _, port = rest.rpartition(":")
        try:
            loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise InvalidRequest(f"address: node agents listen on loopback only, got host {host!r}")
        if not port.isdigit() or int(port) > 65535:
            raise InvalidRequest(f"address: bad TCP port {port!r}")
        return "tcp", (host.strip("[]"), int(port))
    raise InvalidRequest(f"address: expected unix:/PATH or tcp:LOOPBACK:PORT, got {address!r}")


def connect(address: str, timeout: float) -> socket.socket:
    kind, target = parse_address(address)
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET  # type: ignore[index]
        sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(target)  # type: ignore[arg-type]
    except OSError:
        sock.close()
        raise
    return sock
