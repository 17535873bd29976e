"""The fake Slack, exercised with the real slack_sdk / slack_bolt clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from fakeslack import FakeSlack


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
def client(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)


@pytest.fixture
async def socket_client(
    slack: FakeSlack, client: AsyncWebClient
) -> AsyncIterator[SocketModeClient]:
    sm = SocketModeClient(app_token=slack.app_token, web_client=client, ping_interval=0.2)
    received: list[SocketModeRequest] = []

    async def on_request(c: SocketModeClient, req: SocketModeRequest) -> None:
        received.append(req)
        await c.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    sm.socket_mode_request_listeners.append(on_request)  # type: ignore[arg-type]
    sm.received = received  # type: ignore[attr-defined]
    await sm.connect()
    try:
        yield sm
    finally:
        await sm.close()


async def test_auth_test_and_post_message(slack: FakeSlack, client: AsyncWebClient) -> None:
    auth = await client.auth_test()
    assert auth["user_id"] == "UBOT" and auth["team_id"] == "T1" and auth["bot_id"]

    resp = await client.chat_postMessage(channel="C1", text="hello", thread_ts="1699999999.000001")
    assert resp["ok"] and resp["channel"] == "C1"
    ts = resp["ts"]
    assert ts.count(".") == 1 and len(ts.split(".")[1]) == 6
    assert resp["message"]["text"] == "hello" and resp["message"]["user"] == "UBOT"
    second = await client.chat_postMessage(channel="C1", text="again")
    assert second["ts"] != ts and float(second["ts"]) > float(ts)

    await client.chat_update(channel="C1", ts=ts, text="edited")
    assert slack.messages[("C1", ts)]["text"] == "edited"
    assert slack.calls_to("chat.update") == [{"channel": "C1", "ts": ts, "text": "edited"}]
    assert [m for m, _ in slack.calls] == [
        "auth.test",
        "chat.postMessage",
        "chat.postMessage",
        "chat.update",
    ]
    assert (await slack.wait_for_call("chat.postMessage"))["text"] == "hello"
    assert (await slack.wait_for_call("chat.postMessage"))["text"] == "again"

    with pytest.raises(SlackApiError) as err:
        await client.chat_update(channel="C1", ts="1.000000", text="x")
    assert err.value.response["error"] == "message_not_found"


async def test_users_info_conversations_and_reactions(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    slack.add_user("U1", "alice", real_name="Alice Liddell", display_name="ally")
    user = (await client.users_info(user="U1"))["user"]
    assert user["name"] == "alice" and user["profile"]["display_name"] == "ally"
    with pytest.raises(SlackApiError) as err:
        await client.users_info(user="U404")
    assert err.value.response["error"] == "user_not_found"

    info = (await client.conversations_info(channel="D123"))["channel"]
    assert info["is_im"] and info["id"] == "D123"

    parent = (await client.chat_postMessage(channel="C1", text="parent"))["ts"]
    await client.chat_postMessage(channel="C1", text="reply", thread_ts=parent)
    await client.reactions_add(channel="C1", timestamp=parent, name="eyes")
    replies = (await client.conversations_replies(channel="C1", ts=parent))["messages"]
    assert [m["text"] for m in replies] == ["parent", "reply"]
    assert replies[0]["reactions"] == [{"name": "eyes", "users": ["UBOT"], "count": 1}]
    with pytest.raises(SlackApiError) as err:
        await client.reactions_add(channel="C1", timestamp=parent, name="eyes")
    assert err.value.response["error"] == "already_reacted"

    await client.assistant_threads_setStatus(channel_id="D1", thread_ts=parent, status="thinking")
    assert slack.calls_to("assistant.threads.setStatus")[0]["status"] == "thinking"


async def test_auth_errors_and_unknown_method(slack: FakeSlack) -> None:
    bad = AsyncWebClient(token="xoxb-wrong", base_url=slack.api_url)
    with pytest.raises(SlackApiError) as err:
        await bad.auth_test()
    assert err.value.response["error"] == "invalid_auth"

    good = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    with pytest.raises(SlackApiError) as err:
        await good.api_call("no.such.method")
    assert err.value.response["error"] == "unknown_method"
    with pytest.raises(SlackApiError) as err:  # bot token where an app token is needed
        await good.apps_connections_open(app_token=slack.bot_token)
    assert err.value.response["error"] == "not_allowed_token_type"


async def test_rate_limit_raises_429(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.rate_limit("chat.postMessage", times=1, retry_after=7)
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="C1", text="hi")
    assert err.value.response.status_code == 429
    assert err.value.response["error"] == "ratelimited"
    assert err.value.response.headers["Retry-After"] == "7"
    assert (await client.chat_postMessage(channel="C1", text="hi"))["ok"]  # limit used up


async def test_rate_limit_retried_by_handler(slack: FakeSlack) -> None:
    client = AsyncWebClient(
        token=slack.bot_token,
        base_url=slack.api_url,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=2)],
    )
    slack.rate_limit("chat.postMessage", times=1, retry_after=0)
    resp = await client.chat_postMessage(channel="C1", text="hi")
    assert resp["ok"]
    assert len(slack.calls_to("chat.postMessage")) == 2  # the 429'd call is recorded too
    assert len(slack.messages) == 1


async def test_chat_stream_helper(slack: FakeSlack, client: AsyncWebClient) -> None:
    streamer = await client.chat_stream(
        channel="C1",
        thread_ts="1700000000.000001",
        recipient_team_id="T1",
        recipient_user_id="U1",
        buffer_size=5,
    )
    await streamer.append(markdown_text="Hello")  # flushes: startStream
    await streamer.append(markdown_text=", wor")  # appendStream
    await streamer.append(markdown_text="ld")  # buffered
    await streamer.stop(markdown_text="!")  # stopStream with the rest
    ts = streamer.ts
    assert ts is not None
    assert slack.messages[("C1", ts)]["text"] == "Hello, world!"
    assert slack.messages[("C1", ts)]["thread_ts"] == "1700000000.000001"
    start = slack.calls_to("chat.startStream")[0]
    assert start["recipient_user_id"] == "U1" and start["recipient_team_id"] == "T1"
    assert start["chunks"] == [{"type": "markdown_text", "text": "Hello"}]
    assert [c["ts"] for c in slack.calls_to("chat.appendStream")] == [ts]
    assert slack.calls_to("chat.stopStream")[0]["chunks"] == [
        {"type": "markdown_text", "text": "ld!"}
    ]
    with pytest.raises(SlackApiError) as err:  # the stream is over
        await client.chat_appendStream(channel="C1", ts=ts, markdown_text="late")
    assert err.value.response["error"] == "message_not_in_streaming_state"


async def test_streaming_unsupported(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.supports_streaming = False
    with pytest.raises(SlackApiError) as err:
        await client.chat_startStream(channel="C1", thread_ts="1700000000.000001")
    assert err.value.response["error"] == "unknown_method"


async def test_socket_mode_event_and_ack(slack: FakeSlack, socket_client) -> None:
    await slack.wait_for_socket(1)
    assert slack.sent[0]["type"] == "hello"
    event = slack.message_event("C1", "hi bot", user="U1")
    envelope_id = await slack.push_event(event, retry_num=1, retry_reason="timeout")
    ack = await slack.wait_for_ack(envelope_id)
    assert ack == {"envelope_id": envelope_id}
    req = socket_client.received[0]
    assert req.type == "events_api" and req.retry_attempt == 1 and req.retry_reason == "timeout"
    assert req.payload["event"]["text"] == "hi bot"
    assert req.payload["type"] == "event_callback" and req.payload["team_id"] == "T1"
    assert req.payload["authorizations"][0]["user_id"] == "UBOT"
    # The pushed user message is part of the channel state.
    assert slack.messages[("C1", event["ts"])]["user"] == "U1"
    assert len(slack.calls_to("apps.connections.open")) == 1


@pytest.mark.parametrize("abort", [True, False])
async def test_socket_mode_reconnects_after_drop(slack: FakeSlack, socket_client, abort) -> None:
    await slack.wait_for_socket(1)
    await slack.drop_socket(abort=abort)
    await slack.wait_for_socket(2)
    assert slack.socket_connections == 2
    assert len(slack.calls_to("apps.connections.open")) == 2
    envelope_id = await slack.push_event(slack.message_event("C1", "after reconnect"))
    await slack.wait_for_ack(envelope_id)
    assert socket_client.received[-1].payload["event"]["text"] == "after reconnect"


async def test_socket_mode_refresh_requested(slack: FakeSlack, socket_client) -> None:
    await slack.wait_for_socket(1)
    await slack.request_refresh()
    await slack.wait_for_socket(2)
    envelope_id = await slack.push_event(slack.message_event("C1", "fresh"))
    await slack.wait_for_ack(envelope_id)


async def test_an_unacked_event_is_sent_again_with_its_retry_number(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    slack.retry_after, slack.max_retries = 0.1, 2
    url = (await client.apps_connections_open(app_token=slack.app_token))["url"]
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert (await ws.receive_json())["type"] == "hello"
        first = await slack.push_event(slack.message_event("C1", "hi"), event_id="Ev1")
        frames = [await ws.receive_json(timeout=60) for _ in range(3)]  # never acked in time
        assert [f["retry_attempt"] for f in frames] == [0, 1, 2]
        assert [f["retry_reason"] for f in frames] == ["", "timeout", "timeout"]
        assert {f["payload"]["event_id"] for f in frames} == {"Ev1"}
        assert frames[0]["envelope_id"] == first
        assert len({f["envelope_id"] for f in frames}) == 3  # a new envelope each time
        await ws.send_json({"envelope_id": frames[-1]["envelope_id"]})
        await slack.wait_for_ack(frames[-1]["envelope_id"])
    assert slack.retried == [("Ev1", 1), ("Ev1", 2)]


async def test_socket_ticket_is_single_use(slack: FakeSlack, client: AsyncWebClient) -> None:
    url = (await client.apps_connections_open(app_token=slack.app_token))["url"]
    assert url.startswith(f"ws://127.0.0.1:{slack.port}/socket?ticket=")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url) as ws:
            hello = await ws.receive_json()
            assert hello["type"] == "hello" and hello["connection_info"] == {"app_id": "A1"}
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await session.ws_connect(url)


async def test_bolt_app_over_socket_mode(slack: FakeSlack, client: AsyncWebClient) -> None:
    app = AsyncApp(client=client)

    @app.event("app_mention")
    async def on_mention(event, say) -> None:
        await say(text=f"you said: {event['text']}", thread_ts=event["ts"])

    handler = AsyncSocketModeHandler(app, slack.app_token, ping_interval=0.2)
    await handler.connect_async()
    try:
        event = slack.app_mention_event("C1", "<@UBOT> ping", user="U1")
        envelope_id = await slack.push_event(event)
        await slack.wait_for_ack(envelope_id)
        reply = await slack.wait_for_call("chat.postMessage")
        assert reply["channel"] == "C1" and reply["thread_ts"] == event["ts"]
        assert reply["text"] == "you said: <@UBOT> ping"
        thread = (await client.conversations_replies(channel="C1", ts=event["ts"]))["messages"]
        assert [m["user"] for m in thread] == ["U1", "UBOT"]
    finally:
        await handler.close_async()


def test_sign_verifies_with_signature_verifier(slack: FakeSlack) -> None:
    body = json.dumps(slack.event_callback(slack.message_event("C1", "hi"))).encode()
    headers = slack.sign(body)
    verifier = SignatureVerifier(slack.signing_secret)
    assert verifier.is_valid_request(body, headers)
    assert not verifier.is_valid_request(body + b" ", headers)
    assert not SignatureVerifier("other").is_valid_request(body, headers)
    stale = slack.sign(body, timestamp=1_000_000)
    assert stale["X-Slack-Request-Timestamp"] == "1000000"
    assert not verifier.is_valid_request(body, stale)  # too old


async def test_assistant_thread_methods_check_their_arguments(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    where = {"channel_id": "D1", "thread_ts": "1700000000.000100"}
    await client.assistant_threads_setStatus(**where, status="is thinking…")
    await client.assistant_threads_setTitle(**where, title="Deploying")
    await client.assistant_threads_setSuggestedPrompts(
        **where, prompts=[{"title": "Hi", "message": "Say hi"}], title="Try"
    )
    assert slack.calls_to("assistant.threads.setSuggestedPrompts")[0]["prompts"] == [
        {"title": "Hi", "message": "Say hi"}
    ]
    bad = [
        client.assistant_threads_setTitle(channel_id="D1", thread_ts="1.0", title=""),
        client.assistant_threads_setStatus(channel_id="D1", thread_ts="", status="x"),
        client.assistant_threads_setSuggestedPrompts(**where, prompts=[]),
        client.assistant_threads_setSuggestedPrompts(**where, prompts=[{"title": "no message"}]),
        client.assistant_threads_setSuggestedPrompts(
            **where, prompts=[{"title": str(i), "message": str(i)} for i in range(5)]
        ),
    ]
    for call in bad:
        with pytest.raises(SlackApiError) as err:
            await call
        assert err.value.response["error"] == "invalid_arguments"


async def test_assistant_and_subtype_events_have_slacks_shape(slack: FakeSlack) -> None:
    started = slack.assistant_thread_started_event("D1", user="U1", context={"channel_id": "C1"})
    thread = started["assistant_thread"]
    assert started["type"] == "assistant_thread_started"
    assert set(thread) == {"user_id", "context", "channel_id", "thread_ts"}
    assert thread["channel_id"] == "D1" and thread["context"] == {"channel_id": "C1"}
    changed = slack.assistant_thread_context_changed_event("D1", thread["thread_ts"], {})
    assert changed["type"] == "assistant_thread_context_changed"
    assert changed["assistant_thread"]["thread_ts"] == thread["thread_ts"]
    shared = slack.message_event("C1", "look", subtype="file_share")
    assert shared["subtype"] == "file_share" and shared["files"][0]["mimetype"] == "text/plain"
    root = slack.message_event("C1", "root")
    slack.messages[("C1", root["ts"])] = root
    broadcast = slack.message_event("C1", "all", thread_ts=root["ts"], subtype="thread_broadcast")
    assert broadcast["root"]["ts"] == root["ts"] and broadcast["thread_ts"] == root["ts"]
