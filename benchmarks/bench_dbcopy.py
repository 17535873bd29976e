#!/usr/bin/env python3
"""``agentik db copy`` speed and memory (issue 32), and where a Slack bot's handled
events are cheapest to keep.

Run with ``.venv/bin/python benchmarks/bench_dbcopy.py`` (needs PostgreSQL's binaries:
``make postgres``; the server is started here, as the tests start it, in a temporary
folder); ``--quick`` is a smaller run.

1. Copy speed: a SQLite database of ``--conversations`` conversations of
   ``--messages`` audit-log rows each (and as many working-memory rows), written
   through the store, copied SQLite -> PostgreSQL and PostgreSQL -> SQLite, then
   verified; rows/s and CPU per 1,000 rows of this process, against a SQLite ->
   SQLite copy measured in the same run (the baseline).  The peak RSS growth during
   a copy shows that memory stays flat (rows are streamed in batches).
2. Handled events (Slack's dedupe): what recording one event costs, one at a time as
   a quiet bot sees them: the handled-events file (in memory, then a thread writes the
   WAL file), against ``Store.seen_first`` on SQLite (through the single writer, with
   the default ``synchronous = full``) and on PostgreSQL.  Goal: the store on
   PostgreSQL within 2 ms of the file per event (one round trip, and shared).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentik.core import SQLiteStore
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.copy import copy_store, verify
from agentik.core.store.records import ConversationRecord

from _common import Row, finish, per_s, proc_status, process_cpu, say, say_environment, version

#: tests/pgserver.py starts PostgreSQL here as it does for the tests.
TESTS_FOLDER = str(Path(__file__).resolve().parent.parent / "tests")

SEEN_GOAL = 2e-3  # seconds per event more than the file, on PostgreSQL


async def build(path: Path, conversations: int, messages: int) -> int:
    """A SQLite database of ``conversations`` x ``messages`` rows; rows written."""
    async with SQLiteStore(str(path), synchronous="off") as store:
        for c in range(conversations):
            cid = f"conv-{c:06d}"
            await store.create_conversation(
                ConversationRecord(id=cid, created_at=1.0, updated_at=1.0),
                channel_key=f"irc:net:#c{c}",
            )
            log = [
                NewMessage(kind="user" if i % 2 == 0 else "assistant",
                           content=f"message {i} of {cid} " + "lorem ipsum " * 8,
                           run_id=f"{cid}-r{i // 2}", author="alice", created_at=2.0 + i)
                for i in range(messages)
            ]  # fmt: skip
            memory = [ChatMessage(role="user", content=m.content, message_id=-(i + 1))
                      for i, m in enumerate(log)]  # fmt: skip
            await store.append(cid, log=log, memory=memory)
    return conversations * (2 + 2 * messages)


async def timed_copy(src: object, dst: object) -> tuple[float, float, int, int]:
    """(wall s, CPU s, rows, peak RSS growth in bytes) of one copy."""
    before = proc_status()["VmRSS"]
    wall, cpu = time.perf_counter(), process_cpu()
    report = await copy_store(src, dst)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - wall, process_cpu() - cpu
    return wall, cpu, report.total, proc_status()["VmHWM"] - before


async def copies(args: argparse.Namespace, folder: Path, dsn: str | None) -> list[Row]:
    from agentik.core.store.postgres import PostgresStore

    rows: list[Row] = []
    first = folder / "first.db"
    say(f"== building {args.conversations:,} conversations x {args.messages} messages")
    n = await build(first, args.conversations, args.messages)
    say(f"   {n:,} rows, {first.stat().st_size / 2**20:.1f} MB")
    async with SQLiteStore(str(first)) as src, SQLiteStore(str(folder / "base.db")) as dst:
        b_wall, b_cpu, b_rows, _ = await timed_copy(src, dst)
    base = b_rows / b_wall
    say(
        f"   SQLite -> SQLite (baseline): {base:,.0f} rows/s, {b_cpu / b_rows * 1e6:.1f} us CPU/row"
    )
    rows.append(Row("SQLite -> SQLite (baseline)", per_s(base, "rows/s"), "-", None, "-", None))
    if dsn is None:
        return rows
    results = {}
    async with SQLiteStore(str(first)) as src, PostgresStore(dsn) as dst:
        results["SQLite -> PostgreSQL"] = await timed_copy(src, dst)
        started = time.perf_counter()
        checked = await verify(src, dst, nul=True)
        verify_s = time.perf_counter() - started
    async with PostgresStore(dsn) as src, SQLiteStore(str(folder / "back.db")) as dst:
        results["PostgreSQL -> SQLite"] = await timed_copy(src, dst)
    for name, (wall, cpu, count, rss) in results.items():
        rate = count / wall
        say(f"   {name}: {rate:,.0f} rows/s, {cpu / count * 1e6:.1f} us CPU/row,"
            f" peak RSS +{rss / 2**20:.1f} MB")  # fmt: skip
        rows.append(Row(name, per_s(rate, "rows/s"), per_s(base, "rows/s"), rate / base, "-",
                        None))  # fmt: skip
    rows.append(Row(f"verify ({checked:,} conversations)", f"{verify_s:.1f} s", "-", None, "-",
                    None))  # fmt: skip
    return rows


async def per_event(record, events: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median wall and mean CPU seconds per event of ``record(keys)``, one at a time."""
    walls = []
    cpu = process_cpu()
    for i in range(events):
        keys = (f"event:Ev{i}", f"msg:C1:{i}.000100")
        t = time.perf_counter()
        await record(keys)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), (process_cpu() - cpu) / events


