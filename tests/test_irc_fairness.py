"""One party never starves the others on IRC (issue 28, item 4: IRC output and inbound).

Output: channels and nicks take turns under flood control (one line each,
round robin), and the caps on waiting lines only ever cost the target that
has the most waiting.  Inbound: the per-user rate limit counts a person (their
account, else ``ident@host``), so changing nick does not buy more model
requests.  Orders and drops are asserted by counting lines, never by timing.
"""

from __future__ import annotations

import asyncio

from agentik.transports.base import IncomingMessage, OutgoingMessage
from agentik.transports.irc.transport import IRCTransport

from ircservers import IRCTestClient, ScriptedIRCServer, registration_handler
from rigs import FAST, eventually, from_bot, irc_bot, joined

pytest_plugins = ["ircservers"]


class _NullSink:
    async def handle(self, message: IncomingMessage, transport: object) -> None:
        pass


def line(target: str, text: str) -> OutgoingMessage:
    return OutgoingMessage(channel_key=f"irc:s:{target}", text=text, kind="notice")


async def sent_in_order(settings: dict, queued: list[tuple[str, str]], expect: int) -> list[str]:
    """Queue ``queued`` lines while not connected, connect, and return the first
    ``expect`` PRIVMSG/NOTICE lines the server received, in order."""
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        t = IRCTransport(name="s", settings={"port": server.port, **FAST, **settings})
        for target, text in queued:
            await t.send(line(target, text))
        await t.start(_NullSink())
        try:
            async with asyncio.timeout(60):
                while True:
                    got = [ln for ln in server.received if ln.startswith("NOTICE ")]
                    if len(got) >= expect:
                        return got
                    await server.wait_for_line(
                        lambda ln, got=got: ln.startswith("NOTICE ") and ln not in got
                    )
        finally:
            await t.aclose()


async def test_targets_take_turns_so_a_flooded_channel_delays_others_by_one_line_each():
    """Before: one FIFO for every target: #quiet and bob waited for all 20 #flood lines."""
    queued = [("#flood", f"flood {i}") for i in range(20)]
    queued += [("#quiet", "quiet 0"), ("bob", "private 0"), ("#quiet", "quiet 1"),
               ("bob", "private 1")]  # fmt: skip
    got = await sent_in_order({}, queued, 24)
    assert got[:7] == [
        "NOTICE #flood :flood 0",
        "NOTICE #quiet :quiet 0",
        "NOTICE bob :private 0",
        "NOTICE #flood :flood 1",
        "NOTICE #quiet :quiet 1",
        "NOTICE bob :private 1",
        "NOTICE #flood :flood 2",
    ]
    # Each target's own lines keep their order; nothing is lost.
    assert got[7:] == [f"NOTICE #flood :flood {i}" for i in range(3, 20)]


async def test_the_caps_on_waiting_lines_only_cost_the_target_with_the_most_waiting(caplog):
    """Before: past ``queue_limit`` the oldest line went, whoever it was for: the
    quiet channel's and the private answers went first, the flood's stayed."""
    queued = [("#quiet", "quiet 0"), ("bob", "private 0"), ("#quiet", "quiet 1")]
    queued += [("#flood", f"flood {i}") for i in range(30)]
    queued += [("#busy", f"busy {i}") for i in range(8)]
    got = await sent_in_order({"queue_limit": 12, "target_queue_limit": 5}, queued, 12)
    assert sorted(got) == sorted(
        ["NOTICE #quiet :quiet 0", "NOTICE #quiet :quiet 1", "NOTICE bob :private 0"]
        + [f"NOTICE #flood :flood {i}" for i in range(25, 30)]  # its newest 5 (its cap)
        + [f"NOTICE #busy :busy {i}" for i in range(4, 8)]  # the longest once 12 wait
    )
    warnings = [r.getMessage() for r in caplog.records if "outgoing queue full" in r.getMessage()]
    # One warning per target (not one per dropped line), naming it.
    assert len(warnings) == 2 and "for #flood" in warnings[0] and "for #busy" in warnings[1]


