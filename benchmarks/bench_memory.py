"""Benchmarks for long conversations and long-term memory (``make bench`` runs it).

1. Context build: loading a conversation's LLM context (working memory plus
   the crash-recovery check of the audit log) for a conversation with
   100,000 audit-log messages whose working memory was compacted, against
   one with 100 messages, never compacted.  Goal: ratio <= 1.5 (the cost
   must not grow with history).
2. Memory search: ``SQLiteMemory.search`` over 100,000 notes (median ms),
   against the same FTS5 query run with plain ``sqlite3`` on the same file
   (agentik's own overhead), and against a 1,000-note database (scaling).
   Notes are spread over 51 scopes (global and 50 channels); a search sees
   three of them, as a conversation does.

``--quick`` runs a smaller version (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from agentik.core import Agent, SQLiteStore
from agentik.core.memory.sqlite import SQLiteMemory, fts_query, scope_key
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.testing.scripted import ScriptedModel

from _common import Row, finish, ms, say, say_environment, version

WORDS = (
    "release deploy friday alice bob carol meeting notes coffee tea green server database "
    "backup monday budget design review test flaky build cache docker kernel python rust "
    "sqlite index query latency memory network router firewall printer invoice holiday "
    "birthday project roadmap customer ticket incident outage pager oncall schedule lunch"
).split()


@dataclass(frozen=True)
class Config:
    history: int
    small: int
    notes: int
    small_notes: int
    repeats: int


FULL = Config(history=100_000, small=100, notes=100_000, small_notes=1_000, repeats=200)
QUICK = Config(history=5_000, small=100, notes=5_000, small_notes=500, repeats=30)


def sentence(rng: random.Random, n: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


#: Notes' vocabulary: the common words above plus 5,000 rarer made-up ones,
#: drawn with a Zipf-like distribution as real text is.
VOCABULARY = WORDS + [f"w{i:04d}" for i in range(5000)]
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]


def note_text(rng: random.Random, n: int = 15) -> str:
    return " ".join(rng.choices(VOCABULARY, WEIGHTS, k=n))


async def fill_conversation(store: SQLiteStore, conv_id: str, n: int, rng: random.Random) -> None:
    """``n`` audit-log messages (user/assistant pairs) with a working memory to match."""
    batch = 500
    for start in range(0, n, batch):
        log: list[NewMessage] = []
        memory: list[ChatMessage] = []
        for i in range(start, min(n, start + batch)):
            kind = "user" if i % 2 == 0 else "assistant"
            text = sentence(rng)
            log.append(NewMessage(kind=kind, content=text, author="alice" if i % 2 == 0 else None))
            memory.append(
                ChatMessage(role=kind, content=text, message_id=-(len(log)))  # type: ignore[arg-type]
            )
        await store.append(conv_id, log=log, memory=memory)


async def context_build(cfg: Config, tmp: str) -> list[Row]:
    say("== 1. context build: 100k-message compacted conversation vs 100-message one")
    rng = random.Random(1)
    store = SQLiteStore(f"{tmp}/history.db", synchronous="off")
    agent = Agent(llm=ScriptedModel(), store=store)
    async with agent:
        big = await agent.create_conversation(title="big")
        small = await agent.create_conversation(title="small")
        t0 = time.perf_counter()
        await fill_conversation(store, big.id, cfg.history, rng)
        await fill_conversation(store, small.id, cfg.small, rng)
        # Compact the big one as the agent does: summary + the last 8 messages.
        entries = await store.load_memory(big.id)
        await big.compact(
            entries[-9].pos, "Summary of the earlier conversation:\n" + sentence(rng, 120)
        )
        say(f"  filled {cfg.history:,} + {cfg.small} messages in {time.perf_counter() - t0:.1f}s")
        assert len(await big.working_memory()) == 9

        async def build(conv) -> float:
            memory = conv.parts.memory
            memory.invalidate()
            t = time.perf_counter()
            await memory.load()
            return time.perf_counter() - t

        samples: dict[str, list[float]] = {"big": [], "small": []}
        for _ in range(cfg.repeats):  # interleaved, so drift hits both alike
            samples["big"].append(await build(big))
            samples["small"].append(await build(small))
    b = statistics.median(samples["big"])
    s = statistics.median(samples["small"])
    say(f"  median context build: {ms(b)} (100k, compacted) vs {ms(s)} (100, not compacted)")
    say()
    return [
        Row(
            f"context build, {cfg.history // 1000}k compacted vs {cfg.small} msgs",
            ms(b),
            ms(s),
            b / s,
            "<= 1.5x",
            b / s <= 1.5,
            section="1",
        )
    ]


def bulk_notes(conn: sqlite3.Connection, n: int, seed: int) -> None:
    rng = random.Random(seed)
    now = time.time()
    scopes = ["global"] + [f"channel:irc:net:#c{i}" for i in range(50)]
    for start in range(0, n, 5000):
        rows = []
        for i in range(start, min(n, start + 5000)):
            scope = rng.choice(scopes)
            rows.append((i + 1, scope, scope_key(scope), note_text(rng), "bench", now, now))
        conn.executemany(
            "INSERT INTO memory_note (id, scope, scope_key, text, author, version, deleted,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 1, 0, ?, ?)",
            rows,
        )
        conn.executemany(
            "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
            " VALUES (?, 1, ?, 'save', ?, ?)",
            [(r[0], r[3], r[4], r[5]) for r in rows],
        )


async def memory_search(cfg: Config, tmp: str) -> list[Row]:
    say(f"== 2. memory search over {cfg.notes:,} notes")
    rng = random.Random(7)
    queries = [" ".join(rng.choices(VOCABULARY, WEIGHTS, k=3)) for _ in range(cfg.repeats)]
    scopes = ["global", "channel:irc:net:#c1", "user:net:alice"]
    results: dict[str, float] = {}
    for label, n in (("big", cfg.notes), ("small", cfg.small_notes)):
        path = f"{tmp}/notes-{label}.db"
        store = SQLiteStore(path, synchronous="off")
        await store.start()
        t0 = time.perf_counter()
        await store.run_write(lambda conn, n=n: bulk_notes(conn, n, 3))
        say(f"  {n:,} notes written in {time.perf_counter() - t0:.1f}s")
        memory = SQLiteMemory(store)
        await memory.start()
        times = []
        found = 0
        for q in queries:
            t = time.perf_counter()
            hits = await memory.search(q, scopes, limit=10)
            times.append(time.perf_counter() - t)
            found += len(hits)
        results[label] = statistics.median(times)
        say(f"  {label}: median {ms(results[label])}, {found / len(queries):.1f} hits per query")
        await memory.aclose()
        await store.aclose()
        if label == "big":
            conn = sqlite3.connect(path)
            raw = []
            for q in queries:
                t = time.perf_counter()
                conn.execute(
                    "SELECT n.id, n.scope, n.text FROM memory_fts JOIN memory_note n ON"
                    " n.id = memory_fts.rowid WHERE memory_fts MATCH ? AND n.deleted = 0 AND"
                    " n.scope IN (?, ?, ?) ORDER BY bm25(memory_fts, 1.0, 0.0) LIMIT 10",
                    (fts_query(q, scopes), *scopes),
                ).fetchall()
                raw.append(time.perf_counter() - t)
            conn.close()
            results["raw"] = statistics.median(raw)
            say(f"  plain sqlite3, same query: median {ms(results['raw'])}")
    say()
    big, small, raw = results["big"], results["small"], results["raw"]
    return [
        Row(
            f"memory search, {cfg.notes:,} notes vs plain sqlite3 FTS5",
            ms(big),
            ms(raw),
            big / raw,
            "info",
            None,
            section="2",
        ),
        Row(
            f"memory search, {cfg.notes:,} vs {cfg.small_notes:,} notes",
            ms(big),
            ms(small),
            big / small,
            "info",
            None,
            section="2",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    say_environment([("sqlite", sqlite3.sqlite_version), ("agentik", version("agentik"))])
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="agentik-bench-memory-") as tmp:
        rows += asyncio.run(context_build(cfg, tmp))
        rows += asyncio.run(memory_search(cfg, tmp))
    return finish(rows, strict=args.strict, sections=True, started=started)


if __name__ == "__main__":
    sys.exit(main())
