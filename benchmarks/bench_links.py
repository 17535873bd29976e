#!/usr/bin/env python3
"""Linked channels benchmark: relay latency IRC -> Slack and Slack -> IRC, and CPU per
relayed message, agentik's link vs a bare relay measured in the same run.

Run with ``.venv/bin/python benchmarks/bench_links.py`` (``--quick``: a smoke run of a
few seconds).  Everything runs in this process on this machine: a real IRC server
(ngircd, as ``tests/ircservers.py`` configures it; miniircd with ``--server miniircd``),
``tests/fakeslack.py``'s ``FakeSlack`` (the Web API and Socket Mode), an IRC client
``alice`` in ``#team`` and a Slack user ``bob`` in ``C1``.  Two relays take turns:

* agentik: an ``Agent`` (scripted model, SQLite store in a temporary folder) and its
  ``Bridge`` with the IRC and Slack transports and one ``[[links]]`` of ``#team`` and
  ``C1``, as ``agentik run`` wires them (every copy persisted in the outbox first);
* the baseline: a bare relay, a raw IRC connection and a slack-bolt ``AsyncApp`` over
  Socket Mode that post each line to the other side (no persistence, no escaping).

Each direction sends messages one at a time (latency: from the send to the copy seen by
the other side's fake or client, p50 and p99), then a burst (CPU: this process's CPU
time over the burst divided by the messages; the fake Slack, the IRC clients and the
load are in both figures alike, so the difference is the relay's own).  IRC copies go
through the transport's flood control, set generously here (``flood_burst`` 1000, and
alice's incoming rate limit, ``user_rate_limit``, lifted): its
delay is not the relay's.  Goals (issue 33): p50 <= 50 ms, p99 <= 250 ms, <= 0.5 ms of
CPU per relayed message above the bare relay.  Exit status 0 unless ``--strict`` and a
goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _common import process_cpu

ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = ROOT / "tests"
CHANNEL = "#team"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _agentik(port: int, slack: Any, tmp: Path) -> tuple[Callable[[], Awaitable[None]], str]:
    """Start agentik's link; its closer and the IRC nick it speaks as."""
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.bot.links import LinkSettings
    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.irc.transport import IRCTransport
    from agentik.transports.slack.transport import SlackTransport

    agent = Agent(llm=ScriptedModel(), store=SQLiteStore(str(tmp / "links.db")))
    await agent.start()
    link = LinkSettings(name="team", channels=[f"irc:bench:{CHANNEL}", "slack:T1:C1"])
    bridge = Bridge(agent, links=[link])
    irc = IRCTransport(name="bench", settings={
        "host": "127.0.0.1", "port": port, "nick": "agentik", "tls": False,
        "channels": [CHANNEL], "flood_burst": 1000, "flood_rate": 10000.0,
        "user_rate_limit": 100000,
    })  # fmt: skip
    slack_t = SlackTransport(name="slack", settings={
        "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
        "state_file": str(tmp / "seen.sqlite3"), "conversation_per": "channel",
    })  # fmt: skip
    for t in (irc, slack_t):
        bridge.attach(t, ChannelOptions(command_prefix="!"))
    await bridge.links.load()
    await irc.start(bridge)
    await slack_t.start(bridge)
    await irc.wait_joined(CHANNEL, 60)

    async def close() -> None:
        await slack_t.aclose()
        await irc.aclose()
        await bridge.aclose()
        await agent.aclose()

    return close, "agentik"


async def _bare(port: int, slack: Any, tmp: Path) -> tuple[Callable[[], Awaitable[None]], str]:
    """Start the bare relay; its closer and its IRC nick."""
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    from ircservers import IRCTestClient

    irc = await IRCTestClient.connect(port, "barerelay")
    await irc.join(CHANNEL)
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    app = AsyncApp(client=client, token=slack.bot_token)

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        if event.get("bot_id"):
            return
        irc.privmsg(CHANNEL, f"<{event.get('user')}> {event.get('text', '')}")

    handler = AsyncSocketModeHandler(app, slack.app_token, web_client=client)
    await handler.connect_async()

    async def pump() -> None:
        seen = 0
        while True:
            line = await irc.wait_for(lambda m: m.command == "PRIVMSG", 3600, since=seen)
            seen = irc.received.index(line) + 1
            await client.chat_postMessage(channel="C1", text=line.text, username=line.nick)

    task = asyncio.create_task(pump())

    async def close() -> None:
        task.cancel()
        await handler.close_async()
        await irc.close()

    return close, "barerelay"


