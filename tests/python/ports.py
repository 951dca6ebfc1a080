"""ports.py — free loopback TCP ports for servers a test (or bench/router-prefix.py) starts on fixed ports.
Standard library only."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """n distinct ports free at the time of the call (bound at once so that none repeats, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
