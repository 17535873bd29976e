"""Signed outbound webhooks (issue 35): a real agent (scripted model, a real SQLite file or
PostgreSQL) POSTs its run events to a real local HTTP receiver (aiohttp), which checks
every request with the recipe of docs/webhooks.md, read from the page itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentik.bot.config import parse_config
from agentik.bot.webhooks import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Webhooks,
    WebhookSettings,
    sign,
    verify,
)
from agentik.core import Agent, SQLiteStore
from agentik.core.errors import ConfigError
from agentik.core.testing.scripted import ScriptedModel
from helpers import agentik

from ircservers import free_port
from rigs import eventually

pytest_plugins = ["pgserver"]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "webhooks.md"
SECRET = "whsec-0123456789abcdef"


def _recipe() -> Any:
    """``verify_agentik_signature`` as docs/webhooks.md shows it (the page's code, run)."""
    text = DOCS.read_text(encoding="utf-8")
    [code] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def verify_" in b]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOCS), "exec"), namespace)
    return namespace["verify_agentik_signature"]


verify_recipe = _recipe()


class Receiver:
    """A webhook receiver on 127.0.0.1 as its documentation tells one to write it: it
    verifies each request (tolerance 300 s), then answers ``statuses`` in turn (then
    200).  ``skew`` moves its clock (a request replayed later)."""

    def __init__(self, secret: str = SECRET, port: int | None = None) -> None:
        self.secret = secret.encode()
        self.port = port or free_port()
        self.statuses: list[int] = []
        self.skew = 0.0
        #: Verified requests: (headers, payload), in arrival order.
        self.accepted: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.refused = 0
        #: While set to an unset event, requests wait for it (a receiver that hangs);
        #: ``held`` counts the requests that waited.
        self.hold: asyncio.Event | None = None
        self.held = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?token=in-the-url"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.hold is not None and not self.hold.is_set():
            self.held += 1
            await self.hold.wait()
        if not verify_recipe(self.secret, request.headers, body, now=time.time() + self.skew):
            self.refused += 1
            return web.Response(status=401, text="bad signature")
        self.raw.append((dict(request.headers), body))
        if self.statuses:
            return web.Response(status=self.statuses.pop(0))
        self.accepted.append((dict(request.headers), json.loads(body)))
        return web.Response(status=204)

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def ids(self) -> list[str]:
        return [h[DELIVERY_HEADER] for h, _ in self.accepted]


def hook(url: str, **kw: Any) -> WebhookSettings:
    fields: dict[str, Any] = {"name": "ops", "url": url, "secret_env": "TEST_WEBHOOK_SECRET"}
    fields.update(kw)
    return WebhookSettings(**fields)


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)


async def _turn(agent: Agent, text: str = "hello", channel: str = "stdio:t") -> str:
    conv = await agent.conversation_for_channel(channel)
    await conv.send(text, author="alice")
    return conv.id


def _all_delivered(agent: Agent, n: int) -> Any:
    async def check() -> list[Any] | None:
        rows = await agent.store.webhook_deliveries()
        return rows if len(rows) == n and all(r.state == "delivered" for r in rows) else None

    return check


# -- signing and verifying -------------------------------------------------------------------
async def test_a_receiver_verifies_every_delivery_with_the_documented_recipe(db_path):
    receiver = await Receiver().start()
    try:
        async with (
            Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent,
            Webhooks(agent, [hook(receiver.url, events=["turn_started", "turn_ended"])]),
        ):
            cid = await _turn(agent)
            await eventually(lambda: len(receiver.accepted) == 2, "two verified deliveries")
            rows = await eventually(_all_delivered(agent, 2), "both recorded as delivered")
    finally:
        await receiver.stop()
    assert receiver.refused == 0
    kinds = [payload["event"]["kind"] for _, payload in receiver.accepted]
    assert sorted(kinds) == ["turn_ended", "turn_started"]
    for headers, payload in receiver.accepted:
        assert headers[DELIVERY_HEADER] == payload["delivery_id"]
        assert headers["X-Agentik-Event"] == payload["event"]["kind"]
        assert payload["webhook"] == "ops" and payload["event"]["conversation_id"] == cid
        assert headers[SIGNATURE_HEADER].startswith("v0=")
    ended = next(p for _, p in receiver.accepted if p["event"]["kind"] == "turn_ended")
    assert ended["event"]["stop_reason"] == "stop"
    # Recorded as delivered; the secret is nowhere in the database.
    assert {(r.state, r.attempts) for r in rows} == {("delivered", 1)}
    assert SECRET.encode() not in await asyncio.to_thread(Path(db_path).read_bytes)


