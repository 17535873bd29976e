#!/usr/bin/env python3
"""Benchmarks of agentik.core, each figure against a baseline measured in the same run.

Run with ``.venv/bin/python benchmarks/bench_core.py`` (``make bench``); ``--quick`` is a
much smaller run for smoke tests.  Measurements:

1. per-turn overhead: a full agentik turn against a local fake OpenAI-compatible server
   (its own process, so its CPU is not counted) vs a bare ``openai.AsyncOpenAI`` streaming
   call carrying the same message history;
2. SQLite audit-log append rate, durable (``synchronous=FULL``) and ``NORMAL``, sequential
   and from 100 concurrent conversations, vs raw stdlib ``sqlite3`` with one transaction
   per row;
3. RSS of 10,000 channel-bound conversations (in a fresh subprocess);
4. latest / keyset history page of a 100,000-message conversation vs a 1,000-message one.

Ratios are agentik / baseline.  The exit status is 0 unless ``--strict`` is given and a
goal is missed.  Uses only the standard library and agentik's own dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import aiosqlite
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentik.core import Agent, OpenAIBackend, SQLiteStore, TextDelta
from agentik.core.messages import NewMessage
from agentik.core.store.base import ConversationRecord
from agentik.core.store.migrations import MIGRATIONS

from _common import (
    Row,
    fake_openai_server,
    finish,
    mb,
    ms,
    per_s,
    proc_status,
    process_cpu,
    say,
    say_environment,
    version,
)

MODEL = "fake-model"
FILLER = "the quick brown fox jumps over the lazy dog, "  # ~45 characters
SECTIONS = ("turns", "append", "rss", "history")


# -- configuration -----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    quick: bool
    # 1. turns: ``turn_rounds`` measured rounds of ``turns_per_round`` sequential turns each
    turn_warmup_rounds: int
    turn_rounds: int
    turns_per_round: int
    # 2. appends
    append_rounds: int
    seq_appends_full: int
    seq_appends_normal: int
    conc_convs: int
    conc_per_conv: int
    # 3. RSS
    rss_convs: int
    rss_event_convs: int
    # 4. history
    hist_big: int
    hist_small: int
    hist_reps: int


FULL = Config(
    quick=False,
    turn_warmup_rounds=2,
    turn_rounds=24,
    turns_per_round=10,
    append_rounds=3,
    seq_appends_full=1_000,
    seq_appends_normal=3_000,
    conc_convs=100,
    conc_per_conv=50,
    rss_convs=10_000,
    rss_event_convs=200,
    hist_big=100_000,
    hist_small=1_000,
    hist_reps=300,
)
QUICK = Config(
    quick=True,
    turn_warmup_rounds=1,
    turn_rounds=4,
    turns_per_round=5,
    append_rounds=1,
    seq_appends_full=100,
    seq_appends_normal=300,
    conc_convs=100,
    conc_per_conv=5,
    rss_convs=1_000,
    rss_event_convs=20,
    hist_big=10_000,
    hist_small=1_000,
    hist_reps=30,
)


# -- environment -------------------------------------------------------------------------
def print_environment(cfg: Config, tmp: str) -> None:
    say_environment(
        [
            ("sqlite", sqlite3.sqlite_version),
            ("openai", version("openai")),
            ("aiosqlite", version("aiosqlite")),
            ("aiohttp", f"{version('aiohttp')} (fake server)"),
            ("agentik", version("agentik")),
            ("temp dir", tmp),
            ("mode", "quick" if cfg.quick else "full"),
        ]
    )


# -- 1. per-turn overhead ------------------------------------------------------------------
def _turn_text(i: int) -> str:
    return f"turn {i}: {FILLER * 2}"


Samples = list[tuple[float, float]]  # (wall seconds, process CPU seconds) per turn


async def _agent_round(agent: Agent, turns: int, out: Samples | None) -> None:
    conv = await agent.create_conversation()  # not timed
    for i in range(turns):
        text = _turn_text(i)
        w0, c0 = time.perf_counter(), process_cpu()
        await conv.send(text)
        await conv.wait_idle()
        c1, w1 = process_cpu(), time.perf_counter()
        if out is not None:
            out.append((w1 - w0, c1 - c0))
    # Check the turns really ran (a failing turn would look very cheap).
    log = await conv.messages(limit=2 * turns + 10)
    expected = 2 * turns
    if len(log) != expected or log[-1].kind != "assistant" or log[-1].status != "complete":
        raise RuntimeError(f"agent turns failed: {len(log)} audit rows, expected {expected}")
    if log[-1].content != "echo: " + _turn_text(turns - 1):
        raise RuntimeError(f"unexpected answer {log[-1].content!r}")
    await conv.aclose()


async def _baseline_round(
    client: openai.AsyncOpenAI, turns: int, out: Samples | None, *, post: bool = False
) -> None:
    """Bare SDK streaming calls: ``chat.completions.create`` or, with ``post``, the same
    JSON body through ``client.post`` (which skips the SDK's request transformation, as
    agentik's backend does)."""
    history: list[dict[str, Any]] = []
    for i in range(turns):
        text = _turn_text(i)
        history.append({"role": "user", "content": text})
        w0, c0 = time.perf_counter(), process_cpu()
        if post:
            stream = await client.post(
                "/chat/completions",
                body={"model": MODEL, "messages": history, "stream": True,
                      "stream_options": {"include_usage": True}},
                cast_to=ChatCompletion,
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )  # fmt: skip
        else:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=history,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
            )
        parts: list[str] = []
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta is not None and choice.delta.content:
                    parts.append(choice.delta.content)
        c1, w1 = process_cpu(), time.perf_counter()
        if out is not None:
            out.append((w1 - w0, c1 - c0))
        history.append({"role": "assistant", "content": "".join(parts)})
    if history[-1]["content"] != "echo: " + _turn_text(turns - 1):
        raise RuntimeError(f"unexpected baseline answer {history[-1]['content']!r}")