async def test_a_flood_from_many_clients_never_drops_or_holds_up_another_channel_or_a_dm(
    miniircd, tmp_path
):
    """Five clients flood #flood while quinn asks in #quiet and in private.

    Before: quinn's answers queued behind the whole flood and, once the
    flood's later answers filled the queue, were dropped as the oldest lines.
    """
    async with irc_bot(
        miniircd.port, tmp_path, channels=["#flood", "#quiet"], flood_burst=1, flood_rate=1.0,
        queue_limit=15, user_rate_limit=100,
    ) as (bot, model, agent, _):  # fmt: skip
        await joined(bot, "#flood")
        await joined(bot, "#quiet")
        quinn = await IRCTestClient.connect(miniircd.port, "quinn")
        await quinn.join("#flood")
        await quinn.join("#quiet")
        flooders = [await IRCTestClient.connect(miniircd.port, f"f{i}") for i in range(5)]
        for f in flooders:
            await f.join("#flood")

        def wave(n: int) -> None:
            for f in flooders:
                for i in range(6):
                    f.privmsg("#flood", f"agentik: flood {n}.{i}")

        wave(1)
        await eventually(lambda: bot.queued >= 10, "a backlog for #flood")
        quinn.privmsg("#quiet", "agentik: are you there?")
        quinn.privmsg("agentik", "and in private?")
        wave(2)
        quiet = await quinn.wait_for(
            lambda m: from_bot(m) and m.params[0] == "#quiet" and "echo: are you there?" in m.text
        )
        private = await quinn.wait_for(
            lambda m: from_bot(m) and m.params[0] == "quinn" and m.text == "echo: and in private?"
        )
        # The flood was still being answered afterwards: quinn's answers did not
        # wait for its backlog to drain.
        after = max(quinn.received.index(quiet), quinn.received.index(private)) + 1
        await quinn.collect(lambda m: from_bot(m) and m.params[0] == "#flood", 3, since=after)
        for c in (quinn, *flooders):
            await c.close()


async def test_changing_nick_does_not_reset_the_per_user_rate_limit(miniircd, tmp_path):
    """Before: the limit counted nicks, so every NICK bought ``user_rate_limit`` more
    model requests; now it counts ``ident@host`` (the account where there is one)."""
    async with irc_bot(miniircd.port, tmp_path, user_rate_limit=4) as (bot, model, agent, _):
        await asyncio.wait_for(bot.registered.wait(), 60)
        mallory = await IRCTestClient.connect(miniircd.port, "mallory", user="mal")
        for n in range(3):
            for i in range(4):
                mallory.privmsg("agentik", f"request {n}.{i}")
            mallory.send_raw(f"NICK mallory{n}")
            mallory.nick = f"mallory{n}"
            await mallory.wait_for(lambda m, n=n: m.command == "NICK" and m.text == f"mallory{n}")
        await mallory.sync()
        # bob (another ident) is not held back by mallory's flood; once his answer
        # came, every one of mallory's lines had reached the bot before it.
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        bob.privmsg("agentik", "hello")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "echo: hello")
        for nick in ("mallory", "mallory0", "mallory1"):
            conv = await agent.conversation_for_channel(f"irc:testnet:{nick}!*@*")
            await eventually(lambda conv=conv: not conv.busy, f"{nick}'s turn to end")
        asked = [r.messages[-1].content for r in model.requests]
        assert sorted(a for a in asked if a.startswith("request")) == [
            f"request 0.{i}" for i in range(4)
        ]
        await mallory.close()
        await bob.close()


async def test_too_fast_notices_to_many_flooders_have_a_budget_of_their_own():
    """Before: each of 15 flooding clients got its own notice: a flood from many
    clients filled the output with notices. Now 10 a minute in all, as CTCP replies."""
    received: list[IncomingMessage] = []

    class Sink:
        async def handle(self, message: IncomingMessage, transport: object) -> None:
            received.append(message)

    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        t = IRCTransport(name="s", settings={"port": server.port, "user_rate_limit": 2, **FAST})
        await t.start(Sink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            client = server.clients[0]
            for n in range(15):
                for i in range(3):
                    client.send(f":n{n}!u{n}@h{n} PRIVMSG agentik :message {i}")
            client.send(":carol!c@h PRIVMSG agentik :all sent")
            await eventually(lambda: any(m.text == "all sent" for m in received), "all sent")
            assert len(received) == 15 * 2 + 1  # each flooder's first two
            # Lines waiting for other targets are sent before a new target's first.
            await t.send(line("carol", "marker"))
            await server.wait_for_line(lambda ln: ln.startswith("NOTICE carol") and "marker" in ln)
            notices = [ln for ln in server.received if "too fast" in ln]
            assert len(notices) == 10, notices
        finally:
            await t.aclose()
