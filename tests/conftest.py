"""Shared fixtures: real SQLite files, a real local OpenAI-compatible server.

And how the suite spreads over parallel workers (``make test`` runs pytest-xdist with
``--dist loadgroup``, see docs/development.md): each test goes to whichever worker is
free, except the modules in :data:`XDIST_GROUPS`, whose tests all run on one worker,
one after another.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import PurePosixPath
from typing import Any

import pytest

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.scripted import ScriptedModel

#: Test modules that must not be spread over workers, by group: every test of a group
#: runs on the same worker, one at a time. A module is here when it builds something
#: expensive once per module (a fixture of ``scope="module"``: spread over two workers it
#: would be built twice), or when it writes into the checkout itself (pip builds the
#: checkout in place: ``build/`` and ``*.egg-info``, so two builds at once would trample
#: each other).
XDIST_GROUPS: dict[str, str] = {
    # pip builds of the checkout (in place), and the venv built once for the module (~95 s)
    "test_plain_install": "checkout-build",
    "test_package": "checkout-build",
    # the local model, loaded once for the module
    "test_llamacpp": "test_llamacpp",
    # one server / fake Slack / embedder per module, shared by its tests
    "test_http_openapi": "test_http_openapi",
    "test_import_untrusted": "test_import_untrusted",
    "test_recall": "test_recall",
    "test_security_http": "test_security_http",
    "test_security_slack": "test_security_slack",
    # real `agentik run` processes, started once per module
    "test_conversation_contract": "test_conversation_contract",
    "test_remote_agents": "test_remote_agents",
}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist it is never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU, at most 8. Most tests spend their time waiting
    (on a turn, a server, a subprocess), so one worker per CPU leaves the CPUs idle: on
    2 loaded cores, 4 workers ran the suite in 15 min where 2 were on course for 17.5."""
    return max(1, min(2 * (os.cpu_count() or 1), 8))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``: every test is its own unit of work, except the modules of
    :data:`XDIST_GROUPS`, whose tests form one unit per group (the largest units first).

    xdist's own loadgroup reads ``@pytest.mark.xdist_group`` by renaming the test
    (``item._nodeid``), which pytest 9 no longer has: the markers are silently ignored
    (xdist 3.8). This scheduler groups by module name instead, on the controller.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = PurePosixPath(nodeid.split("::", 1)[0])
            group = XDIST_GROUPS.get(path.stem) if path.parent.name == "tests" else None
            return group or nodeid

    return GroupScheduling(config, log)


def _utf8(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udcff`` escapes (valid UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """On an xdist worker, make the report sendable to the controller.

    xdist sends each report as UTF-8; captured output holding a lone surrogate (a test
    logging undecodable bytes, e.g. test_logs' escaped-secret cases) made the send fail,
    which crashed the worker and ended the whole run. Escaping them changes no outcome.
    """
    report = yield
    if hasattr(item.config, "workerinput"):
        report.sections = [(title, _utf8(content)) for title, content in report.sections]
        if isinstance(report.longrepr, str):
            report.longrepr = _utf8(report.longrepr)
        elif report.longrepr is not None:
            text = str(report.longrepr)
            if _utf8(text) != text:
                report.longrepr = _utf8(text)
    return report


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


@pytest.fixture
async def browser():
    """Headless Chromium (Debian's, driven by Playwright); skipped when it is missing,
    failed under ``CI=true``."""
    from playwright.async_api import async_playwright

    from helpers import CHROMIUM, FLAGS, HAVE_CHROMIUM

    if not HAVE_CHROMIUM:
        message = (
            f"{CHROMIUM} is missing: run `make chromium` (as root) to install Debian's chromium"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()
