"""Ports for servers a test or a benchmark starts, from a block below the kernel's
ephemeral range (standard library only: the benchmarks load this file by path, and a
plugin's own tests may use it: ``worker_block(16000, 250).take()``).

Not the kernel's ``bind(0)``: that port comes from the ephemeral range, and under load
an outgoing connection of any process (a client, a database pool) could take it as its
local port before the server binds it ("Address already in use", seen in CI).  Ports
below that range are never given to outgoing connections.  A :class:`PortBlock` walks
its ports from a place the process id picks (two runs on one machine start apart),
skipping ports that are bound or in ``TIME_WAIT``.
"""

from __future__ import annotations

import os
import socket

__all__ = ["PortBlock", "worker_block"]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PortBlock:
    """The ports ``start`` to ``start + size - 1``, handed out by :meth:`take`."""

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size
        self._next: int | None = None

    def take(self, host: str = "127.0.0.1") -> int:
        """A TCP port on ``host`` that is free now (the kernel's, on a machine whose
        ephemeral range starts inside the block, or when the block is all taken)."""
        if self.start + self.size > _ephemeral_low():
            return _kernel_port(host)
        if self._next is None:
            self._next = os.getpid() % self.size
        for _ in range(self.size):
            port = self.start + self._next
            self._next = (self._next + 1) % self.size
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
        return _kernel_port(host)


def worker_block(floor: int, size: int, workers: int = 8) -> PortBlock:
    """This pytest-xdist worker's block of ``size`` ports from ``floor`` (worker ``gwN``
    takes block ``N % workers``; no xdist: the first), so workers running side by side
    never hand out the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    n = int(worker) % workers if worker.isdigit() else 0
    return PortBlock(floor + n * size, size)
