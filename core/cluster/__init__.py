"""Several ``agentik run`` processes (workers) on one PostgreSQL database: one bot.

What lives here is what every worker shares about itself: its identity
(:func:`new_worker_id`), the ``[cluster]`` settings (:class:`ClusterSettings`),
and the names of the leases it takes (:func:`connection_lease`).  The leases and
the worker registry are store repositories
(:class:`~agentik.core.store.repositories.LeaseRepository`,
:class:`~agentik.core.store.repositories.WorkerRepository`); a bot's use of them
(who owns which chat connection, failover, drain) is
:mod:`agentik.bot.ownership`.  docs/operations.md, "Running several workers".
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Annotated

from pydantic import Field, model_validator

from ..settings import Blank, settings_dataclass

__all__ = [
    "CONNECTION_PREFIX",
    "CONVERSATION_PREFIX",
    "ClusterSettings",
    "connection_lease",
    "conversation_lease",
    "new_worker_id",
]

#: The prefix of the leases that say which worker owns a chat connection.
CONNECTION_PREFIX = "conn:"


def connection_lease(transport: str) -> str:
    """The name of the lease owning transport instance ``transport``'s connection."""
    return f"{CONNECTION_PREFIX}{transport}"


#: The prefix of the leases that say which worker runs a conversation's turns now.
CONVERSATION_PREFIX = "conv:"


def conversation_lease(conversation_id: str) -> str:
    """The name of the lease of the worker running conversation ``conversation_id``."""
    return f"{CONVERSATION_PREFIX}{conversation_id}"


@settings_dataclass
class ClusterSettings:
    """``[cluster]``: workers sharing one PostgreSQL database (leases, heartbeats)."""

    #: Seconds a connection's lease lasts without a renewal: how long a worker
    #: that died unannounced (kill -9, a lost machine) keeps its connections
    #: before another takes them over.
    lease_seconds: Annotated[float, Field(ge=1.0, le=600.0)] = 15.0
    #: Seconds between heartbeats: each renews the leases held and tries to take
    #: the free ones.  Less than half of ``lease_seconds``.
    heartbeat_seconds: Annotated[float, Field(ge=0.1, le=300.0)] = 5.0
    #: This worker's name in ``/health`` and the leases (a random suffix is
    #: added, so two processes never share one); unset: ``host:pid``.
    worker_name: Blank = None
    #: Seconds between the resyncs every follower of notifications gets anyway
    #: (access grants, channel settings re-read): how long a lost ``NOTIFY``
    #: can delay a change at worst (:mod:`agentik.core.cluster.notify`).
    poll_seconds: Annotated[float, Field(ge=1.0, le=3600.0)] = 30.0

    @model_validator(mode="after")
    def _heartbeat_fits(self) -> ClusterSettings:
        if self.heartbeat_seconds >= self.lease_seconds / 2:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds:g}) must be less than half of"
                f" lease_seconds ({self.lease_seconds:g}): a lease must survive a missed beat"
            )
        return self


def new_worker_id(name: str | None = None) -> str:
    """A worker id no other process has: ``host:pid:suffix``, or ``name:suffix``."""
    suffix = secrets.token_hex(3)
    if name:
        return f"{name}:{suffix}"
    return f"{socket.gethostname()}:{os.getpid()}:{suffix}"
