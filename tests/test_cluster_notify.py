"""Notifications between processes on one database (agentik.core.cluster.notify): ids
only, after the commit, with a polling fallback; and the caches that follow them
(access grants, channel settings).  PostgreSQL runs for real (tests/pgserver.py); two
stores with two pools play two workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time

import asyncpg
import pytest

from agentik.bot.chansettings import SETTINGS_TOPIC, ChannelSettingsBook
from agentik.core import MemoryStore, SQLiteStore
from agentik.core.access import GRANTS_TOPIC, AccessPolicy, AccessSettings
from agentik.core.cluster.notify import PAYLOAD_MAX, LocalNotifier, Notice, payloads
from agentik.core.store.postgres import PostgresStore

pytest_plugins = ["pgserver"]


class Inbox:
    """A subscriber that keeps what it receives, and when."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self.at: list[float] = []
        self._new = asyncio.Condition()

    async def __call__(self, notice: Notice) -> None:
        async with self._new:
            self.notices.append(notice)
            self.at.append(time.perf_counter())
            self._new.notify_all()

    async def wait(self, pred, within: float = 60.0) -> list[Notice]:
        async with asyncio.timeout(within), self._new:
            await self._new.wait_for(lambda: pred(self.notices))
        return self.notices

    def ids(self) -> set[str]:
        return {i for n in self.notices for i in n.ids}


@contextlib.asynccontextmanager
async def workers(dsn: str, n: int = 2, **kw):
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(PostgresStore(dsn, pool_min=2, pool_max=4, **kw))
            for _ in range(n)
        ]


# -- in one process ------------------------------------------------------------------------
@pytest.mark.parametrize("make", [MemoryStore, lambda: SQLiteStore(":memory:")])
async def test_a_single_process_store_delivers_within_the_process(make):
    async with make() as store:
        notifier = store.notifier()
        assert isinstance(notifier, LocalNotifier) and store.notifier() is notifier
        inbox, seen = Inbox(), []
        sub = notifier.subscribe("things", inbox)
        notifier.subscribe("things", seen.append)  # a plain function works too
        notifier.subscribe("other", seen.append)
        await notifier.publish("things", "a", "b")
        await notifier.publish("things")  # no ids: anything may have changed
        await inbox.wait(lambda ns: len(ns) == 2)
        assert (
            inbox.notices
            == seen
            == [
                Notice("things", ("a", "b"), local=True),
                Notice("things", (), resync=True, local=True),
            ]
        )
        sub.close()
        await notifier.publish("things", "c")
        assert len(inbox.notices) == 2 and len(seen) == 3
        with pytest.raises(ValueError):
            notifier.subscribe("Not a topic!", seen.append)


def test_ids_are_split_under_the_payload_limit():
    ids = tuple(f"slack:T0001:C{i:08d}:1700000000.{i:06d}" for i in range(2000))
    sent = payloads("me", ids)
    assert len(sent) > 1
    assert all(len(p.encode()) <= PAYLOAD_MAX for p in sent)
    assert [i for p in sent for i in json.loads(p)["i"]] == list(ids)
    # An id too long for one notification: everything may have changed.
    assert [json.loads(p) for p in payloads("me", ("x" * 9000,))] == [{"o": "me", "all": True}]
    assert [json.loads(p) for p in payloads("me", ())] == [{"o": "me", "all": True}]


# -- across processes, on PostgreSQL ---------------------------------------------------------
async def test_publish_on_one_store_is_received_on_another(postgres_dsn):
    async with workers(postgres_dsn) as (a, b):
        theirs, mine = Inbox(), Inbox()
        b.notifier().subscribe("things", theirs)
        a.notifier().subscribe("things", mine)
        await asyncio.gather(a.notifier().listening(), b.notifier().listening())
        latencies = []
        for i in range(20):
            sent = time.perf_counter()
            await a.notifier().publish("things", f"id{i}", "x")
            await theirs.wait(lambda ns, i=i: len(ns) == i + 1)
            latencies.append(theirs.at[-1] - sent)
        await mine.wait(lambda ns: len(ns) == 20)
        assert [n.ids for n in theirs.notices] == [(f"id{i}", "x") for i in range(20)]
        assert not any(n.local or n.resync for n in theirs.notices)
        # A process receives its own notifications too, marked as its own.
        assert all(n.local for n in mine.notices)
        ms = sorted(x * 1000 for x in latencies)
        print(
            f"publish to receive: median {statistics.median(ms):.2f} ms,"
            f" min {ms[0]:.2f}, max {ms[-1]:.2f} (20 notifications)"
        )


async def test_many_ids_arrive_in_several_notifications(postgres_dsn):
    async with workers(postgres_dsn) as (a, b):
        inbox = Inbox()
        b.notifier().subscribe("things", inbox)
        await b.notifier().listening()
        ids = [f"irc:libera:#channel-{i:05d}" for i in range(3000)]
        await a.notifier().publish("things", *ids)
        await inbox.wait(lambda ns: len({i for n in ns for i in n.ids}) == len(ids))
        assert len(inbox.notices) > 1 and inbox.ids() == set(ids)


