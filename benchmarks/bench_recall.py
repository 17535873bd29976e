"""Benchmarks for semantic memory (``make bench`` runs it).

1. Recall quality on the labelled set ``benchmarks/data/recall.json`` (notes,
   and questions that paraphrase them with few shared words): recall@5 of
   hybrid search (FTS5 + builtin embeddings, reciprocal-rank fusion) against
   FTS5 alone, both through ``SQLiteMemory.search_scored`` on a real SQLite
   file.  Goal: hybrid >= FTS + 0.25 (absolute).
2. Latency: hybrid ``SQLiteMemory.search`` over 100,000 notes spread over 51
   scopes (a search sees three), median ms; the FTS-only search on the same
   database is the baseline.  Goal: p50 <= 20 ms on bench_memory's 50-word
   vocabulary (every word is in a fifth of the notes: the full-text half's worst
   case, which dominates); the same with a 20,000-word Zipf vocabulary (closer to
   real text) is informational.
3. Embedding throughput of the builtin model (notes/s), single batch of
   100,000 short notes (informational).

``--quick`` runs a smaller version (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentik.core import SQLiteStore
from agentik.core.memory.embeddings import BuiltinEmbedder
from agentik.core.memory.sqlite import SQLiteMemory, _blob, scope_key

from _common import Row, finish, ms, per_s, say, say_environment, version

DATA = Path(__file__).parent / "data" / "recall.json"
WORDS = (
    "release deploy friday alice bob carol meeting notes coffee tea green server database "
    "backup monday budget design review test flaky build cache docker kernel python rust "
    "sqlite index query latency memory network router firewall printer invoice holiday "
    "birthday project roadmap customer ticket incident outage pager oncall schedule lunch"
).split()


def recall_at(found: list[int], relevant: list[int]) -> float:
    return len(set(found) & set(relevant)) / len(relevant)


async def quality(tmp: str, embedder: BuiltinEmbedder, k: int = 5) -> tuple[list[Row], float]:
    data = json.loads(DATA.read_text())
    store = SQLiteStore(f"{tmp}/quality.db")
    await store.start()
    memory = SQLiteMemory(store, embedder=embedder)
    await memory.start()
    ids: dict[int, int] = {}
    for note in data["notes"]:
        ids[(await memory.save("global", note["text"])).id] = note["id"]
    scores: dict[str, list[float]] = {"hybrid": [], "fts": [], "vector": []}
    for q in data["queries"]:
        for mode in scores:
            hits = await memory.search_scored(q["q"], ["global"], limit=k, mode=mode)  # type: ignore[arg-type]
            scores[mode].append(recall_at([ids[n.id] for n, _ in hits], q["relevant"]))
    await store.aclose()
    mean = {m: statistics.fmean(v) for m, v in scores.items()}
    n = len(data["queries"])
    say(f"== recall@{k} on {len(data['notes'])} notes, {n} paraphrased queries")
    for m, v in mean.items():
        say(f"   {m:<7} {v:.3f}")
    gain = mean["hybrid"] - mean["fts"]
    rows = [
        Row(
            f"hybrid recall@{k} ({n} queries)",
            f"{mean['hybrid']:.3f}",
            f"fts {mean['fts']:.3f}",
            mean["hybrid"] / mean["fts"] if mean["fts"] else None,
            "hybrid >= fts + 0.25",
            gain >= 0.25,
            section="1",
        ),
        Row(f"vector-only recall@{k}", f"{mean['vector']:.3f}", "-", None, "-", None, section="1"),
    ]
    return rows, gain


def words_of(vocab: str, rng: random.Random, n: int) -> str:
    """``n`` words: from the 50 of :data:`WORDS` (as bench_memory: each word is in
    about a fifth of the notes, the full-text worst case), or ``zipf``: from 20,000
    words with Zipf frequencies, as text has."""
    if vocab == "zipf":
        return " ".join(f"w{i}" for i in rng.choices(ZIPF_RANGE, cum_weights=ZIPF_CUM, k=n))
    return " ".join(rng.choice(WORDS) for _ in range(n))


ZIPF_RANGE = range(20_000)
ZIPF_CUM = list(itertools.accumulate(1.0 / (i + 1) for i in ZIPF_RANGE))


def bulk(path: str, n: int, embedder: BuiltinEmbedder, vocab: str, seed: int = 7) -> float:
    """``n`` notes with their vectors written straight into the file; returns the
    embedding throughput (notes/s)."""
    rng = random.Random(seed)
    scopes = ["global", *(f"channel:irc:net:#c{i}" for i in range(50))]
    notes = [(i + 1, rng.choice(scopes), words_of(vocab, rng, 12)) for i in range(n)]
    embedder.load()
    started = time.perf_counter()
    vectors = embedder.embed_sync([t for _, _, t in notes])
    rate = n / (time.perf_counter() - started)
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO memory_note (id, scope, scope_key, text, author, version, deleted,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, NULL, 1, 0, 0, 0)",
            [(i, s, scope_key(s), t) for i, s, t in notes],
        )
        conn.executemany(
            "INSERT INTO memory_vector (note_id, model, dim, vector) VALUES (?, ?, ?, ?)",
            [
                (i, embedder.model, embedder.dim, _blob(v))
                for (i, _, _), v in zip(notes, vectors, strict=True)
            ],
        )
    conn.close()
    return rate


async def latency(
    tmp: str, n: int, repeats: int, embedder: BuiltinEmbedder, vocab: str
) -> list[Row]:
    path = f"{tmp}/big-{vocab}.db"
    store = SQLiteStore(path)
    await store.start()
    await store.aclose()
    rate = bulk(path, n, embedder, vocab)
    store = SQLiteStore(path)
    await store.start()
    memory = SQLiteMemory(store, embedder=embedder)
    await memory.start()
    scopes = ["global", "channel:irc:net:#c3", "channel:irc:net:#c7"]
    rng = random.Random(3)
    queries = [words_of(vocab, rng, 5) for _ in range(repeats)]
    await memory.search("warm up the index", scopes)  # loads the vectors once
    times: dict[str, list[float]] = {"hybrid": [], "fts": []}
    for q in queries:
        for mode in times:
            started = time.perf_counter()
            await memory.search_scored(q, scopes, limit=10, mode=mode)  # type: ignore[arg-type]
            times[mode].append(time.perf_counter() - started)
    await store.aclose()
    p50 = {m: statistics.median(v) for m, v in times.items()}
    label = "50 words" if vocab == "words" else "zipf 20k words"
    say(
        f"== hybrid search over {n:,} notes ({label}): p50 {ms(p50['hybrid'])}"
        f" (fts {ms(p50['fts'])})"
    )
    rows = [
        Row(
            f"hybrid search p50, {n:,} notes ({label})",
            ms(p50["hybrid"]),
            f"fts {ms(p50['fts'])}",
            p50["hybrid"] / p50["fts"],
            "<= 20 ms" if vocab == "words" else "info",
            p50["hybrid"] <= 0.020 if vocab == "words" else None,
            section="2",
        ),
    ]
    if vocab != "words":
        return rows
    return [
        *rows,
        Row(
            f"embedding throughput ({embedder.model})",
            per_s(rate, "notes/s"),
            "-",
            None,
            "-",
            None,
            section="3",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    say_environment([("wordllama", version("wordllama")), ("numpy", version("numpy"))])
    embedder = BuiltinEmbedder()
    n, repeats = (5_000, 30) if args.quick else (100_000, 200)

    async def run() -> list[Row]:
        with tempfile.TemporaryDirectory() as tmp:
            rows, _ = await quality(tmp, embedder)
            rows += await latency(tmp, n, repeats, embedder, "words")
            rows += await latency(tmp, n, repeats, embedder, "zipf")
            return rows

    rows = sorted(asyncio.run(run()), key=lambda r: r.section)
    return finish(rows, strict=args.strict, sections=True, started=started)


if __name__ == "__main__":
    sys.exit(main())
