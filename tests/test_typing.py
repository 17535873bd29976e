"""Typed events and backend capabilities, and a type checker that sees the package.

``kind`` is a per-class ``Literal`` field, so ``Event`` is a discriminated union
a type checker narrows; the installed package is typed (``py.typed``) and an
editable install is a plain path a type checker follows.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator

import pytest

from agentik.core import Agent, LLMBackend, SQLiteStore
from agentik.core import events as ev
from agentik.core.llm.base import FinishItem, LLMRequest, StreamItem, TextChunk
from agentik.core.streamprofiles import PROFILES


def _required(cls: type[ev.EventBase]) -> dict[str, object]:
    values = {"text": "t", "call_id": "1", "name": "n", "child_run_id": "r2", "message": "m",
              "approval_id": "3f2", "decision": "approved", "question_id": 1,
              "question": "q?", "outcome": "answered", "progress": 0.5}  # fmt: skip
    return {
        f.name: values[f.name]
        for f in dataclasses.fields(cls)
        if f.init
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name != "conversation_id"
    }


def test_each_event_class_has_its_own_fixed_kind():
    events = [cls(conversation_id="c", **_required(cls)) for cls in ev.EVENT_TYPES]
    kinds = [ev.event_to_dict(e)["kind"] for e in events]
    assert kinds == [e.kind for e in events]
    assert len(set(kinds)) == len(kinds) == len(ev.EVENT_TYPES)
    assert set(kinds) == PROFILES["debug"]
    # The kind belongs to the class: it is not a constructor argument.
    with pytest.raises(TypeError):
        ev.TextDelta(conversation_id="c", text="x", kind="error")


def test_serialised_form_keeps_kind_last():
    event = ev.TextDelta(conversation_id="c", run_id="r", seq=1, stream_seq=2, ts=3.0, text="hi")
    assert ev.event_to_json(event) == (
        '{"conversation_id":"c","run_id":"r","parent_run_id":null,"seq":1,'
        '"stream_seq":2,"ts":3.0,"text":"hi","kind":"text_delta"}'
    )
    # A kind in the input is what picks the class; it is never passed on as a field.
    data = json.loads(ev.event_to_json(event))
    assert ev.event_from_dict(data) == event


class _ImageModel(LLMBackend):
    """A backend that declares image input, and nothing else optional."""

    name = "images"
    supports_image_in = True

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        yield TextChunk("a picture")
        yield FinishItem("stop")


async def test_conversation_capabilities_come_from_the_backend_declaration(tmp_path):
    async with Agent(llm=_ImageModel(), store=SQLiteStore(str(tmp_path / "a.db"))) as agent:
        conv = await agent.create_conversation(temp=True)
        assert conv.capabilities.image_in is True
        assert conv.capabilities.image_out is False
    # The declared defaults: a backend that says nothing supports neither.
    assert LLMBackend.supports_image_in is False and LLMBackend.supports_image_out is False
    assert LLMBackend.context_window is None


PLUGIN_OK = """
    from agentik.core.events import Event, event_from_json


    def text_of(event: Event) -> str:
        if event.kind == "text_delta":
            return event.text
        if event.kind == "tool_call_ended":
            return event.result
        return ""


    print(text_of(event_from_json('{"kind": "text_delta", "conversation_id": "c", "text": "x"}')))
"""

PLUGIN_WRONG = """
    from agentik.core.events import Event


    def text_of(event: Event) -> str:
        return event.text  # not every event has text: the checker must say so
"""


@pytest.mark.timeout(600)
def test_a_plugin_authors_type_checker_sees_the_installed_package(tmp_path):
    """mypy, run outside the repository against this environment (an editable
    install under ``make``), finds ``agentik`` typed and narrows ``Event``."""
    (tmp_path / "plugin_ok.py").write_text(textwrap.dedent(PLUGIN_OK))
    (tmp_path / "plugin_wrong.py").write_text(textwrap.dedent(PLUGIN_WRONG))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            sys.executable,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "plugin_ok.py",
            "plugin_wrong.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = run.stdout.splitlines()
    # Nothing about a missing module or a missing py.typed: the package is found and typed.
    assert not [line for line in lines if "import" in line], run.stdout + run.stderr
    # The narrowed accesses pass; the unnarrowed one is an error naming the classes without text.
    assert not [line for line in lines if line.startswith("plugin_ok.py")], run.stdout
    wrong = [line for line in lines if line.startswith("plugin_wrong.py:") and "error" in line]
    assert any('"TurnStarted"' in line and "text" in line for line in wrong), run.stdout
    assert not any('"TextDelta"' in line for line in wrong), run.stdout
    assert run.returncode == 1
