#!/usr/bin/env python3
"""The overhead table: what a turn costs the client with agentik and with other stacks.

Run with ``.venv/bin/python benchmarks/bench_overhead.py`` (``make bench``, which installs
the ``bench`` extra first); ``--quick`` is a much smaller run for smoke tests.

Every stack runs in its own child process (``--child <kind>``), so the RSS after its
imports is its own, and all of them talk to ONE fake OpenAI-compatible server in a
further process (its CPU is not counted): the same scripted answer (the user's message
echoed back, streamed in ``--chunks`` pieces with a usage chunk) to the same messages.
Each measured round is one new conversation of ``--turns`` turns (history grows to
``2 * turns - 1`` messages), and the children take their rounds in alternating order
(A B C ..., then ... C B A) to cancel drift on a noisy machine.

Per stack:

* **CPU per turn**: the child's CPU (all its threads, e.g. aiosqlite's, and its SQLite
  writer process: ``_common.process_cpu()``) from sending the message until the whole
  answer was read, median over every measured turn; the range is that of the rounds' medians;
* **RSS after import**: VmRSS once the stack is imported and its client/agent built
  (a bare ``python`` is the first line for reference); **peak RSS** is VmHWM at the end.

Stacks: agentik as a library (``Agent`` + ``Conversation.send``, reading the
conversation's ``chat`` event stream, i.e. streaming) with a ``MemoryStore`` and with a
``SQLiteStore`` in a temp file (durable: the default ``synchronous=full``); the bare
``openai`` SDK, streaming and not (``chat.completions.create``); openai-agents
(``Runner.run_streamed``), pydantic-ai (``Agent.run_stream``) and LangGraph (a one-node
graph over ``langchain_openai.ChatOpenAI``, ``stream_mode="messages"``, its history in
an ``InMemorySaver``).  The last three come from the ``bench`` extra; when one is not
installed its row says so and the rest are still measured.

Goal: agentik durable <= the bare streaming SDK + 1 ms of CPU per turn.  The exit status
is 0 unless ``--strict`` is given and the goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import ChildProcess, mb, proc_status, process_cpu, say, say_environment, version

MODEL = "fake-model"
FILLER = "the quick brown fox jumps over the lazy dog, "
NOT_INSTALLED = "not installed (pip install -e '.[bench]')"
GOAL_MS = 1.0

#: (kind, label, distributions whose versions the table names)
STACKS: list[tuple[str, str, tuple[str, ...]]] = [
    ("python", "bare python (reference)", ()),
    ("agentik-memory", "agentik, MemoryStore", ("agentik", "openai")),
    ("agentik-sqlite", "agentik, SQLiteStore (durable)", ("agentik", "openai")),
    ("openai-stream", "openai SDK, streaming", ("openai",)),
    ("openai-plain", "openai SDK, not streaming", ("openai",)),
    ("openai-agents", "openai-agents (run_streamed)", ("openai-agents",)),
    ("pydantic-ai", "pydantic-ai (run_stream)", ("pydantic-ai-slim",)),
    ("langgraph", "LangGraph + langchain-openai", ("langgraph", "langchain-openai")),
]


def turn_text(i: int) -> str:
    return f"turn {i}: {FILLER * 2}"


def expected(i: int) -> str:
    return "echo: " + turn_text(i)


# -- the fake server (its own process) ---------------------------------------------------
async def serve(chunks: int) -> None:
    """The fake OpenAI server answering every request with the echo in ``chunks`` pieces."""
    from agentik.core.testing.openai_server import FakeOpenAIServer, Reply, echo_reply

    def reply(body: dict[str, Any]) -> Reply:
        usage = echo_reply(body).usage
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        content = users[-1].get("content") if users else ""
        return Reply.text(f"echo: {content}", chunks=chunks, usage=usage)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with FakeOpenAIServer(MODEL) as server:
        server.default = reply
        print(server.base_url, flush=True)
        while not stop.is_set():
            # It records every request: forget them, the run is long.
            server.requests.clear()
            server.request_headers.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


# -- the stacks (each in a child process) ------------------------------------------------
class Stack:
    """One stack in its child: ``setup`` (imports, client), then conversations of turns."""

    async def setup(self, url: str) -> None:
        pass

    async def new_conversation(self) -> Any:
        return None

    async def turn(self, conv: Any, i: int) -> str:
        raise NotImplementedError

    async def end_conversation(self, conv: Any) -> None:
        pass

    async def close(self) -> None:
        pass


class PythonStack(Stack):
    async def turn(self, conv: Any, i: int) -> str:
        return expected(i)


class AgentikStack(Stack):
    def __init__(self, durable: bool, tmp: str) -> None:
        self.durable = durable
        self.tmp = tmp

    async def setup(self, url: str) -> None:
        from agentik.core import Agent, MemoryStore, OpenAIBackend, SQLiteStore

        store = SQLiteStore(os.path.join(self.tmp, "agentik.db")) if self.durable else MemoryStore()
        self.agent = Agent(llm=OpenAIBackend(model=MODEL, base_url=url, api_key="x"), store=store)
        await self.agent.start()

    async def new_conversation(self) -> Any:
        conv = await self.agent.create_conversation()
        return conv, conv.events(profile="chat")

    async def turn(self, conv: Any, i: int) -> str:
        conversation, events = conv
        await conversation.send(turn_text(i))
        parts: list[str] = []
        async for event in events:
            if event.kind == "text_delta":
                parts.append(event.text)
            elif event.kind == "turn_ended":
                break
        # Everything the turn does after its last event is part of its cost.
        await conversation.wait_idle()
        return "".join(parts)

    async def end_conversation(self, conv: Any) -> None:
        conversation, events = conv
        await events.aclose()
        await conversation.aclose()

    async def close(self) -> None:
        await self.agent.aclose()


class OpenAIStack(Stack):
    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def setup(self, url: str) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=url, api_key="x")

    async def new_conversation(self) -> Any:
        return []

    async def turn(self, conv: Any, i: int) -> str:
        conv.append({"role": "user", "content": turn_text(i)})
        if self.stream:
            stream = await self.client.chat.completions.create(
                model=MODEL, messages=conv, stream=True, stream_options={"include_usage": True}
            )
            parts: list[str] = []
            async for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta is not None and choice.delta.content:
                        parts.append(choice.delta.content)
            text = "".join(parts)
        else:
            completion = await self.client.chat.completions.create(model=MODEL, messages=conv)
            text = completion.choices[0].message.content or ""
        conv.append({"role": "assistant", "content": text})
        return text

    async def close(self) -> None:
        await self.client.close()


class OpenAIAgentsStack(Stack):
    async def setup(self, url: str) -> None:
        import openai
        from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

        set_tracing_disabled(True)
        self.client = openai.AsyncOpenAI(base_url=url, api_key="x")
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=self.client)
        self.agent = Agent(name="bench", model=model)
        self.runner = Runner

    async def new_conversation(self) -> Any:
        return {"items": []}

    async def turn(self, conv: Any, i: int) -> str:
        items = [*conv["items"], {"role": "user", "content": turn_text(i)}]
        result = self.runner.run_streamed(self.agent, input=items)
        parts: list[str] = []
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == (
                "response.output_text.delta"
            ):
                parts.append(event.data.delta)
        conv["items"] = result.to_input_list()
        return "".join(parts)

    async def close(self) -> None:
        await self.client.close()


class PydanticAIStack(Stack):
    async def setup(self, url: str) -> None:
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=url, api_key="x"))
        self.agent = Agent(model)

    async def new_conversation(self) -> Any:
        return {"history": None}

    async def turn(self, conv: Any, i: int) -> str:
        parts: list[str] = []
        async with self.agent.run_stream(turn_text(i), message_history=conv["history"]) as result:
            async for delta in result.stream_text(delta=True):
                parts.append(delta)
        conv["history"] = result.all_messages()
        return "".join(parts)


class LangGraphStack(Stack):
    async def setup(self, url: str) -> None:
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import START, MessagesState, StateGraph

        model = ChatOpenAI(model=MODEL, base_url=url, api_key="x", streaming=True)  # type: ignore[arg-type]

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", call_model)
        builder.add_edge(START, "model")
        self.graph = builder.compile(checkpointer=InMemorySaver())
        self.threads = 0

    async def new_conversation(self) -> Any:
        self.threads += 1
        return {"configurable": {"thread_id": f"t{self.threads}"}}

    async def turn(self, conv: Any, i: int) -> str:
        parts: list[str] = []
        async for message, _meta in self.graph.astream(
            {"messages": [("user", turn_text(i))]}, conv, stream_mode="messages"
        ):
            if isinstance(message.content, str):
                parts.append(message.content)
        return "".join(parts)


#: The import that tells whether a stack of the ``bench`` extra is installed.
NEEDS = {
    "openai-agents": "agents",
    "pydantic-ai": "pydantic_ai",
    "langgraph": "langgraph",
}


def make_stack(kind: str, tmp: str) -> Stack:
    return {
        "python": lambda: PythonStack(),
        "agentik-memory": lambda: AgentikStack(False, tmp),
        "agentik-sqlite": lambda: AgentikStack(True, tmp),
        "openai-stream": lambda: OpenAIStack(True),
        "openai-plain": lambda: OpenAIStack(False),
        "openai-agents": lambda: OpenAIAgentsStack(),
        "pydantic-ai": lambda: PydanticAIStack(),
        "langgraph": lambda: LangGraphStack(),
    }[kind]()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def child_main(kind: str, url: str, turns: int, tmp: str) -> None:
    """One stack: set up, report RSS, then run one conversation per ``round`` line."""
    import importlib.util

    need = NEEDS.get(kind)
    if need is not None and importlib.util.find_spec(need) is None:
        emit({"missing": True})
        return
    stack = make_stack(kind, tmp)
    await stack.setup(url)
    emit({"ready": True, "rss": proc_status()["VmRSS"]})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while True:
            line = (await reader.readline()).decode().strip()
            if not line or line == "quit":
                break
            conv = await stack.new_conversation()
            cpu: list[float] = []
            for i in range(turns):
                c0 = process_cpu()
                text = await stack.turn(conv, i)
                cpu.append(process_cpu() - c0)
                if text != expected(i):
                    raise RuntimeError(f"{kind}: turn {i} answered {text!r}")
            await stack.end_conversation(conv)
            status = proc_status()
            emit({"cpu": cpu, "rss": status["VmRSS"], "hwm": status["VmHWM"]})
    finally:
        await stack.close()


# -- the parent ----------------------------------------------------------------------------
class Server:
    """The fake server child (``--server``): started first, stopped last."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def __aenter__(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--server", "--chunks", str(self.chunks),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 60)).decode().strip()
        if not line.startswith("http"):
            raise RuntimeError(f"the fake OpenAI server did not start (printed {line!r})")
        return line

    async def __aexit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        say("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
        if n == 0:
            say("|" + "|".join("-" * (w + 2) for w in widths) + "|")


async def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    kinds = [k for k, *_ in STACKS if not args.only or k in args.only]
    tmp = tempfile.mkdtemp(prefix="bench-overhead-")
    say_environment(
        [
            ("stacks", ", ".join(f"{d} {version(d)}" for d in sorted(
                {d for _, _, ds in STACKS for d in ds}))),
            ("answer", f"the message echoed in {args.chunks} chunks + usage"),
            ("rounds", f"{args.rounds} x {args.turns}-turn conversations (+{args.warmup} warm-up)"),
            ("temp dir", tmp),
        ]
    )  # fmt: skip
    children: dict[str, ChildProcess] = {}
    ready: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[list[float]]] = {}
    last: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    async with Server(args.chunks) as url:
        try:
            for kind in kinds:  # one at a time: imports compete for the CPU otherwise
                child = await ChildProcess.spawn(
                    __file__, kind, tmp, kind, "--url", url, "--turns", str(args.turns),
                    "--tmp", tmp,
                )  # fmt: skip
                child.wait = 300.0
                first = await child.recv()
                if first.get("missing"):
                    missing.append(kind)
                    await child.proc.wait()
                    continue
                children[kind] = child
                ready[kind] = first
                samples[kind] = []
            order = list(children)
            for r in range(args.warmup + args.rounds):
                for kind in order if r % 2 == 0 else reversed(order):
                    await children[kind].send_line("round")
                    got = await children[kind].recv()
                    last[kind] = got
                    if r >= args.warmup:
                        samples[kind].append(got["cpu"])
        finally:
            for child in children.values():
                await child.stop()

    say(f"== per-turn client CPU and RSS ({args.rounds} rounds x {args.turns} turns per stack)")
    rows: list[tuple[str, ...]] = [
        ("stack", "CPU per turn (ms)", "range of round medians", "x bare streaming SDK",
         "RSS after import", "peak RSS", "version"),
    ]  # fmt: skip
    median: dict[str, float] = {}
    for kind, label, dists in STACKS:
        if kind not in kinds:
            continue
        vers = ", ".join(f"{d} {version(d)}" for d in dists) or sys.version.split()[0]
        if kind in missing:
            rows.append((label, NOT_INSTALLED, "-", "-", "-", "-", "-"))
            continue
        turns = [t for rnd in samples[kind] for t in rnd]
        rounds = [statistics.median(rnd) for rnd in samples[kind]]
        median[kind] = statistics.median(turns)
        # The ratio to the bare streaming SDK, measured in the same run: on a busy
        # machine every figure grows, their ratios much less.
        bare = [t for rnd in samples.get("openai-stream", []) for t in rnd]
        ratio = (
            "-"
            if kind == "python" or not bare
            else f"{median[kind] / statistics.median(bare):.2f}x"
        )
        cpu = "-" if kind == "python" else fmt_ms(median[kind])
        spread = "-" if kind == "python" else f"{fmt_ms(min(rounds))}-{fmt_ms(max(rounds))}"
        rows.append(
            (label, cpu, spread, ratio, mb(ready[kind]["rss"]), mb(last[kind]["hwm"]), vers)
        )
    table(rows)
    say()
    code = 0
    if "agentik-sqlite" in median and "openai-stream" in median:
        ours, bare = median["agentik-sqlite"], median["openai-stream"]
        ok = ours <= bare + GOAL_MS / 1e3
        say(
            f"agentik durable ≤ bare streaming SDK + {GOAL_MS:g} ms per turn: "
            f"{'PASS' if ok else 'MISS'} ({fmt_ms(ours)} vs {fmt_ms(bare)} ms, "
            f"{(ours - bare) * 1e3:+.2f} ms)"
        )
        if args.strict and not ok:
            code = 1
    say(f"total time {time.perf_counter() - started:.1f} s")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the goal is missed")
    parser.add_argument("--rounds", type=int, help="measured conversations per stack")
    parser.add_argument("--warmup", type=int, help="conversations before measuring")
    parser.add_argument("--turns", type=int, default=10, help="turns per conversation")
    parser.add_argument("--chunks", type=int, default=20, help="streamed pieces per answer")
    parser.add_argument(
        "--only", nargs="+", choices=[k for k, *_ in STACKS], help="measure only these stacks"
    )
    # internal: the child processes
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.server:
        asyncio.run(serve(args.chunks))
        return 0
    if args.child:
        asyncio.run(child_main(args.child, args.url, args.turns, args.tmp))
        return 0
    if args.rounds is None:
        args.rounds = 2 if args.quick else 15
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.quick:
        args.turns = min(args.turns, 3)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
