"""``TransportConformance``: the contract every transport adapter proves about itself.

Subclass it in a test module and provide one fixture, ``transport_harness``,
yielding a :class:`~.harness.TransportHarness` for your transport and its
peer (a real server, or a fake speaking the real wire format), given the
bot's bridge as its sink factory::

    import pytest_asyncio
    from agentik.bot.bridge import Bridge
    from agentik.transports.testing import TransportConformance

    class TestPigeonConformance(TransportConformance):
        @pytest_asyncio.fixture
        async def transport_harness(self, tmp_path):
            async with PigeonLoft() as loft:          # your peer
                yield PigeonHarness(loft, sink_factory=Bridge)

Each test runs your transport through the sink the factory builds (the real
bot :class:`~agentik.bot.bridge.Bridge`) and a real :class:`~agentik.core.Agent`
(SQLite in ``tmp_path``) with a
:class:`~agentik.core.testing.scripted.ScriptedModel`, and checks what a
person on the peer notices:

* the transport declares a type, sane :class:`~agentik.transports.base.ChannelCaps`
  and refuses an unknown setting with an error naming the key;
* a direct message is answered privately; in a shared channel the bot answers
  only when addressed, and the model sees the text without the address and
  with each speaker's name;
* channel keys start with ``<type>:``, are distinct per channel, direct
  conversation and thread, the same for every message of a place, and the
  same after a restart (so the conversation goes on); answers go only to the
  place they were asked in;
* a long answer arrives split within the declared ``max_bytes``/``max_chars``
  with nothing lost;
* several messages are answered in order, and messages sent while a turn runs
  are all answered, none lost;
* the stop command interrupts a running answer and the bot stays usable;
  command replies reach the place they were asked in;
* after ``aclose()`` ``serve()`` returns and no task is left running, also
  when the shutdown comes in the middle of a turn.

A check the transport legitimately cannot pass (a terminal has one channel)
is skipped with the reason: declare the place kinds you have in
``place_kinds`` and, rarely, ``unsupported = {"test_name": "why"}``.

The suite needs ``pytest`` and ``pytest-asyncio`` (the ``agentik[testing]``
extra); it runs in pytest-asyncio's ``strict`` and ``auto`` modes.

A harness without a sink factory (written before the kit took one) still
works: the suite then finds the bot's bridge by name and warns with a
:class:`DeprecationWarning`.  The kit itself does not import the bot.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentik.core import Agent, SQLiteStore
from agentik.core.errors import ConfigError
from agentik.core.testing.scripted import Reply, ScriptedModel
from agentik.transports.base import ChannelCaps, IncomingMessage, Transport

from .harness import ConformanceSink, Place, SinkFactory, TransportHarness

__all__ = ["Conformance", "TransportConformance"]

#: Name of the transport instance the suite builds.
INSTANCE = "conformance"
_STREAM_MODES = ("deltas", "lines", "message", "edit")


class _Recording:
    """The sink the transport is started with: the factory's, also keeping every
    incoming message it is handed.  Everything else a transport uses of its host
    (the agent, channel options, ``busy``, ``flush`` …) is the wrapped sink's."""

    def __init__(self, sink: ConformanceSink) -> None:
        self.sink = sink
        self.incoming: list[IncomingMessage] = []
        self.arrived = asyncio.Event()

    async def handle(self, message: IncomingMessage, transport: Transport) -> None:
        self.incoming.append(message)
        self.arrived.set()
        await self.sink.handle(message, transport)

    def attach(self, transport: Transport) -> None:
        self.sink.attach(transport)

    async def aclose(self) -> None:
        await self.sink.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)


def _bot_bridge() -> SinkFactory:
    """The bot's bridge, for a harness without a sink factory (deprecated).

    Named as a string and resolved here, only on this deprecated path: the
    transport layer does not import the bot.
    """
    warnings.warn(
        "a TransportHarness without a sink factory is deprecated: pass"
        " sink_factory=agentik.bot.bridge.Bridge to TransportHarness.__init__",
        DeprecationWarning,
        stacklevel=3,
    )
    factory: SinkFactory = importlib.import_module("agentik.bot.bridge").Bridge
    return factory


