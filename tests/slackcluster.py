"""Slack's HTTP mode on two workers: the rig of tests/test_cluster_slack_http.py and
tests/test_slack_ack.py.

:func:`slack_http_workers` opens the Slack fake (tests/fakeslack.py; it knows the user
``U1``, ``alice``), starts two ``agentik run`` workers ``a`` and ``b`` on one PostgreSQL
database (tests/cluster.py), each serving Slack's Events API on its own port as a load
balancer spreads it, and waits until both answer Slack's ``url_verification``.  It yields
a :class:`SlackCrew`, which POSTs events to either worker signed with the app's signing
secret, as Slack signs them.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from cluster import Worker, until, worker_config, workers

from fakeslack import FakeSlack
from rigs import bot_texts

#: The environment variable the workers read the database's DSN from.
DSN_ENV = "AGENTIK_TEST_SLACK_HTTP_DSN"


class SlackCrew:
    """Workers ``a`` and ``b`` serving Slack's Events API, the Slack fake, and a way to
    POST events to either worker."""

    def __init__(self, slack: FakeSlack, crew: list[Worker], http: httpx.AsyncClient) -> None:
        self.slack = slack
        self.crew = crew
        self.a, self.b = crew
        self.http = http

    async def post(self, worker: Worker, payload: dict[str, Any], *, retry: int = 0) -> int:
        """POST ``payload`` to ``worker``'s Events API, signed; its HTTP status, or 0 when
        the connection failed (a worker killed while it was answering).  ``retry``: sent as
        Slack's retry number ``retry`` (``X-Slack-Retry-Num``, reason ``http_timeout``)."""
        body = json.dumps(payload).encode()
        headers = {**self.slack.sign(body), "Content-Type": "application/json"}
        if retry:
            headers["X-Slack-Retry-Num"] = str(retry)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        url = f"http://127.0.0.1:{worker.port}/slack/events"
        try:
            r = await self.http.post(url, content=body, headers=headers)
        except httpx.TransportError:
            return 0
        return r.status_code

    async def serving(self, worker: Worker) -> bool:
        """Whether ``worker`` answers Slack's ``url_verification`` challenge."""
        challenge = {"type": "url_verification", "token": "t", "challenge": "c"}
        return await self.post(worker, challenge) == 200

    def texts(self, channel: str) -> list[str]:
        """The bot's messages in ``channel`` (threads too), oldest first."""
        return bot_texts(self.slack, channel)

    def thread(self, channel: str, thread_ts: str) -> list[str]:
        """The bot's messages in the thread ``thread_ts`` of ``channel``, oldest first."""
        slack = self.slack
        return [
            m["text"]
            for (ch, _), m in sorted(slack.messages.items(), key=lambda kv: kv[0][1])
            if ch == channel and m.get("thread_ts") == thread_ts
            and m.get("user") == slack.bot_user_id
        ]  # fmt: skip


@contextlib.asynccontextmanager
async def slack_http_workers(
    tmp_path: Path,
    dsn: str,
    openai_url: str,
    *,
    extra: str = "",
    stop: int = signal.SIGKILL,
) -> AsyncIterator[SlackCrew]:
    """The Slack fake and workers ``a`` and ``b`` (in ``tmp_path/a``, ``tmp_path/b``) on
    ``dsn``, the model at ``openai_url``: :func:`cluster.worker_config` with
    ``[cluster] poll_seconds`` 2 (and its 3 s leases: an event's claim holds that long),
    log level ``info``, ``extra`` before the ``[cluster]`` section and Slack's HTTP mode
    (``streaming = "edit"``) on a port of each worker's own.  Yielded once both answer
    Slack's ``url_verification``; the workers are stopped with ``stop`` on the way out,
    then the fake is closed."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")

        def config(name: str, port: int) -> str:
            transport = f"""
[transports.slack]
type = "slack"
mode = "http"
bot_token = "{slack.bot_token}"
signing_secret = "${{SLACK_SIGNING_SECRET}}"
api_url = "{slack.api_url}"
http_port = {port}
streaming = "edit"
"""
            logging = '[logging]\nlevel = "info"\n'
            return worker_config(name, openai_url, dsn_env=DSN_ENV, poll=2.0, health=False,
                                 before_cluster=logging + extra, extra=transport)  # fmt: skip

        env = {"SLACK_SIGNING_SECRET": slack.signing_secret}
        async with (
            workers(["a", "b"], tmp_path, dsn, config, dsn_env=DSN_ENV, env=env,
                    stop=stop) as crew,
            httpx.AsyncClient(timeout=60) as http,
        ):  # fmt: skip
            rig = SlackCrew(slack, crew, http)
            for w in crew:
                await until(partial(rig.serving, w), f"{w.folder.name}'s Slack Events API")
            yield rig
