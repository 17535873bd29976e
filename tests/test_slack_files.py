"""Slack file shares (issue 34): the files of a ``file_share`` message are fetched from
their ``url_private`` with the bot token (the fake serves them as files.slack.com does),
attached to the person's message, and reach the model request (the real ``openai`` SDK
against the fake OpenAI server) as image parts; a file too large or of a type not taken
gets one line in the thread and nothing is stored."""

from __future__ import annotations

import base64

from agentik.core import OpenAIBackend
from agentik.core.attachments import AttachmentSettings
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

from fakeslack import FakeSlack
from rigs import answered, bot_texts, slack_bot

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _llm(server: FakeOpenAIServer) -> OpenAIBackend:
    return OpenAIBackend(model="fake-model", base_url=server.base_url, api_key="sk-test",
                         max_retries=0, image_in=True)  # fmt: skip


async def test_a_shared_image_reaches_the_model_as_an_image_part(tmp_path):
    async with FakeSlack() as slack, FakeOpenAIServer(model="fake-model") as server:
        slack.add_user("U1", "alice")
        server.enqueue(Reply.text("a red dot"))
        async with slack_bot(slack, tmp_path, model=_llm(server), streaming="edit") as bot:
            image = slack.add_file("dot.png", PNG, "image/png")
            event = slack.message_event(
                "D1", "what is this?", channel_type="im", subtype="file_share", files=[image]
            )
            await slack.push_event(event)
            await answered(slack, bot.bridge, "slack:T1:D1")
            assert bot_texts(slack, "D1") == ["a red dot"]
            user = [m for m in server.requests[-1]["messages"] if m["role"] == "user"][-1]
            assert user["content"][1] == {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
            }
            # Fetched once, with the bot token.
            assert slack.file_downloads == [f"Bearer {slack.bot_token}"]
            conv = bot.bridge.open_channel("slack:T1:D1").conversation
            assert [a.media_type for a in await bot.agent.store.attachments(conv.id)] == [
                "image/png"
            ]


async def test_too_large_or_wrong_type_gets_one_line_and_nothing_is_stored(tmp_path):
    async with FakeSlack() as slack, FakeOpenAIServer(model="fake-model") as server:
        slack.add_user("U1", "alice")
        async with slack_bot(
            slack, tmp_path, model=_llm(server), streaming="edit",
            agent_kw={"attachments": AttachmentSettings(max_bytes=1000)},
        ) as bot:  # fmt: skip
            big = slack.add_file("big.png", PNG + b"\0" * 5000, "image/png")
            await slack.push_event(slack.message_event(
                "D1", "look", channel_type="im", subtype="file_share", files=[big]
            ))  # fmt: skip
            await slack.wait_until(lambda: bot_texts(slack, "D1") or None, 60, "the refusal")
            # Declared larger than the cap: not even fetched.
            assert slack.file_downloads == []
            exe = slack.add_file("cat.png", b"MZ\x90\x00\x03\x00\x00\x00", "image/png")
            await slack.push_event(slack.message_event(
                "D2", "", channel_type="im", subtype="file_share", files=[exe]
            ))  # fmt: skip
            await slack.wait_until(lambda: bot_texts(slack, "D2") or None, 60, "the refusal")
            (too_big,) = bot_texts(slack, "D1")
            (wrong,) = bot_texts(slack, "D2")
            assert "'big.png' not taken" in too_big and "the limit is 1000" in too_big
            assert "'cat.png' not taken" in wrong and "PNG, JPEG" in wrong
            assert "\n" not in too_big and "\n" not in wrong
            for key in ("slack:T1:D1", "slack:T1:D2"):
                ch = bot.bridge.open_channel(key)
                assert await ch.conversation.messages() == []
                assert await bot.agent.store.attachments(ch.conversation.id) == []
            assert server.requests == []