async def seen(args: argparse.Namespace, folder: Path, dsn: str | None) -> list[Row]:
    from agentik.bot.builder import StoreSeenEvents
    from agentik.core.store.postgres import PostgresStore
    from agentik.transports.slack.transport import _Seen

    say(f"== recording {args.events:,} handled events, one at a time")
    file = _Seen(str(folder / "seen.sqlite3"), 20_000)
    file.open()

    async def to_file(keys: tuple[str, ...]) -> None:
        file.check_and_add(*keys)
        await asyncio.to_thread(file.persist, *keys)

    base_wall, base_cpu = await per_event(to_file, args.events)
    file.close()
    say(f"   file: {base_wall * 1e3:.3f} ms, {base_cpu * 1e6:.0f} us CPU per event")
    rows = [Row("handled-events file (baseline)", f"{base_wall * 1e3:.3f} ms", "-", None, "-",
                None)]  # fmt: skip
    stores: list[tuple[str, object]] = [
        ("SQLite store (full)", SQLiteStore(str(folder / "seen.db"))),
    ]
    if dsn is not None:
        stores.append(("PostgreSQL store", PostgresStore(dsn)))
    for name, store in stores:
        async with store:  # type: ignore[attr-defined]
            shared = StoreSeenEvents(store)  # type: ignore[arg-type]
            wall, cpu = await per_event(shared.first_seen, args.events)
            say(f"   {name}: {wall * 1e3:.3f} ms, {cpu * 1e6:.0f} us CPU per event")
            ok = None if "SQLite" in name else wall - base_wall <= SEEN_GOAL
            goal = "<= +2 ms" if ok is not None else "-"
            rows.append(Row(name, f"{wall * 1e3:.3f} ms", f"{base_wall * 1e3:.3f} ms",
                            wall / base_wall, goal, ok))  # fmt: skip
            if "SQLite" in name:
                continue

            async def whole(keys: tuple[str, ...], shared: StoreSeenEvents = shared) -> None:
                # What a worker does per event since the ack waits for the commit: claim
                # it and read whether another worker handled it (one statement), record
                # it once committed.
                await shared.claim_known([f"claim:{k}" for k in keys], keys)
                await shared.first_seen(keys)

            wall, cpu = await per_event(whole, args.events)
            say(f"   {name}, claim + read + record: {wall * 1e3:.3f} ms,"
                f" {cpu * 1e6:.0f} us CPU per event")  # fmt: skip
            ok = wall - base_wall <= SEEN_GOAL
            rows.append(Row(f"{name}: claim + read + record", f"{wall * 1e3:.3f} ms",
                            f"{base_wall * 1e3:.3f} ms", wall / base_wall, "<= +2 ms",
                            ok))  # fmt: skip
    return rows


async def main_async(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    say_environment([("agentik", version("agentik")), ("asyncpg", version("asyncpg"))])
    server = None
    dsn = None
    sys.path.insert(0, TESTS_FOLDER)
    try:
        from pgserver import TESTS, PostgresServer, find_binaries, make_template

        bindir = find_binaries()
        if bindir is None:
            say("PostgreSQL is not installed (make postgres): SQLite rows only")
        else:
            server = PostgresServer(bindir)
            server.start()
            await make_template(server)
            dsn = server.dsn(TESTS)
        with tempfile.TemporaryDirectory() as tmp:
            rows = await copies(args, Path(tmp), dsn)
            if dsn is not None:
                from pgserver import empty_database

                await empty_database(dsn)
            rows += await seen(args, Path(tmp), dsn)
    finally:
        if server is not None:
            server.stop()
    return finish(rows, strict=args.strict, started=started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    p.add_argument("--conversations", type=int, default=None)
    p.add_argument("--messages", type=int, default=None)
    p.add_argument("--events", type=int, default=None)
    args = p.parse_args()
    args.conversations = args.conversations or (200 if args.quick else 2000)
    args.messages = args.messages or (20 if args.quick else 60)
    args.events = args.events or (200 if args.quick else 2000)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