async def bench_turns(cfg: Config, tmp: str, url: str) -> list[Row]:
    """Sequential turns, agentik vs a bare SDK call.

    Fairness: the OpenAI SDK's request preparation costs about 0.3 ms of CPU per message
    of history, so both sides must send exactly the same history.  Each round starts a
    fresh agentik conversation (created outside the timed region) and runs
    ``turns_per_round`` turns in it; the baseline round starts from an empty list and
    appends the same user message and the same echoed answer each turn.  Request ``k`` of
    a round therefore carries ``2k+1`` messages on both sides, and each side's samples
    span the same history lengths.  Variants run in alternating order (A B C D, D C B A,
    ...) to cancel drift; medians of the per-turn samples are reported.
    """
    k = cfg.turns_per_round
    client = openai.AsyncOpenAI(base_url=url, api_key="x")
    agents: dict[str, Agent] = {
        "full": Agent(
            llm=OpenAIBackend(model=MODEL, base_url=url),
            store=SQLiteStore(os.path.join(tmp, "turns-full.db")),  # default: synchronous=full
        ),
        "normal": Agent(
            llm=OpenAIBackend(model=MODEL, base_url=url),
            store=SQLiteStore(os.path.join(tmp, "turns-normal.db"), synchronous="normal"),
        ),
        "memory": Agent(
            llm=OpenAIBackend(model=MODEL, base_url=url), store=SQLiteStore(":memory:")
        ),
    }
    for agent in agents.values():
        await agent.start()
    names = ["baseline", "post", *agents]
    samples: dict[str, Samples] = {n: [] for n in names}

    async def run(name: str, out: Samples | None) -> None:
        gc.collect()
        if name in ("baseline", "post"):
            await _baseline_round(client, k, out, post=name == "post")
        else:
            await _agent_round(agents[name], k, out)

    try:
        for r in range(cfg.turn_warmup_rounds):
            for name in names if r % 2 == 0 else reversed(names):
                await run(name, None)
        for r in range(cfg.turn_rounds):
            for name in names if r % 2 == 0 else reversed(names):
                await run(name, samples[name])
    finally:
        for agent in agents.values():
            await agent.aclose()
        await client.close()

    def med(name: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[name])

    def p90(name: str, i: int) -> float:
        return statistics.quantiles([s[i] for s in samples[name]], n=10)[-1]

    n = len(samples["baseline"])
    say(f"== 1. per-turn overhead ({cfg.turn_rounds} rounds x {k} turns = {n} turns/variant;")
    say(f"      history per request 1..{2 * k - 1} messages; median [p90] per turn)")
    labels = {
        "baseline": "bare openai SDK call (chat.completions.create)",
        "post": "bare openai SDK call (client.post, same body)",
        "full": "agentik, SQLite file, synchronous=full (default)",
        "normal": "agentik, SQLite file, synchronous=normal",
        "memory": "agentik, SQLite :memory:",
    }
    b_wall, b_cpu = med("baseline", 0), med("baseline", 1)
    for name in names:
        wall, cpu = med(name, 0), med(name, 1)
        first = name == "baseline"
        extra = "" if first else f"  ({(wall - b_wall) * 1e3:+.2f} ms wall"
        extra += "" if first else f", {(cpu - b_cpu) * 1e3:+.2f} ms CPU)"
        say(
            f"  {labels[name]:<50} wall {ms(wall)} [{ms(p90(name, 0))}]"
            f"  CPU {ms(cpu)} [{ms(p90(name, 1))}]{extra}"
        )
    say()

    rows: list[Row] = []
    for name, goal in (("full", True), ("normal", False), ("memory", False)):
        tag = {"full": "sync=full", "normal": "sync=normal", "memory": ":memory:"}[name]
        for i, what in ((0, "wall"), (1, "CPU")):
            value, base = med(name, i), med("baseline", i)
            ratio = value / base
            rows.append(
                Row(
                    f"turn {what} time ({tag})",
                    ms(value),
                    ms(base),
                    ratio,
                    "<= 1.15x" if goal else "-",
                    (ratio <= 1.15) if goal else None,
                    section="1",
                )
            )
    # agentik's own cost, against a bare call that also skips the SDK's transformation.
    for i, what in ((0, "wall"), (1, "CPU")):
        value, base = med("full", i), med("post", i)
        rows.append(
            Row(f"turn {what} (sync=full) vs bare post()", ms(value), ms(base), value / base,
                "-", None, section="1")
        )  # fmt: skip
    return rows


