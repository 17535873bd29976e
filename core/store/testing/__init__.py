"""``StoreContract``: the contract every store engine proves about itself.

Subclass it in a test module and provide one fixture, ``store``, yielding a
started engine (fresh and empty for each test)::

    import pytest_asyncio
    from agentik.core.store.testing import StoreContract

    class TestPostgresContract(StoreContract):
        @pytest_asyncio.fixture
        async def store(self, postgres_url):
            async with PostgresStore(postgres_url) as s:   # your engine
                yield s

The cases are grouped by aggregate, one mixin each, so an engine may run a
part of the contract while it grows (:class:`LogContract`,
:class:`OutboxContract`, :class:`WaitsContract`, :class:`GovernanceContract`,
:class:`RunsContract`, :class:`LifecycleContract`, :class:`JobsContract`,
:class:`ClusterContract`, :class:`SeenEventsContract`, :class:`QueueContract`,
:class:`RunEventsContract`, :class:`LinksContract`, :class:`SearchContract`,
:class:`WebhooksContract`, :class:`AttachmentsContract`,
:class:`A2ATasksContract`, :class:`CheckpointsContract`); :class:`StoreContract` is all
of them.  A case the engine legitimately cannot pass is skipped with its
reason:
``unsupported = {"test_name": "why"}``.

The suite needs ``pytest`` and ``pytest-asyncio`` (the ``agentik[testing]``
extra); it runs in pytest-asyncio's ``strict`` and ``auto`` modes.
"""

from __future__ import annotations

from .a2a import A2ATasksContract
from .attachments import AttachmentsContract
from .checkpoints import CheckpointsContract
from .cluster import ClusterContract
from .events import RunEventsContract
from .governance import GovernanceContract
from .jobs import JobsContract
from .kit import ContractBase
from .lifecycle import LifecycleContract
from .links import LinksContract
from .log import LogContract
from .outbox import OutboxContract
from .queue import QueueContract
from .runs import RunsContract
from .search import SearchContract
from .seen import SeenEventsContract
from .waits import WaitsContract
from .webhooks import WebhooksContract

__all__ = [
    "A2ATasksContract",
    "AttachmentsContract",
    "CheckpointsContract",
    "ClusterContract",
    "ContractBase",
    "GovernanceContract",
    "JobsContract",
    "LifecycleContract",
    "LinksContract",
    "LogContract",
    "OutboxContract",
    "QueueContract",
    "RunEventsContract",
    "RunsContract",
    "SearchContract",
    "SeenEventsContract",
    "StoreContract",
    "WaitsContract",
    "WebhooksContract",
]


class StoreContract(
    LogContract,
    OutboxContract,
    WaitsContract,
    GovernanceContract,
    RunsContract,
    LifecycleContract,
    JobsContract,
    ClusterContract,
    SeenEventsContract,
    RunEventsContract,
    QueueContract,
    LinksContract,
    WebhooksContract,
    AttachmentsContract,
    SearchContract,
    A2ATasksContract,
    CheckpointsContract,
):
    """The whole store contract; subclass it and provide a ``store`` fixture."""
