"""Scheduled jobs that run once across workers (agentik.core.cluster.jobs): three worker
PROCESSES on one PostgreSQL database (tests/pgserver.py) fire the same 100 slots and the
job runs 100 times, also when one of them is killed -9 in the middle of a job; the same
code on SQLite runs each slot once; retention's start-up run happens once for two
workers started together.

The worker processes run this module (``python test_cluster_jobs.py DSN NAME ...``): a
small scheduler around :func:`run_once` whose job writes one row per run in a side
table (``tick_effect``), which is what the tests count."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from agentik.core import Agent, SQLiteStore
from agentik.core.cluster.jobs import interval_slot, next_interval, run_once, startup_slot
from agentik.core.lifecycle import RetentionRule, RetentionSettings, RetentionWorker
from agentik.core.store.postgres import PostgresStore
from agentik.core.testing.scripted import ScriptedModel

pytest_plugins = ["pgserver"]

SLOTS = 100
HERE = Path(__file__).resolve()


# -- the worker process --------------------------------------------------------------------
async def _worker(dsn: str, name: str, folder: Path, hang_at: int, stale_after: float) -> None:
    """Fire slots 0..SLOTS-1 until every one has finished (a scheduler that fires a slot
    again until its run is recorded: a claim left by a dead worker goes stale)."""
    async with PostgresStore(dsn, pool_min=2, pool_max=3) as store:
        effects = await asyncpg.connect(dsn)
        claimed = 0

        async def job(slot: str) -> None:
            nonlocal claimed
            claimed += 1
            if claimed == hang_at:  # stuck mid-job, until killed
                (folder / f"{name}.hung").write_text(slot)
                await asyncio.Event().wait()
            await effects.execute("INSERT INTO tick_effect (slot, worker) VALUES ($1, $2)",
                                  slot, name)  # fmt: skip

        (folder / f"{name}.ready").touch()
        while not (folder / f"go-{name}").exists():  # noqa: ASYNC110 - the test's file
            await asyncio.sleep(0.01)
        pending = set(range(SLOTS))
        while pending:
            for n in sorted(pending):
                slot = str(n)
                await run_once(
                    store, "tick", slot, lambda s=slot: job(s), worker=name,
                    stale_after=stale_after,
                )  # fmt: skip
            done = {
                int(r.slot)
                for r in await store.job_history("tick", limit=SLOTS * 2)
                if r.finished_at is not None and r.ok
            }
            pending -= done
            if pending:
                await asyncio.sleep(0.05)  # the scheduler's next tick
        await effects.close()


def _spawn(dsn: str, name: str, folder: Path, hang_at: int = 0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(HERE), dsn, name, str(folder), str(hang_at), "5.0"],
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


async def _until(pred, within: float = 90.0) -> None:
    """Wait for a condition other processes make true (files they write)."""
    async with asyncio.timeout(within):
        while not pred():  # noqa: ASYNC110 - files of other processes
            await asyncio.sleep(0.02)


async def _run_workers(dsn: str, folder: Path, hang: str | None = None) -> list[tuple]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "DROP TABLE IF EXISTS tick_effect;"
            " CREATE TABLE tick_effect (slot text NOT NULL, worker text NOT NULL)"
        )
        names = ["w0", "w1", "w2"]
        procs = {n: _spawn(dsn, n, folder, hang_at=5 if n == hang else 0) for n in names}
        try:
            await _until(lambda: all((folder / f"{n}.ready").exists() for n in names))
            if hang is not None:
                # The one that hangs starts alone: on a loaded machine the others could
                # otherwise run every slot before it claims the one it hangs on.
                (folder / f"go-{hang}").touch()
                await _until(lambda: (folder / f"{hang}.hung").exists())
            for n in names:
                (folder / f"go-{n}").touch()
            if hang is not None:
                procs[hang].send_signal(signal.SIGKILL)
            for n, p in procs.items():
                code = await asyncio.to_thread(p.wait, 120)
                assert code == (-signal.SIGKILL if n == hang else 0), (n, code)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        rows = await conn.fetch("SELECT slot, worker FROM tick_effect")
        await conn.execute("DROP TABLE tick_effect")
        return [tuple(r) for r in rows]
    finally:
        await conn.close()


async def test_three_workers_run_each_of_100_firings_once(postgres_dsn, tmp_path):
    effects = await _run_workers(postgres_dsn, tmp_path)
    assert len(effects) == SLOTS
    assert sorted(int(s) for s, _ in effects) == list(range(SLOTS))
    async with PostgresStore(postgres_dsn) as store:
        history = await store.job_history("tick", limit=1000)
    assert len(history) == SLOTS and all(r.ok and r.attempts == 1 for r in history)
    # Each run is recorded under the worker that ran it.
    assert {(r.slot, r.worker) for r in history} == set(effects)


async def test_a_worker_killed_mid_job_leaves_its_firing_to_another(postgres_dsn, tmp_path):
    effects = await _run_workers(postgres_dsn, tmp_path, hang="w0")
    stuck = (tmp_path / "w0.hung").read_text()
    assert len(effects) == SLOTS  # exactly: the dead worker's job never wrote its row
    assert sorted(int(s) for s, _ in effects) == list(range(SLOTS))
    async with PostgresStore(postgres_dsn) as store:
        history = {r.slot: r for r in await store.job_history("tick", limit=1000)}
    assert all(r.ok for r in history.values())
    # The stuck firing went stale and was taken over by a live worker.
    assert history[stuck].attempts == 2 and history[stuck].worker != "w0"
    assert [s for s, r in history.items() if r.attempts > 1] == [stuck]


async def test_the_same_job_code_on_sqlite_runs_each_slot_once(tmp_path):
    ran: list[tuple[str, str]] = []

    async def worker(store: SQLiteStore, name: str) -> None:
        async def job(slot: str) -> None:
            await asyncio.sleep(0)  # let the other workers interleave
            ran.append((slot, name))

        for n in range(SLOTS):
            await run_once(store, "tick", str(n), lambda s=str(n): job(s), worker=name)

    async with SQLiteStore(str(tmp_path / "bot.db")) as store:
        await asyncio.gather(*(worker(store, f"w{i}") for i in range(3)))
        history = await store.job_history("tick", limit=1000)
    assert sorted(int(s) for s, _ in ran) == list(range(SLOTS))
    assert {(r.slot, r.worker) for r in history} == set(ran)


async def test_a_failing_job_is_recorded_and_its_slot_may_run_again(tmp_path):
    async with SQLiteStore(str(tmp_path / "bot.db")) as store:

        async def boom() -> None:
            raise RuntimeError("disk full")

        with pytest.raises(RuntimeError):
            await run_once(store, "j", "s", boom, worker="a")
        [row] = await store.job_history("j")
        assert (row.ok, row.detail) == (False, "RuntimeError('disk full')")

        async def fine() -> str:
            return "done"

        assert await run_once(store, "j", "s", fine, worker="b")
        assert not await run_once(store, "j", "s", fine, worker="c")
        [row] = await store.job_history("j")
        assert (row.worker, row.ok, row.detail, row.attempts) == ("b", True, "done", 2)


def test_every_worker_names_the_same_slots():
    # An interval's boundary: the next slot, named before sleeping until it.
    delay, slot = next_interval(3600, now=7200.5)
    assert (delay, slot) == (3599.5, interval_slot(3600, now=10_800.0))
    assert interval_slot(3600, now=7200.0) == interval_slot(3600, now=10_799.9)
    assert startup_slot(now=1200.0) == startup_slot(now=1799.0) != startup_slot(now=1800.0)


async def test_two_workers_started_together_run_retention_once(postgres_dsn):
    settings = RetentionSettings(rules=[RetentionRule(channels=["*"], keep_days=7)])
    workers = [RetentionWorker(settings), RetentionWorker(settings)]
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            store = PostgresStore(postgres_dsn)
            await stack.enter_async_context(Agent(llm=ScriptedModel(), store=store, background=[w]))
        for w in workers:
            async with w.changed:
                await w.changed.wait_for(lambda w=w: len(w.runs) + w.skipped >= 1)
        assert sorted((len(w.runs), w.skipped) for w in workers) == [(0, 1), (1, 0)]
        # An operator's trigger is that worker's own firing: it runs there.
        workers[0].trigger()
        await workers[0].wait_runs(len(workers[0].runs) + 1)
        history = await store.job_history("retention")
    assert len(history) == 2 and all(r.ok for r in history)


async def test_two_workers_that_saw_a_conversation_end_reflect_on_it_once(postgres_dsn, tmp_path):
    from test_compaction import Brain, chat

    from agentik.core.background import BackgroundPolicy, MemoryWorker
    from agentik.core.memory.markdown import MarkdownMemory

    gate = asyncio.Event()

    async def debounce(_: float) -> None:  # both workers capture the span, then reflect
        await gate.wait()

    brains = [Brain(reflection="Alice likes tea."), Brain(reflection="Alice likes tea.")]
    workers = [
        MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=1), sleep=debounce)
        for _ in brains
    ]
    async with contextlib.AsyncExitStack() as stack:
        agents = [
            await stack.enter_async_context(
                Agent(
                    llm=brain.model,
                    store=PostgresStore(postgres_dsn),
                    memory=MarkdownMemory(tmp_path / f"notes{i}"),
                    background=[worker],
                )
            )
            for i, (brain, worker) in enumerate(zip(brains, workers, strict=True))
        ]
        conv = await agents[0].create_conversation(title="drinks")
        await chat(conv, 2, size=0)
        there = await agents[1].get_conversation(conv.id)
        await agents[0].end_conversation(conv, "idle")
        await agents[1].end_conversation(there, "idle")
        gate.set()
        for w in workers:
            await asyncio.wait_for(w.wait_for("reflection"), 60)
        history = await agents[0].store.job_history("reflection")
    # Both captured the same span (the debounce held them); one reflected on it.
    assert sum(len(b.requests("reflection")) for b in brains) == 1
    assert sorted(w.done[-1][2] for w in workers) == [0, 1]
    [row] = history
    assert row.ok and row.slot.startswith(f"{conv.id}:") and row.detail == "1 note(s)"


if __name__ == "__main__":
    dsn, name, folder, hang_at, stale_after = sys.argv[1:6]
    asyncio.run(_worker(dsn, name, Path(folder), int(hang_at), float(stale_after)))
