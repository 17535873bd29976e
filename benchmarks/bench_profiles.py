#!/usr/bin/env python3
"""The cost of stream profiles (issue 20) on event fan-out, against a plain kind filter.

Run with ``.venv/bin/python benchmarks/bench_profiles.py`` (``make bench``); ``--quick``
is a smaller run.  One conversation's event bus publishes a turn's worth of events
(a parent run with a child run: text deltas, tool calls, usage) to 20 subscribers that
keep up, each one of:

1. baseline: a profile of kinds only (what ``kinds=[...]`` and the built-in ``chat``
   profile cost before profiles were values: a frozenset lookup per event);
2. a custom profile with ``child_runs = false`` and ``usage = false`` (events of the
   child run dropped, ``turn_ended`` trimmed);
3. ``debug``: no filter at all.

Goal: the custom profile costs at most 1.5x the kinds-only filter per event.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time

from agentik.core.eventbus import EventBus
from agentik.core.events import (
    ChildRunLinked,
    Event,
    EventsLost,
    TextDelta,
    ToolCallEnded,
    ToolCallStarted,
    TurnEnded,
    TurnStarted,
)
from agentik.core.messages import Usage
from agentik.core.streamprofiles import BUILTIN_PROFILES, StreamProfile

from _common import Row, finish, say, say_environment, version

SUBSCRIBERS = 20
GOAL = 1.5


def turn(seq0: int) -> list[Event]:
    """One turn's events: 40 deltas of the parent, a child run with 40 of its own."""
    c, parent, child = "conv", "run_p", "run_c"
    out: list[Event] = [TurnStarted(conversation_id=c, run_id=parent)]
    out += [TextDelta(conversation_id=c, run_id=parent, text="word ") for _ in range(40)]
    out.append(ToolCallStarted(conversation_id=c, run_id=parent, call_id="k", name="agent__r"))
    out.append(ChildRunLinked(conversation_id=c, run_id=parent, child_run_id=child, call_id="k"))
    out += [
        TextDelta(conversation_id=c, run_id=child, parent_run_id=parent, text="w ")
        for _ in range(40)
    ]
    out.append(
        TurnEnded(
            conversation_id=c, run_id=child, parent_run_id=parent, usage=Usage(prompt_tokens=1)
        )
    )
    out.append(ToolCallEnded(conversation_id=c, run_id=parent, call_id="k", name="agent__r"))
    out.append(
        TurnEnded(
            conversation_id=c,
            run_id=parent,
            usage=Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5),
        )
    )
    return [dataclasses.replace(e, seq=seq0 + i) for i, e in enumerate(out)]


def _lost(event: Event | None, after: int, oldest: int) -> EventsLost:
    return EventsLost(conversation_id="conv", requested_after=after, oldest_seq=oldest)


async def per_event(profile: StreamProfile | None, turns: int, repeats: int) -> float:
    """Seconds per published event, fan-out to every subscriber included (best of repeats)."""
    times = []
    for _ in range(repeats):
        bus = EventBus(key=lambda e: e.seq, lost=_lost, buffer=1024, max_pending=10**9)
        subs = [bus.subscribe(profile=profile) for _ in range(SUBSCRIBERS)]
        events = [e for t in range(turns) for e in turn(t * 100)]
        started = time.perf_counter()
        for e in events:
            bus.publish(e)
        times.append((time.perf_counter() - started) / len(events))
        for s in subs:
            await s.aclose()
    return statistics.median(sorted(times)[: max(1, repeats // 2 + 1)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    turns, repeats = (20, 3) if args.quick else (400, 7)
    say_environment([("agentik", version("agentik"))])
    kinds_only = StreamProfile(name="kinds", kinds=BUILTIN_PROFILES["chat"].kinds)
    custom = StreamProfile(
        name="public", kinds=BUILTIN_PROFILES["chat"].kinds, child_runs=False, usage=False
    )
    say(f"== fan-out: {SUBSCRIBERS} subscribers, {turns:,} turns of 87 events x {repeats}")
    base = asyncio.run(per_event(kinds_only, turns, repeats))
    prof = asyncio.run(per_event(custom, turns, repeats))
    debug = asyncio.run(per_event(None, turns, repeats))

    def us(s: float) -> str:
        return f"{s * 1e6:.2f} µs"

    say(f"kinds only (baseline)          {us(base)} per event")
    say(f"custom: no child runs/usage    {us(prof)} per event")
    say(f"debug: no filter               {us(debug)} per event")
    rows = [
        Row("publish, custom profile vs kinds filter", us(prof), us(base), prof / base,
            f"<= {GOAL}x", prof / base <= GOAL),
        Row("publish, debug (no filter) vs kinds filter", us(debug), us(base), debug / base,
            "", None),
    ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