async def test_the_recipe_refuses_a_wrong_secret_a_changed_body_and_our_verify_agrees():
    body = b'{"delivery_id": "x", "event": {"kind": "turn_ended"}}'
    now = int(time.time())
    headers = {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(SECRET.encode(), now, body)}
    assert verify_recipe(SECRET.encode(), headers, body)
    assert verify(SECRET.encode(), headers, body)
    assert not verify_recipe(b"another secret", headers, body)
    assert not verify_recipe(SECRET.encode(), headers, body.replace(b"ended", b"begun"))
    assert not verify(SECRET.encode(), headers, body.replace(b"ended", b"begun"))
    # A fresh timestamp on an old signature does not pass either: the time is signed.
    assert not verify_recipe(SECRET.encode(), {**headers, TIMESTAMP_HEADER: str(now + 1)}, body)
    assert not verify_recipe(SECRET.encode(), {SIGNATURE_HEADER: "v0=00"}, body)
    assert not verify_recipe(SECRET.encode(), {**headers, TIMESTAMP_HEADER: "soon"}, body)


async def test_a_replayed_delivery_is_refused_by_its_timestamp(db_path):
    receiver = await Receiver().start()
    try:
        async with (
            Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent,
            Webhooks(agent, [hook(receiver.url)]),
        ):
            await _turn(agent)
            await eventually(lambda: receiver.accepted, "the delivery")
        [(headers, body)] = receiver.raw
        # Someone captured the request and sends it again, byte for byte, six minutes
        # later (the receiver's clock moves on by 360 s; its tolerance is 300 s).
        receiver.skew = 360.0
        replay = {
            k: v for k, v in headers.items() if k.lower().startswith(("x-agentik", "content-type"))
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(receiver.url, data=body, headers=replay) as response,
        ):
            assert response.status == 401
        # Within the tolerance the same bytes pass (so it is the timestamp that refused it).
        receiver.skew = 0.0
        async with (
            aiohttp.ClientSession() as session,
            session.post(receiver.url, data=body, headers=replay) as response,
        ):
            assert response.status == 204
    finally:
        await receiver.stop()
    assert receiver.refused == 1


# -- retries, dead letters, replay --------------------------------------------------------------
async def test_a_failing_receiver_gets_retries_under_one_delivery_id(db_path):
    receiver = await Receiver().start()
    receiver.statuses = [503, 500]
    try:
        async with (
            Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent,
            Webhooks(agent, [hook(receiver.url, backoff=0.05, max_attempts=5)], poll=0.2),
        ):
            await _turn(agent)
            await eventually(lambda: receiver.accepted, "the delivery, third time lucky")
            [row] = await eventually(_all_delivered(agent, 1), "recorded as delivered")
    finally:
        await receiver.stop()
    assert len(receiver.raw) == 3
    assert len({h[DELIVERY_HEADER] for h, _ in receiver.raw}) == 1
    # Each attempt is signed afresh (the tolerance applies to the attempt, not the event).
    assert (row.state, row.attempts, row.last_error) == ("delivered", 3, "HTTP 500")


async def test_a_receiver_that_is_down_gets_retries_then_a_dead_letter_an_operator_replays(
    tmp_path,
):
    db = str(tmp_path / "bot.db")
    (tmp_path / "bot.toml").write_text(
        '[storage]\npath = "bot.db"\n[llm]\nbackend = "scripted"\n', encoding="utf-8"
    )
    receiver = Receiver()  # not started: connections are refused
    async with (
        Agent(llm=ScriptedModel(), store=SQLiteStore(db)) as agent,
        Webhooks(agent, [hook(receiver.url, backoff=0.05, max_attempts=3)], poll=0.2),
    ):
        await _turn(agent)

        async def dead() -> list[Any]:
            return await agent.store.webhook_deliveries(state="dead")

        [letter] = await eventually(dead, "a dead letter")
        assert letter.attempts == 3
        assert "Connection refused" in (letter.last_error or "")
        assert "in-the-url" not in (letter.last_error or "")
        assert json.loads(letter.body)["event"]["kind"] == "turn_ended"

        listed = await asyncio.to_thread(
            agentik, "webhooks", "dead-letters", "-c", "bot.toml", cwd=tmp_path
        )
        assert listed.returncode == 0, listed.stderr
        assert "dead letters: 1" in listed.stdout and letter.id in listed.stdout
        assert "gave up after 3 attempt(s)" in listed.stdout and "turn_ended" in listed.stdout
        assert "in-the-url" not in listed.stdout + listed.stderr
        as_json = await asyncio.to_thread(
            agentik, "webhooks", "dead-letters", "--json", "-c", "bot.toml", cwd=tmp_path
        )
        assert json.loads(as_json.stdout)["id"] == letter.id

        # The receiver is back; the operator replays the letter; the running bot sends it.
        await receiver.start()
        try:
            refused = await asyncio.to_thread(
                agentik, "webhooks", "replay", "-c", "bot.toml", cwd=tmp_path
            )
            assert refused.returncode == 2 and "delivery ids, or --all" in refused.stderr
            replayed = await asyncio.to_thread(
                agentik, "webhooks", "replay", letter.id, "-c", "bot.toml", cwd=tmp_path
            )
            assert replayed.returncode == 0, replayed.stderr
            assert "replayed 1 dead letter(s)" in replayed.stdout
            await eventually(lambda: receiver.accepted, "the replayed delivery")
        finally:
            await receiver.stop()
        assert receiver.ids() == [letter.id]
        assert await agent.store.webhook_deliveries(state="dead") == []
        again = await asyncio.to_thread(
            agentik, "webhooks", "replay", letter.id, "-c", "bot.toml", cwd=tmp_path
        )
        assert again.returncode == 1 and "not a dead letter" in again.stdout


