"""Real ``agentik run`` processes serving the HTTP API, for the remote-agent tests.

Each bot runs from its own TOML file on a port the kernel picks (``port = 0``);
the test reads where it listens from its start-up line, as an operator would.
"""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentik.core.client import RemoteAgent
from helpers import AGENTIK, clean_env

#: The API token of the bots' ``caller`` token.
TOKEN = "remote-token-0123456789abcdef"


@dataclass
class RunningBot:
    """One ``agentik run`` process; ``log`` collects its stderr."""

    proc: subprocess.Popen[str]
    url: str
    log: list[str] = field(default_factory=list)

    def stop(self) -> int:
        """SIGTERM, then its exit status (killed if it does not stop in 60 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def client(self) -> RemoteAgent:
        """The remote client of this bot, with the ``caller`` token (``async with`` it)."""
        return RemoteAgent(self.url, token=TOKEN)


def bot_config(folder: Path, base_url: str, *, name: str, extra: str = "") -> Path:
    """A bot answering through the OpenAI-compatible server at ``base_url``, serving
    the HTTP API (token ``caller`` from ``REMOTE_TOKEN``) on a free port."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bot.toml"
    path.write_text(
        f"""
[agent]
name = "{name}"
[llm]
base_url = "{base_url}"
model = "fake-model"
[storage]
path = "{folder / "bot.db"}"
[transports.web]
type = "http"
port = 0
tokens = [{{ name = "caller", env = "REMOTE_TOKEN" }}]
{extra}
""",
        encoding="utf-8",
    )
    return path


def start_bot(config: Path, **env: str) -> RunningBot:
    """Start ``agentik run -c config``; return once its HTTP API listens."""
    proc = subprocess.Popen(
        [AGENTIK, "-v", "run", "-c", str(config)],
        cwd=config.parent,
        env=clean_env(REMOTE_TOKEN=TOKEN, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            lines.put(line)
        lines.put("")

    threading.Thread(target=drain, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=120)
        except queue.Empty:
            proc.kill()
            raise AssertionError("agentik run did not start: " + "".join(log)) from None
        if not line:
            raise AssertionError("agentik run exited: " + "".join(log))
        if m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)/agentik", line):
            return RunningBot(proc, m.group(1), log)


@contextlib.contextmanager
def running_bot(config: Path, **env: str) -> Iterator[RunningBot]:
    """``start_bot`` for the block; after it, the bot must stop cleanly (exit status 0,
    no traceback in its log)."""
    bot = start_bot(config, **env)
    try:
        yield bot
    except BaseException:
        bot.stop()
        raise
    assert bot.stop() == 0, "".join(bot.log)
    assert "Traceback" not in "".join(bot.log)