async def test_a_rolled_back_write_notifies_nobody(postgres_dsn):
    async with workers(postgres_dsn) as (a, b):
        inbox = Inbox()
        b.notifier().subscribe(SETTINGS_TOPIC, inbox)
        await b.notifier().listening()
        book = ChannelSettingsBook(a)
        conn = await asyncpg.connect(postgres_dsn)
        try:
            # The database refuses this channel's writes: the transaction rolls back.
            await conn.execute(
                "ALTER TABLE channel_setting ADD CONSTRAINT no_doomed"
                " CHECK (channel_key <> 'irc:n:#doomed') NOT VALID"
            )
            with pytest.raises(Exception, match="no_doomed"):
                await book.set("irc:n:#doomed", "persona", "x", actor="alice")
            await book.set("irc:n:#fine", "persona", "y", actor="alice")
        finally:
            await conn.execute("ALTER TABLE channel_setting DROP CONSTRAINT IF EXISTS no_doomed")
            await conn.close()
        # Notifications arrive in order: the first one is the write that committed.
        [first] = await inbox.wait(lambda ns: len(ns) >= 1)
        assert first.ids == ("irc:n:#fine",)
        assert "irc:n:#doomed" not in inbox.ids()


async def test_a_lost_listening_connection_resyncs_and_listens_again(postgres_dsn):
    async with workers(postgres_dsn) as (a, b):
        inbox = Inbox()
        notifier = b.notifier()
        notifier.subscribe("things", inbox)
        await notifier.listening()
        conn = await asyncpg.connect(postgres_dsn)
        try:
            killed = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            )
        finally:
            await conn.close()
        assert killed == 1
        # Whatever was announced meanwhile is lost: every subscriber re-reads.
        await inbox.wait(lambda ns: any(n.resync for n in ns))
        await notifier.listening()
        assert notifier.connections == 2
        await a.notifier().publish("things", "after")
        await inbox.wait(lambda ns: ("after",) in [n.ids for n in ns])


async def test_the_polling_fallback_resyncs_every_poll_seconds(postgres_dsn):
    async with workers(postgres_dsn, n=1, notify_poll=0.2) as (b,):
        inbox = Inbox()
        b.notifier().subscribe("things", inbox)
        await inbox.wait(lambda ns: sum(n.resync for n in ns) >= 3)
        assert all(n.resync and not n.ids for n in inbox.notices)


# -- the caches that follow notifications --------------------------------------------------
async def test_a_grant_made_through_one_store_applies_on_another(postgres_dsn):
    settings = AccessSettings()
    async with workers(postgres_dsn) as (a, b):
        here = AccessPolicy(settings, {"libera": "irc"})
        there = AccessPolicy(settings, {"libera": "irc"})
        await here.load(a)
        await there.load(b)
        inbox = Inbox()
        b.notifier().subscribe(GRANTS_TOPIC, inbox)
        await b.notifier().listening()
        who = there.identity_from_key("libera:account:alice")
        assert there.role_of(who) == "user"
        await here.grant("libera:account:alice", "admin", by="owner")
        await inbox.wait(lambda ns: len(ns) == 1)
        await b.notifier().settled()  # the policy has read the grants again
        assert inbox.notices[0].ids == ("libera:account:alice",)
        assert there.role_of(who) == "admin"
        await here.grant("libera:account:alice", None, by="owner")
        await inbox.wait(lambda ns: len(ns) == 2)
        await b.notifier().settled()
        assert there.role_of(who) == "user"


async def test_a_lost_notification_only_delays_a_grant(postgres_dsn):
    settings = AccessSettings()
    async with workers(postgres_dsn, notify_poll=0.3) as (a, b):
        there = AccessPolicy(settings, {"libera": "irc"})
        await there.load(b)
        inbox = Inbox()
        b.notifier().subscribe(GRANTS_TOPIC, inbox)
        who = there.identity_from_key("libera:account:bob")
        # Written without a notification (as if it was lost): the next resync reads it.
        await a.access_set("libera:account:bob", "admin", by="owner")
        written = len(inbox.notices)
        await inbox.wait(lambda ns: len(ns) > written)
        await b.notifier().settled()
        assert inbox.notices[-1].resync
        assert there.role_of(who) == "admin"


async def test_channel_settings_set_through_one_store_are_read_on_another(postgres_dsn):
    async with workers(postgres_dsn) as (a, b):
        here, there = ChannelSettingsBook(a), ChannelSettingsBook(b)
        inbox = Inbox()
        b.notifier().subscribe(SETTINGS_TOPIC, inbox)
        await b.notifier().listening()

        async def persona() -> str | None:
            row = (await there.chat("irc:n:#c")).get("persona")
            return None if row is None else json.loads(row.value)

        assert await persona() is None  # read once, and cached
        await here.set("irc:n:#c", "persona", "a pirate", actor="alice")
        await inbox.wait(lambda ns: len(ns) == 1)
        assert inbox.notices[0].ids == ("irc:n:#c",)
        assert await persona() == "a pirate"
        await here.set("irc:n:#c", "persona", None, actor="alice")
        await inbox.wait(lambda ns: len(ns) == 2)
        assert await persona() is None