async def test_deliveries_survive_a_restart(db_path):
    receiver = Receiver()  # down while the first process runs
    async with (
        Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent,
        Webhooks(agent, [hook(receiver.url, backoff=0.2, max_attempts=50)], poll=0.2),
    ):
        cid = await _turn(agent)

        async def tried() -> bool:
            rows = await agent.store.webhook_deliveries()
            return bool(rows) and rows[0].attempts >= 1

        await eventually(tried, "a failed first attempt")
        [pending] = await agent.store.webhook_deliveries(state="pending")
    # The process is gone; the receiver comes back; a new process sends what was left.
    await receiver.start()
    try:
        async with (
            Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent,
            Webhooks(agent, [hook(receiver.url, backoff=0.2, max_attempts=50)], poll=0.2),
        ):
            await eventually(lambda: receiver.accepted, "the delivery after the restart")
            [row] = await eventually(_all_delivered(agent, 1), "recorded as delivered")
    finally:
        await receiver.stop()
    assert receiver.ids() == [pending.id]
    assert receiver.accepted[0][1]["event"]["conversation_id"] == cid
    assert row.state == "delivered"


# -- several workers -------------------------------------------------------------------------
async def test_two_workers_deliver_each_event_once(postgres_dsn):
    from agentik.core.store.postgres import PostgresStore

    receiver = await Receiver().start()
    settings = [hook(receiver.url, events=["turn_ended"])]
    try:
        async with (
            Agent(llm=ScriptedModel(), store=PostgresStore(postgres_dsn)) as one,
            Agent(llm=ScriptedModel(), store=PostgresStore(postgres_dsn)) as two,
            Webhooks(one, settings, worker="one", poll=0.1, batch=3),
            Webhooks(two, settings, worker="two", poll=0.1, batch=3),
        ):
            # Turns run on both workers; each records its own, both send.
            for i in range(15):
                await _turn(one, f"a{i}", channel=f"stdio:a{i}")
                await _turn(two, f"b{i}", channel=f"stdio:b{i}")
            await eventually(lambda: len(receiver.accepted) >= 30, "thirty deliveries")

            async def settled() -> bool:
                rows = await one.store.webhook_deliveries(limit=100)
                return len(rows) == 30 and all(r.state == "delivered" for r in rows)

            await eventually(settled, "every delivery recorded as delivered")
    finally:
        await receiver.stop()
    counts = Counter(receiver.ids())
    assert len(counts) == 30 and set(counts.values()) == {1}
    texts = Counter(p["event"]["conversation_id"] for _, p in receiver.accepted)
    assert len(texts) == 30


async def test_a_clean_stop_hands_claims_back_so_another_worker_sends_them_at_once(db_path):
    await _a_clean_stop_hands_claims_back(lambda: SQLiteStore(db_path), engine="sqlite")


async def test_a_clean_stop_hands_claims_back_to_another_process_on_postgres(postgres_dsn):
    from agentik.core.store.postgres import PostgresStore

    await _a_clean_stop_hands_claims_back(lambda: PostgresStore(postgres_dsn), engine="postgres")