class Conformance:
    """One test's rig: scripted model, agent, the bot side (recorded), and the transport."""

    def __init__(self, harness: TransportHarness, tmp_path: Path) -> None:
        self.harness = harness
        self.sink_factory = harness.sink_factory or _bot_bridge()
        self.model = ScriptedModel()
        self.database = str(tmp_path / "conformance.db")
        self.agent = Agent(llm=self.model, store=SQLiteStore(self.database))
        #: The bot side the transport is started with (the factory's sink, recorded).
        self.bridge = _Recording(self.sink_factory(self.agent))
        self.transport: Transport | None = None
        self.serving: asyncio.Future[None] | None = None
        self._baseline: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._baseline = set(asyncio.all_tasks())
        await self.agent.start()
        await self.start_transport()

    async def start_transport(self) -> Transport:
        """Build a new transport instance, attach it, start it and wait until it is ready."""
        transport = self.harness.make_transport(name=INSTANCE)
        self.bridge.attach(transport)
        await transport.start(self.bridge)
        self.transport = transport
        self.serving = asyncio.ensure_future(transport.serve())
        await self.harness.ready(transport)
        return transport

    async def stop_transport(self) -> None:
        """``aclose()`` the transport; fail unless ``serve()`` then returns."""
        transport, serving = self.transport, self.serving
        self.transport = self.serving = None
        if transport is None or serving is None:
            return
        name = type(transport).__name__
        try:
            await asyncio.wait_for(transport.aclose(), self.harness.timeout)
        except TimeoutError:
            serving.cancel()
            raise AssertionError(
                f"{name}.aclose() did not return within {self.harness.timeout:g}s"
            ) from None
        try:
            await asyncio.wait_for(asyncio.shield(serving), self.harness.timeout)
        except TimeoutError:
            serving.cancel()
            raise AssertionError(
                f"{name}.serve() did not return within {self.harness.timeout:g}s of aclose()"
            ) from None

    async def restart(self) -> Transport:
        """Restart as a new bot process would: new transport, bridge and agent; same database."""
        await self.stop_transport()
        await self.bridge.aclose()
        await self.agent.aclose()
        incoming = self.bridge.incoming
        self.agent = Agent(llm=self.model, store=SQLiteStore(self.database))
        self.bridge = _Recording(self.sink_factory(self.agent))
        self.bridge.incoming = incoming
        await self.agent.start()
        return await self.start_transport()

    async def aclose(self) -> None:
        """Stop everything in the bot's order: transport, bridge, agent; then the peers."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.stop_transport()
        finally:
            await self.bridge.aclose()
            await self.agent.aclose()
            await self.harness.close_peers()

    def leftover_tasks(self) -> list[asyncio.Task[Any]]:
        """Tasks started since :meth:`start` that are still running."""
        current = asyncio.current_task()
        return [
            t
            for t in asyncio.all_tasks()
            if t not in self._baseline and t is not current and not t.done()
        ]

    # -- talking ------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        assert self.transport is not None
        return self.transport.default_command_prefix

    @property
    def caps(self) -> ChannelCaps:
        assert self.transport is not None
        return self.transport.caps

    def user(self, n: int = 0) -> str:
        users = self.harness.users
        return users[min(n, len(users) - 1)]

    def place(self) -> Place:
        """A place to talk in: a direct conversation if the transport has them."""
        if "direct" in self.harness.place_kinds:
            return self.harness.direct(self.user(0))
        return self.harness.channel("a")

    async def say(
        self, place: Place, text: str, *, user: str | None = None, addressed: bool = True
    ) -> None:
        if place.kind == "direct":
            user = place.name  # only that person talks there
        await self.harness.say(place, text, user=user or self.user(0), addressed=addressed)

    async def answer(self, place: Place, question: str, *, user: str | None = None) -> None:
        """Ask ``question`` (addressed) and wait for the default echo answer in ``place``."""
        since = len(self.harness.received(place))
        await self.say(place, question, user=user)
        expected = f"echo: {question}"
        await self.harness.wait_for(
            place, lambda got: expected in got, since=since, what=repr(expected)
        )

    async def incoming(self, text: str) -> IncomingMessage:
        """The incoming message the bridge got with ``text`` (waiting for it)."""
        return (await self.incomings(lambda m: m.text.strip() == text, 1, what=repr(text)))[0]

    async def incomings(
        self, predicate: Callable[[IncomingMessage], bool], count: int, *, what: str
    ) -> list[IncomingMessage]:
        """Wait until ``count`` incoming messages match ``predicate``; return them."""
        try:
            async with asyncio.timeout(self.harness.timeout):
                while True:
                    found = [m for m in self.bridge.incoming if predicate(m)]
                    if len(found) >= count:
                        return found
                    self.bridge.arrived.clear()
                    await self.bridge.arrived.wait()
        except TimeoutError:
            seen = "\n".join(f"  {m.text!r} in {m.channel_key}" for m in self.bridge.incoming)
            raise AssertionError(
                f"the bridge never got {what} from the transport within "
                f"{self.harness.timeout:g}s; it got:\n{seen or '  (nothing)'}"
            ) from None

    def user_messages(self, request: int = -1) -> list[tuple[str | None, str]]:
        """(author, text) of the user messages in one model request."""
        messages = self.model.requests[request].messages
        return [(m.author, m.content) for m in messages if m.role == "user"]


def long_answer(caps: ChannelCaps) -> str:
    """An answer several times longer than the tightest declared limit, with non-ASCII words."""
    limits = [n for n in (caps.max_bytes, caps.max_chars) if n]
    size = min(max(3 * min(limits), 600), 12_000) if limits else 2_000
    words: list[str] = []
    length = 0
    i = 0
    while length < size:
        word = f"wörd{i:04d}" if i % 3 else f"word{i:04d}"
        words.append(word)
        length += len(word) + 1
        i += 1
    half = len(words) // 2
    return " ".join(words[:half]) + "\n\n" + " ".join(words[half:]) + " THE-END"


def _fits(text: str, caps: ChannelCaps) -> bool:
    if caps.max_chars is not None and len(text) > caps.max_chars:
        return False
    return caps.max_bytes is None or len(text.encode("utf-8")) <= caps.max_bytes


class TransportConformance:
    """The conformance suite; subclass it and provide a ``transport_harness`` fixture."""

    pytestmark = [pytest.mark.asyncio]

    @pytest.fixture
    def transport_harness(self) -> TransportHarness:
        raise NotImplementedError(
            "a TransportConformance subclass must define a 'transport_harness' fixture"
        )

    @pytest.fixture(autouse=True)
    def _conformance_unsupported(
        self, request: pytest.FixtureRequest, transport_harness: TransportHarness
    ) -> None:
        reason = transport_harness.unsupported.get(request.function.__name__)
        if reason:
            pytest.skip(f"{type(transport_harness).__name__}: {reason}")

    @pytest_asyncio.fixture
    async def conformance(
        self, transport_harness: TransportHarness, tmp_path: Path
    ) -> AsyncIterator[Conformance]:
        rig = Conformance(transport_harness, tmp_path)
        try:
            await rig.start()
            yield rig
        finally:
            await rig.aclose()

    @staticmethod
    def _require(rig: Conformance, kind: str, why: str) -> None:
        if kind not in rig.harness.place_kinds:
            pytest.skip(f"{type(rig.harness).__name__} has no {kind} places: {why}")

    # -- declarations ------------------------------------------------------------------------
    async def test_declares_its_type_and_sane_caps(self, conformance: Conformance) -> None:
        t = conformance.transport
        assert isinstance(t, Transport)
        expected = conformance.harness.transport_type
        assert t.type and (not expected or t.type == expected), (
            f"{type(t).__name__}.type is {t.type!r}, expected {expected!r}"
        )
        caps = t.caps
        assert isinstance(caps, ChannelCaps), f"caps is {caps!r}, not a ChannelCaps"
        assert caps.streaming in _STREAM_MODES, f"unknown streaming mode {caps.streaming!r}"
        for limit in ("max_bytes", "max_chars"):
            value = getattr(caps, limit)
            assert value is None or value >= 32, f"caps.{limit} = {value!r} leaves no room"
        assert isinstance(t.default_command_prefix, str) and t.default_command_prefix

    async def test_an_unknown_setting_is_refused_naming_the_key(
        self, transport_harness: TransportHarness
    ) -> None:
        with pytest.raises(ConfigError) as caught:
            transport_harness.make_transport(name=INSTANCE, extra={"no_such_setting": 1})
        assert f"transports.{INSTANCE}.no_such_setting" in str(caught.value)

    # -- who is answered -------------------------------------------------------------------
    async def test_a_direct_message_is_answered_privately(self, conformance: Conformance) -> None:
        rig, h = conformance, conformance.harness
        self._require(rig, "direct", "nobody can talk to the bot privately")
        alice = rig.user(0)
        await rig.answer(h.direct(alice), "hello there")
        msg = await rig.incoming("hello there")
        assert msg.direct, "a direct message must arrive with direct=True"
        assert msg.channel_key.startswith(f"{rig.transport.type}:"), msg.channel_key  # type: ignore[union-attr]
        assert rig.user_messages() == [(alice, "hello there")]
        if len(h.users) > 1:
            bob = rig.user(1)
            await rig.answer(h.direct(bob), "a secret from bob")
            assert "echo: a secret from bob" not in h.received(h.direct(alice))
            assert "echo: hello there" not in h.received(h.direct(bob))
        if "channel" in h.place_kinds:
            assert not any("echo:" in text for text in h.received(h.channel("a")))

    async def test_a_channel_answers_only_when_addressed(self, conformance: Conformance) -> None:
        rig, h = conformance, conformance.harness
        self._require(rig, "channel", "there are no shared channels to stay quiet in")
        room = h.channel("a")
        chatter, question = "just chatting among ourselves", "what is the answer?"
        await rig.say(room, chatter, user=rig.user(1), addressed=False)
        await rig.answer(room, question)
        # The chatter came first: had it been answered, its answer would be here by now.
        assert f"echo: {chatter}" not in h.received(room)
        msg = await rig.incoming(question)
        assert msg.addressed and not msg.direct, (
            f"an addressed channel message arrived with addressed={msg.addressed}, "
            f"direct={msg.direct}"
        )
        for m in rig.bridge.incoming:
            if chatter in m.text:
                assert not m.addressed and not m.direct, "chatter was flagged as for the bot"
        assert rig.user_messages() == [(rig.user(0), question)], (
            "the model must see the question without the address, and nothing else"
        )

    async def test_several_people_reach_the_model_with_their_names(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        self._require(rig, "channel", "only one person talks in each place")
        if len(h.users) < 2:
            pytest.skip(f"{type(h).__name__}: only one person can talk")
        room = h.channel("a")
        await rig.answer(room, "I like tea", user=rig.user(0))
        await rig.answer(room, "I prefer coffee", user=rig.user(1))
        assert rig.user_messages() == [
            (rig.user(0), "I like tea"),
            (rig.user(1), "I prefer coffee"),
        ]

    # -- channel keys ----------------------------------------------------------------------------
    def _places(self, rig: Conformance) -> list[Place]:
        h = rig.harness
        places: list[Place] = []
        if "channel" in h.place_kinds:
            places += [h.channel("a"), h.channel("b")]
        if "direct" in h.place_kinds:
            places += [h.direct(u) for u in h.users[:2]]
        if "thread" in h.place_kinds and "channel" in h.place_kinds:
            places.append(h.thread(h.channel("a"), "t"))
        return places

    async def test_channel_keys_are_distinct_per_place_and_answers_stay_there(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        places = self._places(rig)
        if len(places) < 2:
            pytest.skip(f"{type(h).__name__} has a single place to talk in")
        for i, place in enumerate(places):
            await rig.answer(place, f"ping {i}")
        keys = [(await rig.incoming(f"ping {i}")).channel_key for i in range(len(places))]
        clashes = {
            f"{places[i]} and {places[j]}: {keys[i]}"
            for i in range(len(keys))
            for j in range(i + 1, len(keys))
            if keys[i] == keys[j]
        }
        assert not clashes, "places share a channel key: " + "; ".join(sorted(clashes))
        kind = rig.transport.type  # type: ignore[union-attr]
        assert all(k.startswith(f"{kind}:") for k in keys), keys
        for i, place in enumerate(places):
            echoes = [t for t in h.received(place) if t.startswith("echo: ping")]
            assert echoes == [f"echo: ping {i}"], f"{place} received {echoes}"
        # A second message in each place: the same key again.
        for i, place in enumerate(places):
            await rig.answer(place, f"pong {i}")
            assert (await rig.incoming(f"pong {i}")).channel_key == keys[i], place

    async def test_channel_keys_are_stable_across_a_restart(self, conformance: Conformance) -> None:
        rig = conformance
        place = rig.harness.channel("a") if "channel" in rig.harness.place_kinds else rig.place()
        await rig.answer(place, "remember me")
        before = (await rig.incoming("remember me")).channel_key
        await rig.restart()
        await rig.answer(place, "do you remember?")
        after = (await rig.incoming("do you remember?")).channel_key
        assert after == before, f"the channel key changed across a restart: {before} -> {after}"
        texts = [text for _, text in rig.user_messages()]
        assert texts == ["remember me", "do you remember?"], (
            "after a restart the conversation must go on with its history"
        )

    # -- answers ---------------------------------------------------------------------------------
    async def test_a_long_answer_is_split_within_the_limits_and_nothing_is_lost(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        # One place of each kind: a transport may render them differently.
        places: list[Place] = []
        for p in self._places(rig):
            if all(p.kind != q.kind for q in places):
                places.append(p)
        for place in places:
            text = long_answer(rig.caps)
            rig.model.enqueue(Reply(text=text))
            since = len(h.received(place))
            await rig.say(place, "write a long answer")
            got = await h.wait_for(
                place,
                lambda r: "THE-END" in " ".join(r),
                since=since,
                what="the end of a long answer",
            )
            caps = rig.caps  # read again: a transport may learn its limits after connecting
            too_long = [len(t) for t in got if not _fits(t, caps)]
            assert not too_long, (
                f"in {place}: messages over the declared limits (max_bytes={caps.max_bytes}, "
                f"max_chars={caps.max_chars}): {too_long} characters"
            )
            if caps.max_bytes or caps.max_chars:
                assert len(got) > 1, f"in {place}: a long answer must be split"
            words = " ".join(got).split()
            assert words == text.split(), (
                f"in {place}: {len(words)} words arrived of {len(text.split())}; "
                f"the first difference is at word {_first_difference(words, text.split())}"
            )

    async def test_several_messages_are_answered_in_order(self, conformance: Conformance) -> None:
        rig, h = conformance, conformance.harness
        place = h.channel("a") if "channel" in h.place_kinds else rig.place()
        since = len(h.received(place))
        questions = ["first question", "second question", "third question"]
        for q in questions:  # back to back, without waiting for answers
            await rig.say(place, q)
        expected = [f"echo: {q}" for q in questions]
        got = await h.wait_for(
            place,
            lambda r: all(e in r for e in expected),
            since=since,
            what="three answers",
        )
        assert [t for t in got if t in expected] == expected

    async def test_messages_sent_while_a_turn_runs_are_not_lost(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        place = h.channel("a") if "channel" in h.place_kinds else rig.place()
        gate = asyncio.Event()
        held = Reply(text="the slow answer", gate=gate)
        rig.model.enqueue(held)
        since = len(h.received(place))
        await rig.say(place, "a slow question")
        async with asyncio.timeout(h.timeout):
            await held.started.wait()
        others = ["asked while busy", "asked while still busy"]
        await rig.say(place, others[0], user=rig.user(1))
        await rig.say(place, others[1], user=rig.user(0))
        # Both reached the bridge while the first turn was still running.
        await rig.incomings(lambda m: m.text.strip() in others, 2, what="both messages")
        assert not gate.is_set() and len(rig.model.requests) == 1
        gate.set()
        expected = ["the slow answer", *(f"echo: {o}" for o in others)]
        got = await h.wait_for(
            place, lambda r: all(e in r for e in expected), since=since, what="every answer"
        )
        assert [t for t in got if t in expected] == expected
        asked = [rig.user_messages(i)[-1][1] for i in range(len(rig.model.requests))]
        assert asked == ["a slow question", *others]

    async def test_stop_interrupts_the_answer_and_the_bot_stays_usable(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        place = h.channel("a") if "channel" in h.place_kinds else rig.place()
        words = [f"slow{i}" for i in range(400)]
        # Held after a few words until released (never): the stop always finds
        # the answer being written, however slow the machine.
        rig.model.enqueue(Reply(text=" ".join(words), hold_after=5))
        since = len(h.received(place))
        deltas = rig.agent.events(kinds=["text_delta"])
        try:
            await rig.say(place, "talk slowly")
            async with asyncio.timeout(h.timeout):
                await anext(deltas)  # the answer is being written
        finally:
            await deltas.aclose()
        await h.command(place, "stop", user=rig.user(0), prefix=rig.prefix)
        got = await h.wait_for(
            place,
            lambda r: any("interrupted" in t for t in r),
            since=since,
            what="the notice that the answer was interrupted",
        )
        assert not any(words[-1] in t for t in got), "the whole answer arrived despite the stop"
        await rig.answer(place, "are you still there?")

    async def test_command_replies_reach_the_place_they_were_asked_in(
        self, conformance: Conformance
    ) -> None:
        rig, h = conformance, conformance.harness
        place = h.channel("a") if "channel" in h.place_kinds else rig.place()
        since = len(h.received(place))
        await h.command(place, "help", user=rig.user(0), prefix=rig.prefix)
        listing = f"{rig.prefix}stop"
        await h.wait_for(
            place, lambda r: any(listing in t for t in r), since=since, what="the command list"
        )
        assert rig.model.requests == [], "a command must not reach the model"

    # -- shutdown ----------------------------------------------------------------------------------
    async def _assert_clean_shutdown(self, rig: Conformance) -> None:
        await rig.aclose()  # fails if serve() does not return
        leftover = rig.leftover_tasks()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rig.harness.timeout):
                while leftover:  # tasks that were cancelled get a moment to finish
                    await asyncio.sleep(0.05)
                    leftover = rig.leftover_tasks()
        assert not leftover, "tasks still running after aclose():\n" + "\n".join(
            f"  {_describe(t)}" for t in leftover
        )

    async def test_shutdown_leaves_nothing_running(self, conformance: Conformance) -> None:
        rig = conformance
        await rig.answer(rig.place(), "hello before shutdown")
        await self._assert_clean_shutdown(rig)

    async def test_shutdown_during_a_turn_leaves_nothing_running(
        self, conformance: Conformance
    ) -> None:
        rig = conformance
        held = Reply(text="never finished", gate=asyncio.Event())
        rig.model.enqueue(held)
        await rig.say(rig.place(), "a question that is never answered")
        async with asyncio.timeout(rig.harness.timeout):
            await held.started.wait()
        await self._assert_clean_shutdown(rig)


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"{i}: got {x!r}, expected {y!r}"
    return f"{min(len(a), len(b))} (one is a prefix of the other)"


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", None) or repr(coro)
    frames = task.get_stack(limit=1)
    where = f" at {frames[0].f_code.co_filename}:{frames[0].f_lineno}" if frames else ""
    return f"{task.get_name()}: {name}{where}"
