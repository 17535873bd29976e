#!/usr/bin/env python3
"""Linked channels soak (issue 33): a link of three networks, thousands of people's
messages in a mix of single lines and bursts, the bot killed with SIGKILL at regular
intervals; every message must reach every other endpoint exactly once, in the order
its source said them, and never come back to where it was said.

Run with ``.venv/bin/python benchmarks/bench_links_soak.py`` (10,000 messages, a kill
every 1,000; ``--messages``/``--kill-every`` for less, ``--quick``: 600 and 200).  Not
part of the test suite.  Everything runs on this machine:

* two IRC networks: two ngircd processes (as ``tests/ircservers.py`` configures them),
  ``#team`` on each, with a sender (``alice`` on ``neta``, ``bruno`` on ``netb``) and
  a watcher that only reads;
* Slack: ``tests/fakeslack.py``'s ``FakeSlack`` (Web API and Socket Mode) in this
  process, a person ``bob`` (U2) in ``C1``;
* the bot: a child process (this script with ``bot``) holding an ``Agent`` (scripted
  model, never asked: every message is chatter), SQLite in a temporary folder, its
  ``Bridge`` with the two IRC transports and the Slack transport and one ``[[links]]``
  of the three channels; at start it redelivers what its outbox holds, as
  ``agentik run`` does.

The load: ``--messages`` messages, each a token ``<source>-<seq>``; in blocks of 100,
a burst of 50 from one source (the sources take turns) and 50 single messages from
sources drawn at random (seeded), a few milliseconds apart.  Every ``--kill-every``
messages the bot is killed (SIGKILL) as soon as it has taken in what was sent (its
outbox holds a copy of each message for each other endpoint: a message a network
delivered to a dead bot is not the relay's to lose, IRC keeps no history), while
its copies are still being delivered; a new bot process starts on the same database.

Reported per endpoint: copies expected, delivered once, missing, doubled, out of
order (a message of a source seen before an earlier one of the same source), loops
(a copy of a message said at this endpoint), and the run's time and kills.  The exit
status is 0 unless ``--strict`` and a figure other than "delivered once" is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = ROOT / "tests"
CHANNEL = "#team"
KEYS = {"A": f"irc:neta:{CHANNEL}", "B": f"irc:netb:{CHANNEL}", "S": "slack:T1:C1"}
TOKEN = re.compile(r"\b([ABS])-(\d{5})\b")


# -- the bot (a child process) -------------------------------------------------------------------
async def bot(args: argparse.Namespace) -> None:
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.bot.links import LinkSettings
    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.irc.transport import IRCTransport
    from agentik.transports.slack.transport import SlackTransport

    tmp = Path(args.tmp)
    agent = Agent(llm=ScriptedModel(), store=SQLiteStore(str(tmp / "links.db")))
    await agent.start()
    link = LinkSettings(name="team", channels=list(KEYS.values()))
    bridge = Bridge(agent, links=[link])
    ircs = [
        IRCTransport(
            name=name,
            settings={
                "host": "127.0.0.1",
                "port": port,
                "nick": "agentik",
                "tls": False,
                "channels": [CHANNEL],
                "flood_burst": 1000,
                "flood_rate": 10000.0,
                "user_rate_limit": 100000,
            },
        )
        for name, port in (("neta", args.a_port), ("netb", args.b_port))
    ]
    slack_t = SlackTransport(name="slack", settings={
        "bot_token": args.bot_token, "app_token": args.app_token, "api_url": args.api_url,
        "state_file": str(tmp / "seen.sqlite3"), "conversation_per": "channel",
    })  # fmt: skip
    for t in (*ircs, slack_t):
        bridge.attach(t, ChannelOptions(command_prefix="!"))
    await bridge.links.load()
    for t in (*ircs, slack_t):
        await t.start(bridge)
    for irc in ircs:
        await irc.wait_joined(CHANNEL, 120)
    redelivered = await bridge.redeliver()
    print(f"ready {redelivered}", flush=True)
    await asyncio.Event().wait()  # until killed


# -- the load and the count (this process) -------------------------------------------------------
def _outbox_relays(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            return int(
                conn.execute("SELECT COUNT(*) FROM outbox WHERE kind = 'relay'").fetchone()[0]
            )
    except sqlite3.Error:
        return -1


class Bot:
    def __init__(self, args: argparse.Namespace, tmp: Path, a: int, b: int, slack: Any) -> None:
        self.cmd = [
            sys.executable, str(Path(__file__).resolve()), "bot", "--tmp", str(tmp),
            "--a-port", str(a), "--b-port", str(b), "--api-url", slack.api_url,
            "--bot-token", slack.bot_token, "--app-token", slack.app_token,
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.redelivered = 0
        self.starts = 0

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        self.proc = await asyncio.create_subprocess_exec(
            *self.cmd, stdout=asyncio.subprocess.PIPE, env=env
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 180)
        if not line.startswith(b"ready"):
            raise RuntimeError(f"the bot did not start: {line!r}")
        self.redelivered += int(line.split()[1])
        self.starts += 1

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await self.kill()


def plan(n: int, seed: int) -> list[str]:
    """The source of each message: blocks of a burst of 50 and 50 random singles."""
    rnd = random.Random(seed)
    out: list[str] = []
    turn = 0
    while len(out) < n:
        out += ["ABS"[turn % 3]] * 50
        turn += 1
        out += [rnd.choice("ABS") for _ in range(50)]
    return out[:n]


async def main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(TESTS_DIR))
    import ircservers
    from fakeslack import FakeSlack

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentik-links-soak-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        (tmp / "bot").mkdir()
        net_a = await ircservers.start_ngircd(tmp / "a")
        net_b = await ircservers.start_ngircd(tmp / "b")
        bot_p: Bot | None = None
        clients: list[Any] = []
        try:
            async with FakeSlack() as slack:
                slack.add_user("U2", "bob")
                alice = await ircservers.IRCTestClient.connect(net_a.port, "alice")
                watch_a = await ircservers.IRCTestClient.connect(net_a.port, "watcha")
                bruno = await ircservers.IRCTestClient.connect(net_b.port, "bruno")
                watch_b = await ircservers.IRCTestClient.connect(net_b.port, "watchb")
                clients = [alice, watch_a, bruno, watch_b]
                for c in clients:
                    await c.join(CHANNEL)
                bot_p = Bot(args, tmp / "bot", net_a.port, net_b.port, slack)
                await bot_p.start()
                sources = plan(args.messages, args.seed)
                seq = defaultdict(int)
                sent: dict[str, list[int]] = defaultdict(list)
                kills = 0
                waits: list[float] = []
                for i, src in enumerate(sources, 1):
                    n = seq[src]
                    seq[src] += 1
                    token = f"{src}-{n:05d}"
                    sent[src].append(n)
                    if src == "A":
                        alice.privmsg(CHANNEL, f"{token} from alice")
                    elif src == "B":
                        bruno.privmsg(CHANNEL, f"{token} from bruno")
                    else:
                        await slack.push_event(
                            slack.message_event("C1", f"{token} from bob", user="U2")
                        )
                    burst = (i - 1) % 100 < 50
                    if not burst:
                        await asyncio.sleep(0.003)
                    if i % args.kill_every == 0 and i < len(sources):
                        # Once the bot has taken in every message so far (two copies
                        # each in its outbox), while it is still delivering them.
                        t0 = time.monotonic()
                        deadline = t0 + 300
                        while (
                            await asyncio.to_thread(_outbox_relays, tmp / "bot" / "links.db")
                        ) < 2 * i:
                            if time.monotonic() > deadline:
                                print(f"  (the bot had not taken in {i} messages in 300 s)")
                                break
                            await asyncio.sleep(0.02)
                        waits.append(time.monotonic() - t0)
                        await bot_p.kill()
                        kills += 1
                        await bot_p.start()
                        print(
                            f"  {i} sent, kill {kills}: restarted, "
                            f"{bot_p.redelivered} copies redelivered so far",
                            flush=True,
                        )
                # Wait for the copies to arrive (until nothing new for 15 s).
                expected = {
                    "A": sum(len(sent[s]) for s in "BS"),
                    "B": sum(len(sent[s]) for s in "AS"),
                    "S": sum(len(sent[s]) for s in "AB"),
                }

                def seen() -> dict[str, list[tuple[str, int]]]:
                    out: dict[str, list[tuple[str, int]]] = {}
                    for ep, watcher in (("A", watch_a), ("B", watch_b)):
                        out[ep] = [
                            (m.group(1), int(m.group(2)))
                            for line in watcher.received
                            if line.command == "PRIVMSG" and line.nick == "agentik"
                            for m in [TOKEN.search(line.text)] if m
                        ]  # fmt: skip
                    posts = sorted(
                        (float(ts), msg) for (ch, ts), msg in slack.messages.items()
                        if ch == "C1" and msg.get("username")
                    )  # fmt: skip
                    out["S"] = [
                        (m.group(1), int(m.group(2)))
                        for _, msg in posts for m in [TOKEN.search(msg.get("text") or "")] if m
                    ]  # fmt: skip
                    return out

                last, quiet_since = -1, time.monotonic()
                drain_deadline = time.monotonic() + args.drain
                while time.monotonic() < drain_deadline:
                    now = sum(len(v) for v in seen().values())
                    if now != last:
                        last, quiet_since = now, time.monotonic()
                    elif now >= sum(expected.values()) or time.monotonic() - quiet_since > 15:
                        break
                    await asyncio.sleep(0.5)
                got = seen()
        finally:
            if bot_p is not None:
                await bot_p.stop()
            for c in clients:
                await c.close()
            await net_a.stop()
            await net_b.stop()
    elapsed = time.monotonic() - started

    print(f"\nlinks soak: {args.messages} messages (A: {len(sent['A'])} on IRC neta, "
          f"B: {len(sent['B'])} on IRC netb, S: {len(sent['S'])} on Slack), bursts of 50, "
          f"{kills} kill -9 (one every {args.kill_every}), {elapsed:.0f} s")  # fmt: skip
    print(
        f"  copies redelivered from the outbox after the kills: {bot_p.redelivered if bot_p else 0}"
    )
    if waits:
        print(f"  wait for the bot to take in what was sent before each kill: "
              f"max {max(waits):.1f} s")  # fmt: skip
    print(f"  {'endpoint':10} {'expected':>8} {'once':>8} {'missing':>8} {'doubled':>8} "
          f"{'disorder':>8} {'loops':>6}")  # fmt: skip
    bad = 0
    for ep in "ABS":
        copies = got[ep]
        counts: dict[tuple[str, int], int] = defaultdict(int)
        for tok in copies:
            counts[tok] += 1

        loops = sum(1 for (src, _) in copies if src == ep)
        others = [s for s in "ABS" if s != ep]
        want = {(s, n) for s in others for n in sent[s]}
        once = sum(1 for t in want if counts.get(t) == 1)
        missing = sum(1 for t in want if t not in counts)
        doubled = sum(c - 1 for t, c in counts.items() if c > 1 and t[0] != ep)
        # Out of order: a message first seen after a later one of its source (a copy
        # sent again after a kill counts as doubled, not here).
        disorder = 0
        for s in others:
            high, first = -1, set()
            for src, n in copies:
                if src != s or n in first:
                    continue
                first.add(n)
                if n < high:
                    disorder += 1
                high = max(high, n)
        bad += missing + doubled + disorder + loops
        print(f"  {KEYS[ep]:10} {len(want):>8} {once:>8} {missing:>8} {doubled:>8} "
              f"{disorder:>8} {loops:>6}")  # fmt: skip
    return 1 if args.strict and bad else 0


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    child = sub.add_parser("bot")
    child.add_argument("--tmp", required=True)
    child.add_argument("--a-port", type=int, required=True)
    child.add_argument("--b-port", type=int, required=True)
    child.add_argument("--api-url", required=True)
    child.add_argument("--bot-token", required=True)
    child.add_argument("--app-token", required=True)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--kill-every", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--drain", type=float, default=600.0,
                        help="longest wait for the last copies (seconds)")  # fmt: skip
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--strict", action="store_true")
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.messages, ns.kill_every = 600, 200
    return ns


if __name__ == "__main__":
    ns = _args()
    if ns.role == "bot":
        asyncio.run(bot(ns))
    else:
        sys.exit(asyncio.run(main(ns)))
