"""Shared fixtures: real SQLite files, a real local OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.scripted import ScriptedModel


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "agentik.db")


@pytest.fixture
async def openai_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(model="fake-model") as server:
        yield server


@pytest.fixture
def scripted() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def agent(scripted, db_path) -> AsyncIterator[Agent]:
    async with Agent(llm=scripted, store=SQLiteStore(db_path)) as a:
        yield a


@pytest.fixture
async def openai_agent(openai_server, db_path) -> AsyncIterator[Agent]:
    llm = OpenAIBackend(
        model="fake-model",
        base_url=openai_server.base_url,
        api_key="sk-test-secret",
        max_retries=2,
        timeout=60,
    )
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as a:
        yield a
