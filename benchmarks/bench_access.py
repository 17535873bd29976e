#!/usr/bin/env python3
"""The per-turn cost of the access rules (issue 19), against a turn without rules.

Run with ``.venv/bin/python benchmarks/bench_access.py`` (``make bench``); ``--quick`` is
a smaller run.  A policy of 1,000 rules (900 naming channels exactly, 100 channel globs)
and 1,000 identity patterns (admins by account, named-role members, hostmask rules) is
asked what the speaker of one IRC message may do, as the bridge asks once per message
(:meth:`AccessPolicy.check`: identity, role, then the channel's decision):

1. warm: the channel's decision is cached (every message after the first in a channel);
2. cold: the decision evaluated from the 1,000 rules (the first message of a role in a
   channel, or a policy with its cache disabled).

The baseline is the same call on an empty policy (no ``[access]`` section): what every
turn paid before.  Goal: under 0.1 ms per turn with 1,000 rules.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from agentik.core.access import AccessPolicy, AccessRule, AccessSettings, RoleSettings
from agentik.transports.base import IncomingMessage
from agentik.transports.irc.wire import casefold

from _common import Row, finish, say, say_environment, version

GOAL = 0.1e-3  # seconds per turn


def big_policy() -> AccessPolicy:
    rules = [
        AccessRule(channels=(f"irc:libera:#chan{i}",), roles=("user",), tools=(f"t{i}_*",),
                   commands=("*", "-new"))
        for i in range(900)
    ]  # fmt: skip
    rules += [
        AccessRule(channels=(f"slack:T{i}:*",), roles=("deployer", "user"), tools=("*",))
        for i in range(99)
    ]
    # The speaker's channel is decided by the last rule: every rule is looked at.
    rules.append(AccessRule(channels=("irc:libera:#team",), tools=("read_*", "web_*")))
    settings = AccessSettings(
        owners=("libera:account:root",),
        admins=tuple(f"libera:account:admin{i}" for i in range(600)),
        ignored=tuple(f"libera:mask:*!*@spam{i}.example" for i in range(100)),
        roles={"deployer": RoleSettings(members=tuple(f"libera:account:dep{i}"
                                                      for i in range(300)))},
        rules=rules,
    )  # fmt: skip
    return AccessPolicy(settings, {"libera": "irc"}, irc_casefold=casefold)


def message() -> IncomingMessage:
    return IncomingMessage(
        channel_key="irc:libera:#team", text="agentik: hello", author_id="bob",
        author_name="Bob", addressed=True,
        meta={"account": "bob", "hostmask": "Bob!b@host.example", "casemapping": "rfc1459"},
    )  # fmt: skip


def per_call(fn, n: int, repeats: int) -> float:
    """The median over ``repeats`` of the mean time of ``fn()`` over ``n`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    n, repeats = (500, 3) if args.quick else (20_000, 7)
    say_environment([("agentik", version("agentik"))])
    msg = message()
    empty = AccessPolicy(None, {"libera": "irc"}, irc_casefold=casefold)
    big = big_policy()
    assert big.check("libera", msg, msg.channel_key).tools is not None
    say(f"== rules check: 1,000 rules, 1,000 identity patterns; {n:,} calls x {repeats}")
    base = per_call(lambda: empty.check("libera", msg, msg.channel_key), n, repeats)
    warm = per_call(lambda: big.check("libera", msg, msg.channel_key), n, repeats)

    def cold() -> None:
        big._decisions.clear()
        big.check("libera", msg, msg.channel_key)

    cold_t = per_call(cold, n, repeats)
    say(f"no rules (baseline)   {us(base)} per turn")
    say(f"1,000 rules, cached   {us(warm)} per turn")
    say(f"1,000 rules, uncached {us(cold_t)} per turn")
    rows = [
        Row("rules check per turn (cached decision)", us(warm), us(base), warm / base,
            "< 0.1 ms", warm < GOAL),
        Row("rules check per turn (decision evaluated)", us(cold_t), us(base), cold_t / base,
            "< 0.1 ms", cold_t < GOAL),
    ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
