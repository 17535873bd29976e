"""What recall costs: nothing when it cannot find anything (no note with a vector
in the conversation's scopes: no embedding computed, the builtin model and numpy
not even loaded), one embedding per turn's message otherwise (recall and a
``memory_search`` of the same words share it), notes another process writes are
recalled, and the memory-mapped builtin model gives wordllama's own vectors.  The
database's tests run on SQLite and on PostgreSQL (tests/memengines.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.memory import RecallPolicy
from agentik.core.memory.embeddings import BuiltinEmbedder, OpenAIEmbedder, builtin_files, normalize
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.recall import BLOCK_START
from agentik.core.testing.openai_server import Reply
from agentik.transports.testing import MemoryTransport
from helpers import agentik

from rigs import eventually

pytest_plugins = ["pgserver", "memengines"]

TOKYO = "Heidi speaks fluent Japanese and handles the Tokyo customers."
QUESTION = "who talks to our clients in Japan?"
TEXTS = [
    QUESTION,
    TOKYO,
    "",
    "   ",
    "a",
    "Bob is allergic to peanuts; no satay at team lunches.",
    "Ünïcödé, emoji 🚀 and 漢字 mixed with ASCII words",
    "x" * 5000,
    *(f"note {i}: the {i}th deploy went to box {i % 7}" for i in range(140)),
]


def _user_messages(body: dict) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "user"]


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_the_memory_mapped_model_gives_wordllamas_own_vectors(dim):
    """Vectors stored before (computed by wordllama's inference over its float32
    copy of the weights) stay comparable with the ones computed now."""
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    weights, tokenizer = builtin_files()
    with safe_open(str(weights), framework="np", device="cpu") as f:
        matrix = f.get_tensor("embedding.weight")[:, :dim]
    theirs = normalize(
        WordLlamaInference(matrix, Tokenizer.from_file(str(tokenizer))).embed(TEXTS, norm=False)
    )
    embedder = BuiltinEmbedder(dim)
    ours = embedder.embed_sync(TEXTS)
    assert embedder.model == f"wordllama:l2_supercat:{dim}"
    assert ours.shape == (len(TEXTS), dim) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    # One at a time (the query path) gives the same rows as a batch.
    np.testing.assert_allclose(embedder.embed_sync([TOKYO])[0], ours[1], rtol=0, atol=1e-6)


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")
def test_the_builtin_weights_are_mapped_from_the_package_file_not_copied(tmp_path):
    """The weights stay in the file's pages (shared by every process using them):
    loading the model maps the safetensors file, and the process's private memory
    grows by far less than the 32 MB a float32 copy of the weights alone took."""
    script = textwrap.dedent(
        """
        import json
        import numpy, tokenizers  # their own cost is not the model's
        from agentik.core.memory.embeddings import BuiltinEmbedder, builtin_files

        def private_kb():
            with open("/proc/self/smaps_rollup") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            return sum(int(fields[k].split()[0]) for k in ("Private_Dirty", "Private_Clean"))

        before = private_kb()
        e = BuiltinEmbedder()
        e.embed_sync(["Heidi speaks fluent Japanese and handles the Tokyo customers."] * 64)
        maps = open("/proc/self/maps").read()
        print(json.dumps({"mapped": str(builtin_files()[0]) in maps,
                          "grew_kb": private_kb() - before}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["mapped"]
    # The tokenizer's tables are most of what remains (about 12 MB); reading the
    # weights and converting them cost 50 MB.
    assert out["grew_kb"] < 24 * 1024, out


async def test_a_bot_with_no_notes_answers_without_loading_the_embedding_model(
    tmp_path, engine, open_db
):
    """Memory and recall on, builtin embeddings, no note: turns are answered and
    neither the model nor numpy is loaded.  The first note saved in the channel
    is recalled by the next turn (and only then is the model loaded)."""
    if engine == "postgres":
        opened = (
            "from agentik.core.store.postgres import PostgresStore as Store\n"
            "from agentik.core.memory.postgres import PostgresMemory as Memory\n"
            f"WHERE = {open_db.where!r}"
        )
    else:
        opened = (
            "from agentik.core import SQLiteStore as Store\n"
            "from agentik.core.memory.sqlite import SQLiteMemory as Memory\n"
            "WHERE = 'bot.db'"
        )
    script = (
        textwrap.dedent(
            """
        import asyncio, json, sys
        from agentik.bot.bridge import Bridge, ChannelOptions
        from agentik.core import Agent, OpenAIBackend
        from agentik.core.memory import RecallPolicy
        from agentik.core.memory.embeddings import BuiltinEmbedder
        from agentik.core.testing.openai_server import FakeOpenAIServer
        from agentik.transports.testing import MemoryTransport
        OPENED

        async def main():
            out = {{}}
            async with FakeOpenAIServer(model="fake-model") as server:
                store = Store(WHERE)
                embedder = BuiltinEmbedder()
                memory = Memory(store, embedder=embedder,
                                      recall=RecallPolicy(enabled=True, k=3, min_score=0.3))
                llm = OpenAIBackend(model="fake-model", base_url=server.base_url,
                                    api_key="sk-test", max_retries=0)
                async with Agent(llm=llm, store=store, memory=memory) as agent:
                    bridge = Bridge(agent, role_for=lambda *_: "admin")
                    t = MemoryTransport(name="mem")
                    bridge.attach(t, ChannelOptions(command_prefix="!"))
                    await t.start(bridge)
                    for i in range(5):
                        await t.inject({QUESTION!r}, channel_key="mem:#ops", addressed=True)
                        await bridge.flush("mem:#ops")
                    out["answers"] = sum(1 for m in t.sent if m.kind == "answer")
                    out["loaded"] = embedder.loaded
                    out["numpy"] = "numpy" in sys.modules
                    out["tokenizers"] = "tokenizers" in sys.modules
                    await memory.save("channel:mem:#ops", {TOKYO!r})
                    await t.inject({QUESTION!r}, channel_key="mem:#ops", addressed=True)
                    await bridge.flush("mem:#ops")
                    users = [str(m["content"]) for m in server.requests[-1]["messages"]
                             if m["role"] == "user"]
                    out["recalled"] = "Tokyo customers" in users[-1]
                    out["loaded_after"] = embedder.loaded
                    await t.aclose()
                    await bridge.aclose()
            print(json.dumps(out))

        asyncio.run(main())
        """
        )
        .format(QUESTION=QUESTION, TOKYO=TOKYO)
        .replace("OPENED", opened)
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["answers"] >= 5
    assert out == {
        "answers": out["answers"],
        "loaded": False,
        "numpy": False,
        "tokenizers": False,
        "recalled": True,
        "loaded_after": True,
    }


async def test_a_message_is_embedded_once_and_only_where_a_note_could_be_found(
    open_db, openai_server
):
    """Through an embeddings endpoint (each request is visible at the fake server):
    a turn in a channel whose scopes hold no note sends none; a turn in the channel
    with a note sends one for its message, and the model's ``memory_search`` of the
    same words in that turn reuses it."""
    store, memory_class = open_db()
    embedder = OpenAIEmbedder("fake-embed", base_url=openai_server.base_url, api_key="x")
    memory = memory_class(
        store, embedder=embedder, recall=RecallPolicy(enabled=True, k=3, min_score=0.0)
    )
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, api_key="sk-test", max_retries=0
    )
    question = "where do the deploys go?"
    async with Agent(llm=llm, store=store, memory=memory) as agent:
        await memory.save("channel:mem:#dev", "the deploys go to the Hetzner box")
        assert len(openai_server.embedding_requests) == 1  # the note's
        bridge = Bridge(agent, role_for=lambda *_: "admin")
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(command_prefix="!"))
        await t.start(bridge)
        try:
            for _ in range(3):
                await t.inject(question, channel_key="mem:#ops", addressed=True)
                await bridge.flush("mem:#ops")
            assert len(openai_server.embedding_requests) == 1  # #ops sees no note: no request
            assert not any(BLOCK_START in u for u in _user_messages(openai_server.requests[-1]))

            openai_server.enqueue(
                Reply.tool_calls([("c1", "memory_search", json.dumps({"query": question}))]),
                Reply.text("they go to Hetzner"),
            )
            await t.inject(question, channel_key="mem:#dev", addressed=True)
            await bridge.flush("mem:#dev")
            first, second = openai_server.requests[-2:]
            assert "Hetzner box" in _user_messages(first)[-1]  # recalled
            tool_results = [m for m in second["messages"] if m["role"] == "tool"]
            assert "Hetzner box" in str(tool_results[-1]["content"])  # found by the search
            inputs = [r["input"] for r in openai_server.embedding_requests[1:]]
            assert inputs == [[question]]  # one embedding for recall and search together
        finally:
            await t.aclose()
            await bridge.aclose()


def _cli(tmp_path: Path, *args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    storage = '[storage]\nbackend = "postgres"\n' if dsn else ""
    (tmp_path / "bot.toml").write_text(
        '[llm]\nbackend = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n' + storage,
        encoding="utf-8",
    )
    env = {"AGENTIK_POSTGRES_DSN": dsn} if dsn else None
    return agentik(*args, "-c", str(tmp_path / "bot.toml"), cwd=tmp_path, env=env)


async def test_a_note_another_process_adds_is_recalled(tmp_path, engine, open_db):
    """A running bot's memory had nothing to recall; ``agentik memory add`` (another
    process, the same database) saves a note: the bot recalls it (within the
    documented ``SYNC_INTERVAL``, without a restart)."""
    if engine == "sqlite":
        store, memory_class = SQLiteStore(str(tmp_path / "agentik.db")), SQLiteMemory
    else:
        store, memory_class = open_db()
    await store.start()
    embedder = BuiltinEmbedder()
    memory = memory_class(store, embedder=embedder)
    await memory.start()
    try:
        assert await memory.recall(QUESTION, ["global"], k=3, min_score=0.3) == []
        assert not embedder.loaded
        dsn = open_db.where if engine == "postgres" else None
        r = _cli(tmp_path, "memory", "add", "global", TOKYO, dsn=dsn)
        assert r.returncode == 0, r.stderr

        async def recalled() -> bool:
            found = await memory.recall(QUESTION, ["global"], k=3, min_score=0.3)
            return [n.text for n, _ in found] == [TOKYO]

        await eventually(recalled, "the other process's note to be recalled")
    finally:
        await store.aclose()