async def _round(name: str, start: Any, port: int, slack: Any, n: int, burst: int) -> dict:
    import time as _t

    from ircservers import IRCTestClient

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-links-{name}-"))
    name = f"{name}{tmp.name[-6:]}"  # this round's words only (the fake keeps every post)
    close, nick = await start(port, slack, tmp)
    alice = await IRCTestClient.connect(port, "alice")
    await alice.join(CHANNEL)
    try:
        await asyncio.sleep(0)  # (nothing timed: the servers answer in order)
        out: dict[str, Any] = {"name": name}

        # (The waits look at the newest post and lines only: scanning everything the fake
        # and the client hold on each change would cost the load more than the relay.)
        def posted(word: str) -> Callable[[], bool | None]:
            return lambda: word == _last_text(slack) or None

        # IRC -> Slack, one at a time.
        lat: list[float] = []
        for i in range(n):
            word = f"{name}-i2s-{i}"
            t0 = _t.perf_counter()
            alice.privmsg(CHANNEL, word)
            await slack.wait_until(posted(word), 60, word)
            lat.append(_t.perf_counter() - t0)
        out["irc_to_slack"] = lat
        # Slack -> IRC, one at a time.
        lat = []
        for i in range(n):
            word = f"{name}-s2i-{i}"
            t0 = _t.perf_counter()
            since = alice.mark()
            await slack.push_event(slack.message_event("C1", word, user="U2"))
            await alice.wait_for(lambda m, w=word: m.nick == nick and w in m.text, 60, since=since)
            lat.append(_t.perf_counter() - t0)
        out["slack_to_irc"] = lat
        # A burst both ways: CPU per relayed message.
        since = alice.mark()
        c0 = process_cpu()
        for i in range(burst):
            alice.privmsg(CHANNEL, f"{name}-bi-{i}")
            await slack.push_event(slack.message_event("C1", f"{name}-bs-{i}", user="U2"))
        last = f"{name}-bi-{burst - 1}"
        await slack.wait_until(posted(last), 120, last)
        end = f"{name}-bs-{burst - 1}"
        await alice.wait_for(lambda m: m.nick == nick and m.text.endswith(end), 120, since=since)
        out["cpu_ms"] = (process_cpu() - c0) * 1000 / (2 * burst)
        return out
    finally:
        await alice.close()
        await close()


def _last_text(slack: Any) -> str:
    """The text of the fake's newest post (the relays' copies end with the word sent)."""
    newest = next(reversed(slack.messages.values()), None)
    text = (newest or {}).get("text") or ""
    return text.rsplit("> ", 1)[-1]


async def main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(TESTS_DIR))
    import ircservers
    from fakeslack import FakeSlack

    starter = ircservers.start_ngircd if args.server == "ngircd" else ircservers.start_miniircd
    server = await starter(Path(tempfile.mkdtemp(prefix="bench-links-irc-")))
    results: dict[str, dict[str, list[float]]] = {}
    try:
        async with FakeSlack() as slack:
            slack.add_user("U2", "bob")
            for r in range(args.rounds):
                order = [("bare", _bare), ("agentik", _agentik)]
                for name, start in order if r % 2 else reversed(order):
                    got = await _round(name, start, server.port, slack, args.n, args.burst)
                    into = results.setdefault(name, {})
                    for k in ("irc_to_slack", "slack_to_irc"):
                        into.setdefault(k, []).extend(got[k])
                    into.setdefault("cpu_ms", []).append(got["cpu_ms"])
    finally:
        await server.stop()
    ok = True
    for name in ("bare", "agentik"):
        res = results[name]
        print(f"{name}:")
        for k in ("irc_to_slack", "slack_to_irc"):
            ms = [v * 1000 for v in res[k]]
            print(f"  {k}: p50 {_pct(ms, 50):.1f} ms, p99 {_pct(ms, 99):.1f} ms ({len(ms)} msgs)")
        cpu = res["cpu_ms"]
        print(f"  CPU per relayed message (whole process): {statistics.median(cpu):.3f} ms"
              f" (rounds {min(cpu):.3f}-{max(cpu):.3f})")  # fmt: skip
    a, b = results["agentik"], results["bare"]
    extra = statistics.median(a["cpu_ms"]) - statistics.median(b["cpu_ms"])
    ratio = statistics.median(a["cpu_ms"]) / max(statistics.median(b["cpu_ms"]), 1e-9)
    print(f"agentik vs bare: CPU {ratio:.2f}x, +{extra:.3f} ms per relayed message")
    for k in ("irc_to_slack", "slack_to_irc"):
        ms = [v * 1000 for v in a[k]]
        ok &= _pct(ms, 50) <= 50 and _pct(ms, 99) <= 250
    ok &= extra <= 0.5
    print("goals (p50 <= 50 ms, p99 <= 250 ms, <= +0.5 ms CPU):", "met" if ok else "MISSED")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--server", choices=("ngircd", "miniircd"), default="ngircd")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=200, help="messages each way, one at a time")
    parser.add_argument("--burst", type=int, default=300, help="messages each way, at once")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ns = parser.parse_args()
    if ns.quick:
        ns.rounds, ns.n, ns.burst = 1, 20, 30
    sys.exit(asyncio.run(main(ns)))