async def _a_clean_stop_hands_claims_back(store: Any, *, engine: str) -> None:
    receiver = await Receiver().start()
    receiver.hold = asyncio.Event()  # the first attempt hangs until the sender gives up
    # A long timeout makes the lease 2 x 100 + 30 s: far longer than the test waits, so
    # only a released claim lets the second worker send before it runs out.
    settings = [hook(receiver.url, timeout=100.0)]
    first = Agent(llm=ScriptedModel(), store=store())
    try:
        async with first:
            one = Webhooks(first, settings, worker="one", poll=0.1)
            await one.start()
            try:
                await _turn(first)
                await eventually(lambda: receiver.held == 1, "the first attempt under way")
                [held] = await first.store.webhook_deliveries()
                assert held.claimed_by == "one" and held.claimed_until > time.time() + 100
            finally:
                await one.aclose()
            [row] = await first.store.webhook_deliveries()
            assert (row.state, row.claimed_by, row.claimed_until, row.attempts) == (
                "pending", None, None, 0,
            )  # fmt: skip
            receiver.hold.set()
            # Another worker (on PostgreSQL another process's store) sends it now.
            second = first if engine == "sqlite" else Agent(llm=ScriptedModel(), store=store())
            async with contextlib.AsyncExitStack() as stack:
                if second is not first:
                    await stack.enter_async_context(second)
                await stack.enter_async_context(Webhooks(second, settings, worker="two", poll=0.1))
                await eventually(lambda: receiver.ids() == [row.id], "the delivery, sent by two")
                [done] = await eventually(_all_delivered(second, 1), "recorded as delivered")
    finally:
        await receiver.stop()
    # The attempt cut at the stop counted nothing; two's attempt is the first recorded.
    assert (done.id, done.attempts) == (row.id, 1)


async def test_a_stop_that_comes_as_the_sender_wakes_up_does_not_hang(db_path):
    """The sender is woken (a delivery was just recorded: its wake-up event is set, as
    the recorder sets it) in the same moment the bot stops.  On Python 3.11 a
    ``wait_for`` around that wake-up returned instead of taking the cancel, the sender
    went round again and the stop waited forever (CI hung for 120 s)."""
    receiver = await Receiver().start()
    try:
        async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
            webhooks = Webhooks(agent, [hook(receiver.url)])
            await webhooks.start()
            await _turn(agent)
            await eventually(lambda: receiver.accepted, "the delivery")
            await eventually(_all_delivered(agent, 1), "recorded as delivered")
            webhooks._wake.set()
            async with asyncio.timeout(60):  # a guard against the hang, not a timing check
                await webhooks.aclose()
            assert webhooks._tasks == [] and webhooks._session is None
    finally:
        await receiver.stop()


# -- configuration -----------------------------------------------------------------------------
def test_a_webhook_needs_one_secret_a_known_event_kind_and_an_http_url():
    with pytest.raises(
        ConfigError, match=r"webhooks\.0.*exactly one of secret_env and secret_file"
    ):
        parse_config({"webhooks": [{"name": "a", "url": "http://x.example/"}]}, env={})
    with pytest.raises(ConfigError, match=r"webhooks\.0\.events.*unknown event kind.*turn_endd"):
        parse_config(
            {"webhooks": [{"name": "a", "url": "http://x/", "secret_env": "S",
                           "events": ["turn_endd"]}]}, env={},
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"webhooks\.0\.url.*http:// or https://"):
        parse_config(
            {"webhooks": [{"name": "a", "url": "file:///etc/passwd", "secret_env": "S"}]}, env={}
        )


async def test_a_missing_secret_stops_the_start_naming_the_key_not_the_value(db_path, tmp_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        with pytest.raises(ConfigError, match=r"webhooks\[0\]\.secret_env: .* NOT_SET_ANYWHERE"):
            Webhooks(agent, [hook("http://127.0.0.1:9/", secret_env="NOT_SET_ANYWHERE")])
        secret_file = tmp_path / "secret"
        secret_file.write_text(SECRET + "\n", encoding="utf-8")
        hooks = Webhooks(agent, [hook("http://127.0.0.1:9/", secret_env=None,
                                      secret_file=str(secret_file))])  # fmt: skip
        assert hooks.hooks["ops"].secret == SECRET.encode()
        with pytest.raises(ConfigError, match=r"webhooks\[0\]\.secret_file: .*cannot read") as e:
            Webhooks(agent, [hook("http://127.0.0.1:9/", secret_env=None,
                                  secret_file=str(tmp_path / "nope"))])  # fmt: skip
        assert SECRET not in str(e.value)
        with pytest.raises(ConfigError, match=r"webhooks\[0\]\.profile: no profile 'loud'"):
            Webhooks(agent, [hook("http://127.0.0.1:9/", profile="loud")])
