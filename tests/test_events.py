"""Events serialise losslessly and profiles select the right kinds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentik.core import events as ev
from agentik.core.messages import ChatMessage, Message, ToolCall, Usage
from agentik.core.streamprofiles import PROFILES

ENVELOPE = dict(
    conversation_id="c1",
    run_id="run_1",
    parent_run_id="run_0",
    seq=7,
    stream_seq=42,
    ts=1700000000.25,
)

SAMPLES = [
    ev.TurnStarted(**ENVELOPE, message_id=3, author="alice"),
    ev.ReasoningStarted(**ENVELOPE),
    ev.ReasoningDelta(**ENVELOPE, text="hmm"),
    ev.ResponseStarted(**ENVELOPE),
    ev.TextDelta(**ENVELOPE, text="héllo 🌍"),
    ev.ToolCallStarted(**ENVELOPE, call_id="call_1", name="add", arguments='{"a": 1}'),
    ev.ToolCallEnded(
        **ENVELOPE, call_id="call_1", name="add", result="2", is_error=True, duration=0.5
    ),
    ev.ChildRunLinked(
        **ENVELOPE,
        child_run_id="run_2",
        call_id="call_1",
        agent="researcher",
        child_conversation_id="c2",
    ),
    ev.RunStreamEnd(**ENVELOPE),
    ev.TurnEnded(
        **ENVELOPE,
        stop_reason="length",
        usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
        text="done",
        tool_calls=2,
        duration=1.5,
    ),
    ev.Interrupted(**ENVELOPE, partial_text="par", reason="time_budget"),
    ev.Error(**ENVELOPE, message="boom", error_type="LLMTimeout", retryable=True),
    ev.EventsLost(**ENVELOPE, requested_after=3, oldest_seq=9),
    ev.Compacted(
        **ENVELOPE,
        messages=12,
        tokens_before=900,
        tokens_after=200,
        summary="alice wants tea",
        reason="forced",
        fallback=True,
    ),
    ev.ConversationEnded(**ENVELOPE, reason="reset", channel_key="irc:net:#c"),
    ev.ConversationStarted(**ENVELOPE, channel_key="irc:net:#c"),
    ev.MemoryNoted(**ENVELOPE, count=2, note_ids=(4, 5), source="mining", channel_key="irc:net:#c"),
    ev.ApprovalRequested(
        **ENVELOPE,
        approval_id="3f2",
        call_id="call_1",
        name="fs__write_file",
        arguments='{"path": "/a", "token": "***"}',
        asker="alice",
        asker_id="irc:alice",
        approvers="admin",
        expires_at=1700000600.25,
        timeout=600.0,
        resumed=True,
    ),
    ev.ApprovalResolved(
        **ENVELOPE,
        approval_id="3f2",
        call_id="call_1",
        name="fs__write_file",
        decision="denied",
        approver="bob",
        approver_id="irc:bob",
        reason="not today",
    ),
    ev.QuestionAsked(
        **ENVELOPE,
        question_id=4,
        call_id="call_2",
        question="which region?",
        to="alice",
        choices=("eu", "us"),
        answer_from="anyone",
        expires_at=1700000300.25,
        timeout=300.0,
        resumed=True,
        form=(
            {"id": "region", "text": "which region?", "choices": ["eu", "us"], "required": True},
            {"id": "note", "text": "why?", "choices": [], "required": False},
        ),
        answered=("region",),
    ),
    ev.QuestionProgress(
        **ENVELOPE, question_id=4, call_id="call_2", answered=("region",), next="note", by="bob"
    ),
    ev.QuestionAnswered(
        **ENVELOPE,
        question_id=4,
        call_id="call_2",
        outcome="answered",
        answer="eu",
        answered_by="alice",
    ),
    ev.TodoUpdated(
        **ENVELOPE,
        call_id="call_3",
        items=({"text": "read the logs", "status": "done"}, {"text": "fix", "status": "pending"}),
        changed=(0,),
    ),
    ev.ToolProgress(
        **ENVELOPE,
        call_id="call_4",
        name="srv__build",
        progress=2.0,
        total=5.0,
        message="compiling",
        elapsed=1.5,
    ),
    ev.StatusChanged(
        **ENVELOPE,
        state="executing_tools",
        previous="streaming",
        tools=("add", "web__get"),
        queued=2,
    ),
    ev.RequestUsage(
        **ENVELOPE,
        usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
        model="fake-model",
        backend="openai",
        request=2,
    ),
    ev.PromptRendered(
        **ENVELOPE,
        request=1,
        model="fake-model",
        backend="openai",
        system="You are terse.",
        messages=(
            {"role": "user", "content": "add", "author": "alice"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "add"}]},
        ),
        tools=("add",),
    ),
]


def test_every_kind_has_a_sample():
    assert {type(e) for e in SAMPLES} == set(ev.EVENTS_BY_KIND.values())


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_event_json_round_trip_is_lossless(event):
    text = ev.event_to_json(event)
    data = json.loads(text)
    assert data["kind"] == event.kind
    assert data["seq"] == 7 and data["stream_seq"] == 42
    back = ev.event_from_json(text)
    assert back == event
    assert type(back) is type(event)


def test_events_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLES[4].text = "changed"


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown event kind"):
        ev.event_from_dict({"kind": "nope", "conversation_id": "c"})


def test_profiles():
    assert PROFILES["debug"] == frozenset(ev.EVENTS_BY_KIND)
    assert "text_delta" in PROFILES["chat"] and "reasoning_delta" not in PROFILES["chat"]
    assert "text_delta" not in PROFILES["metrics"]
    assert "turn_ended" in PROFILES["metrics"]
    for profile in PROFILES.values():
        assert "events_lost" in profile


def test_messages_round_trip():
    cm = ChatMessage(
        role="assistant",
        content="x",
        tool_calls=(ToolCall(id="1", name="t", arguments="{}"),),
        message_id=5,
    )
    assert ChatMessage.from_json(cm.to_json()) == cm
    m = Message(
        id=1,
        conversation_id="c",
        kind="tool_result",
        content="r",
        data={"k": [1]},
        is_error=True,
        status="interrupted",
    )
    assert Message.from_dict(json.loads(json.dumps(m.to_dict()))) == m