# -- 2. audit-log append rate -----------------------------------------------------------
def _new_message(i: int) -> NewMessage:
    return NewMessage(kind="user", content=f"message {i}: {FILLER}", created_at=time.time())


def raw_sqlite_appends(path: str, synchronous: str, n: int) -> float:
    """Baseline: stdlib sqlite3, same schema and PRAGMAs, one transaction per row."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        for m in MIGRATIONS:
            conn.executescript(m.sql)
        now = time.time()
        conn.execute(
            "INSERT INTO conversation (id, title, created_at, updated_at, meta)"
            " VALUES ('c0', '', ?, ?, '{}')",
            (now, now),
        )
        sql = (
            "INSERT INTO message (conversation_id, kind, content, author, channel, run_id,"
            " tool_call_id, tool_name, arguments, is_error, status, data, duration, created_at)"
            f" VALUES ({', '.join('?' * 14)})"
        )
        t0 = time.perf_counter()
        for i in range(n):
            m = _new_message(i)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                sql,
                (
                    "c0",
                    m.kind,
                    m.content,
                    m.author,
                    m.channel,
                    m.run_id,
                    m.tool_call_id,
                    m.tool_name,
                    m.arguments,
                    int(m.is_error),
                    m.status,
                    None,
                    m.duration,
                    m.created_at,
                ),
            )
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - t0
        (count,) = conn.execute("SELECT COUNT(*) FROM message").fetchone()
        if count != n:
            raise RuntimeError(f"raw sqlite wrote {count} rows, expected {n}")
        return n / elapsed
    finally:
        conn.close()


async def _store_with(path: str, synchronous: str, convs: int) -> tuple[SQLiteStore, list[str]]:
    store = SQLiteStore(path, synchronous=synchronous)  # type: ignore[arg-type]
    await store.start()
    ids = [f"c{i}" for i in range(convs)]
    now = time.time()
    await asyncio.gather(
        *(
            store.create_conversation(ConversationRecord(id=c, created_at=now, updated_at=now))
            for c in ids
        )
    )
    return store, ids


async def store_sequential_appends(path: str, synchronous: str, n: int) -> float:
    store, (cid,) = await _store_with(path, synchronous, 1)
    try:
        for i in range(10):  # warm-up
            await store.append(cid, log=[_new_message(i)])
        t0 = time.perf_counter()
        for i in range(n):
            await store.append(cid, log=[_new_message(i)])
        elapsed = time.perf_counter() - t0
        if await store.count_messages(cid) != n + 10:
            raise RuntimeError("store lost sequential appends")
        return n / elapsed
    finally:
        await store.aclose()


async def store_concurrent_appends(path: str, synchronous: str, convs: int, each: int) -> float:
    store, ids = await _store_with(path, synchronous, convs)

    async def writer(cid: str) -> None:
        for i in range(each):
            await store.append(cid, log=[_new_message(i)])

    try:
        await asyncio.gather(*(store.append(c, log=[_new_message(-1)]) for c in ids))  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(c) for c in ids))
        elapsed = time.perf_counter() - t0
        total = sum([await store.count_messages(c) for c in ids])
        if total != convs * (each + 1):
            raise RuntimeError("store lost concurrent appends")
        return convs * each / elapsed
    finally:
        await store.aclose()


async def aiosqlite_round_trip(path: str, n: int) -> tuple[float, float]:
    """Wall and CPU seconds of one aiosqlite call (a hop to its thread and back)."""
    conn = await aiosqlite.connect(path, isolation_level=None)
    try:
        for _ in range(50):
            await conn.execute("SELECT 1")
        w0, c0 = time.perf_counter(), process_cpu()
        for _ in range(n):
            await conn.execute("SELECT 1")
        return (time.perf_counter() - w0) / n, (process_cpu() - c0) / n
    finally:
        await conn.close()


async def bench_appends(cfg: Config, tmp: str) -> list[Row]:
    results: dict[tuple[str, str], list[float]] = {}
    counter = 0

    def fresh() -> str:
        nonlocal counter
        counter += 1
        return os.path.join(tmp, f"append-{counter}.db")

    for r in range(cfg.append_rounds):
        for sync in ("full", "normal"):
            n = cfg.seq_appends_full if sync == "full" else cfg.seq_appends_normal
            kinds = ["raw", "seq", "conc"]
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                gc.collect()
                if kind == "raw":
                    rate = raw_sqlite_appends(fresh(), sync, n)
                elif kind == "seq":
                    rate = await store_sequential_appends(fresh(), sync, n)
                else:
                    rate = await store_concurrent_appends(
                        fresh(), sync, cfg.conc_convs, cfg.conc_per_conv
                    )
                results.setdefault((sync, kind), []).append(rate)

    def med(sync: str, kind: str) -> float:
        return statistics.median(results[(sync, kind)])

    say(
        f"== 2. audit-log append rate (median of {cfg.append_rounds} rounds; sequential:"
        f" {cfg.seq_appends_full:,} (full) / {cfg.seq_appends_normal:,} (normal) appends;"
    )
    say(
        f"      concurrent: {cfg.conc_convs} conversations x {cfg.conc_per_conv} appends;"
        " baseline: raw sqlite3, one transaction per row)"
    )
    hop_wall, hop_cpu = await aiosqlite_round_trip(fresh(), cfg.seq_appends_full)
    say(
        f"  (one aiosqlite call round trip: {hop_wall * 1e6:.0f} us wall,"
        f" {hop_cpu * 1e6:.0f} us CPU)"
    )
    rows: list[Row] = []
    for sync in ("full", "normal"):
        raw = med(sync, "raw")
        durable = sync == "full"
        say(f"  synchronous={sync:<7} raw sqlite3 {per_s(raw, 'msg/s'):>16}")
        for kind, label in (("seq", "sequential"), ("conc", f"{cfg.conc_convs} concurrent")):
            value = med(sync, kind)
            say(f"  synchronous={sync:<7} store {label:<15} {per_s(value, 'msg/s'):>16}")
            rows.append(
                Row(
                    f"append {label}, sync={sync}{'' if durable else ' (not durable)'}",
                    per_s(value, "msg/s"),
                    per_s(raw, "msg/s"),
                    value / raw,
                    ">= 5,000/s" if durable else "-",
                    (value >= 5_000) if durable else None,
                    section="2",
                )
            )
    say()
    return rows


# -- 3. RSS of bound conversations --------------------------------------------------------
def _settled_rss() -> int:
    gc.collect()
    return proc_status()["VmRSS"]


async def rss_child(n: int, event_convs: int, tmp: str) -> dict[str, Any]:
    """Runs in a fresh interpreter; returns what it measured."""
    # The model is never called here; the backend still builds its HTTP client, as in a bot.
    llm = OpenAIBackend(model=MODEL, base_url="http://127.0.0.1:9/v1")
    store = SQLiteStore(os.path.join(tmp, "rss.db"))
    out: dict[str, Any] = {}
    async with Agent(llm=llm, store=store) as agent:

        async def bind(keys: list[str]) -> list[Any]:
            convs: list[Any] = []
            for i in range(0, len(keys), 500):  # concurrent, as many channels joining would be
                chunk = keys[i : i + 500]
                convs += await asyncio.gather(*(agent.conversation_for_channel(k) for k in chunk))
            return convs

        warm = await bind([f"warm:net:#w{i}" for i in range(200)])  # prime caches and pools
        before = _settled_rss()
        t0 = time.perf_counter()
        convs = await bind([f"irc:net:#c{i}" for i in range(n)])
        out["bind_seconds"] = time.perf_counter() - t0
        after = _settled_rss()
        again = await bind([f"irc:net:#c{i}" for i in range(n)])
        out["same_objects"] = all(a is b for a, b in zip(convs, again, strict=True))
        del again
        out.update(before=before, after=after, n=n)

        # Every conversation streams an answer (one TextDelta per token), so each would
        # keep a replay buffer; the agent-wide event budget must bound the total.
        per_conv_events = 64

        def fill_buffers(sample: list[Any]) -> None:
            for conv in sample:
                for j in range(per_conv_events):
                    conv.parts.events.emit(TextDelta, "run_simulated", text=f" tok{j}")

        ev_before = _settled_rss()
        fill_buffers(convs)
        ev_after = _settled_rss()
        out.update(
            event_convs=len(convs),
            event_buffer=per_conv_events,
            event_budget=agent.event_budget,
            buffered=agent.services.buffered,
            ev_before=ev_before,
            ev_after=ev_after,
        )
        # A transport that forgets its conversations should free them (the agent only
        # keeps weak references to idle ones).
        del convs, warm
        await asyncio.sleep(0)  # the finished gather() future holds its results until now
        gc.collect()
        out["open_after_drop"] = len(agent.services.open)
        out["locks_after_drop"] = len(agent._channel_lock)
    return out


def bench_rss(cfg: Config, tmp: str) -> list[Row]:
    proc = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--rss-child",
            str(cfg.rss_convs),
            "--rss-event-convs",
            str(cfg.rss_event_convs),
            "--tmpdir",
            tmp,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed:\n{proc.stderr}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    n = res["n"]
    delta = res["after"] - res["before"]
    goal_mb = 50 * n / 10_000  # 50 MB per 10,000 conversations (scaled for --quick)
    per_conv = delta / n
    say(f"== 3. RSS of {n:,} channel-bound conversations (fresh subprocess)")
    say(f"  RSS before {mb(res['before'])}, after {mb(res['after'])}: +{mb(delta)}")
    say(f"  = {per_conv:,.0f} bytes per conversation; bound in {res['bind_seconds']:.2f} s")
    say(f"  second lookup returned the same objects: {res['same_objects']}")
    say(
        f"  after {res['event_buffer']} events streamed in each of {res['event_convs']:,}"
        f" conversations: +{mb(res['ev_after'] - res['ev_before'])};"
        f" {res['buffered']:,} events buffered (agent budget {res['event_budget']:,})"
    )
    say(
        f"  after the caller dropped every conversation: {res['open_after_drop']:,} still open,"
        f" {res['locks_after_drop']:,} per-channel locks still held by the agent"
    )
    say()
    return [
        Row(
            f"RSS for {n:,} bound conversations",
            f"+{mb(delta)}",
            mb(res["before"]),
            res["after"] / res["before"],
            f"<= +{goal_mb:g} MB",
            delta <= goal_mb * 2**20,
            section="3",
        ),
        Row(
            f"  ... after {res['event_buffer']} events in each",
            f"+{mb(res['ev_after'] - res['before'])}",
            mb(res["before"]),
            res["ev_after"] / res["before"],
            "-",
            None,
            section="3",
        ),
    ]


# -- 4. history pages -----------------------------------------------------------------
async def bench_history(cfg: Config, tmp: str) -> list[Row]:
    store = SQLiteStore(os.path.join(tmp, "history.db"))
    llm = OpenAIBackend(model=MODEL, base_url="http://127.0.0.1:9/v1")
    async with Agent(llm=llm, store=store) as agent:
        big = await agent.create_conversation(title="big")
        small = await agent.create_conversation(title="small")
        ids: dict[str, list[int]] = {big.id: [], small.id: []}
        per_call = 1_000
        calls = cfg.hist_big // per_call
        small_per_call = max(1, cfg.hist_small // calls)
        t0 = time.perf_counter()
        # Interleave the two so their rows share the table as in a busy bot.
        for c in range(calls):
            now = time.time()
            for conv, count in ((big, per_call), (small, small_per_call)):
                rows = [
                    NewMessage(
                        kind="user" if i % 2 == 0 else "assistant",
                        content=f"message {c}.{i}: {FILLER}",
                        created_at=now,
                    )
                    for i in range(count)
                ]
                ids[conv.id] += [m.id for m in await store.append(conv.id, log=rows)]
        while len(ids[small.id]) < cfg.hist_small:
            (m,) = await store.append(small.id, log=[_new_message(0)])
            ids[small.id].append(m.id)
        fill = time.perf_counter() - t0
        for conv in (big, small):
            count = await store.count_messages(conv.id)
            if count != len(ids[conv.id]):
                raise RuntimeError(f"{conv.title}: {count} rows, expected {len(ids[conv.id])}")

        queries = ("latest", "after_mid", "before_mid")

        async def page(conv: Any, query: str) -> list[Any]:
            mid = ids[conv.id][len(ids[conv.id]) // 2]
            if query == "latest":
                return await conv.messages(limit=50)
            if query == "after_mid":
                return await conv.messages(after=mid, limit=50)
            return await conv.messages(before=mid, limit=50)

        # Warm up and check the pages are right.
        for conv in (big, small):
            mid_index = len(ids[conv.id]) // 2
            expect = {
                "latest": ids[conv.id][-50:],
                "after_mid": ids[conv.id][mid_index + 1 : mid_index + 51],
                "before_mid": ids[conv.id][mid_index - 50 : mid_index],
            }
            for q in queries:
                for _ in range(5):
                    got = [m.id for m in await page(conv, q)]
                if got != expect[q]:
                    raise RuntimeError(f"{conv.title} {q}: wrong page")

        times: dict[tuple[str, str], list[float]] = {}
        for r in range(cfg.hist_reps):
            for q in queries:
                pair = (big, small) if r % 2 == 0 else (small, big)
                for conv in pair:
                    t = time.perf_counter()
                    await page(conv, q)
                    times.setdefault((conv.title, q), []).append(time.perf_counter() - t)

    def med(title: str, q: str) -> float:
        return statistics.median(times[(title, q)])

    nb, ns = len(ids[big.id]), len(ids[small.id])
    say(f"== 4. history page of 50 ({nb:,} vs {ns:,} messages; {cfg.hist_reps} reps each,")
    say(f"      median; filled {nb + ns:,} rows in {fill:.2f} s)")
    rows: list[Row] = []
    labels = {
        "latest": "messages(limit=50)",
        "after_mid": "messages(after=mid, limit=50)",
        "before_mid": "messages(before=mid, limit=50)",
    }
    for q in queries:
        b, s = med("big", q), med("small", q)
        say(f"  {labels[q]:<32} {nb:,}: {ms(b)}   {ns:,}: {ms(s)}   ratio {b / s:.2f}x")
        goal = q != "before_mid"
        rows.append(
            Row(
                f"{labels[q]}, {nb // 1000}k vs {ns // 1000}k",
                ms(b),
                ms(s),
                b / s,
                "<= 1.5x" if goal else "-",
                (b / s <= 1.5) if goal else None,
                section="4",
            )
        )
    say()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: all of {','.join(SECTIONS)})",
    )
    parser.add_argument("--tmpdir", default=None, help="where to put the SQLite files")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    parser.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rss-event-convs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.rss_child is not None:
        res = asyncio.run(rss_child(args.rss_child, args.rss_event_convs, args.tmpdir))
        print(json.dumps(res))
        return 0

    cfg = QUICK if args.quick else FULL
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="agentik-bench-", dir=args.tmpdir) as tmp:
        print_environment(cfg, tmp)
        if "turns" in only:
            with fake_openai_server() as url:
                rows += asyncio.run(bench_turns(cfg, tmp, url))
        if "append" in only:
            rows += asyncio.run(bench_appends(cfg, tmp))
        if "rss" in only:
            rows += bench_rss(cfg, tmp)
        if "history" in only:
            rows += asyncio.run(bench_history(cfg, tmp))
    return finish(rows, strict=args.strict, sections=True, started=started)


if __name__ == "__main__":
    sys.exit(main())
