"""The terminal transport: chat with the agent on stdin/stdout.

Two modes, chosen from whether stdin is a terminal (``interactive = "auto"``):

* **interactive** — a prompt; answers stream as they are written; Ctrl-C
  interrupts the running answer; Ctrl-C when idle, a second Ctrl-C within two
  seconds, or Ctrl-D exits cleanly.
* **piped** — one message per input line; each full answer is printed; at
  end of input the transport finishes after the last answer, so the bot is
  scriptable (``echo hi | agentik chat -c config.toml``).  A command line
  (``/new``, ``/status``…) waits until the lines before it were answered,
  as a script expects; ``/stop`` acts at once.  SIGINT still interrupts the
  running answer.

The channel is ``stdio:<channel>`` and persistent: restart the bot and the
conversation continues.  Input is UTF-8 (invalid bytes are replaced); a
line longer than ``max_line_bytes`` is refused with a message.  Answers and
error lines go to stdout; notices (tool calls, interruptions) go to stdout
when interactive and to stderr when piped, so piped output is just answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
import sys
import threading
import time
from typing import Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

from agentik.core.hookspecs import hookimpl
from agentik.transports.base import (
    AgentHost,
    ChannelCaps,
    IncomingMessage,
    MessageSink,
    OutgoingMessage,
    Transport,
    host_of,
)

__all__ = ["StdioSettings", "StdioTransport"]


class StdioSettings(BaseModel):
    """Keys of a ``type = "stdio"`` transport table."""

    model_config = ConfigDict(extra="forbid")

    #: Channel name: the conversation is bound to ``stdio:<channel>``.
    channel: str = "local"
    #: Your name as the model sees it (default: the login name).
    user: str | None = None
    #: ``auto`` (interactive when stdin is a terminal), ``true`` or ``false``.
    interactive: Literal["auto", True, False] = "auto"
    #: Longest accepted input line, in bytes.
    max_line_bytes: int = Field(65_536, ge=64)
    #: The interactive prompt.
    prompt: str = "> "


class _LineSplitter:
    """Cuts a byte stream into lines; a line over ``limit`` becomes a marker.

    ``emit`` receives each complete line (without its newline), a
    ``b"\\x00TOOLONG:<size>"`` marker for a line that was too long (its
    bytes are dropped as they arrive, never buffered), and ``None`` at end
    of input.
    """

    def __init__(self, limit: int, emit: Any) -> None:
        self.limit = limit
        self.emit = emit
        self.buffer = b""
        self.dropping = 0  # bytes of an overlong line seen so far

    def feed(self, data: bytes) -> None:
        if not data:
            if self.dropping:
                self.emit(b"\x00TOOLONG:%d" % self.dropping)
            elif self.buffer:
                self.emit(self.buffer)
            self.buffer = b""
            self.emit(None)
            return
        while data:
            newline = data.find(b"\n")
            chunk, data = (data, b"") if newline < 0 else (data[:newline], data[newline + 1 :])
            if self.dropping:
                self.dropping += len(chunk) + (newline >= 0)
            elif len(self.buffer) + len(chunk) > self.limit:
                self.dropping = len(self.buffer) + len(chunk) + (newline >= 0)
                self.buffer = b""
            else:
                self.buffer += chunk
            if newline >= 0:
                if self.dropping:
                    self.emit(b"\x00TOOLONG:%d" % self.dropping)
                    self.dropping = 0
                else:
                    self.emit(self.buffer)
                self.buffer = b""


def _login() -> str:
    with contextlib.suppress(Exception):
        return getpass.getuser()
    return "user"


class StdioTransport(Transport):
    """The terminal transport (see the module docstring)."""

    type = "stdio"
    default_command_prefix = "/"
    settings_model = StdioSettings
    options: StdioSettings

    def __init__(
        self,
        *,
        name: str,
        settings: dict[str, Any] | None = None,
        stdin: Any = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        super().__init__(name=name, settings=settings)
        self._stdin = stdin if stdin is not None else sys.stdin.buffer
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        mode = self.options.interactive
        self.interactive = bool(os.isatty(self._stdin.fileno())) if mode == "auto" else bool(mode)
        # A form is asked one question after another (a prompt each), answered by lines.
        self.caps = ChannelCaps(
            streaming="deltas" if self.interactive else "message", forms="prompts"
        )
        self.channel_key = f"stdio:{self.options.channel}"
        self.user = self.options.user or _login()
        #: The host (:class:`~agentik.transports.base.AgentHost`) given at :meth:`start`.
        self._sink: AgentHost | None = None
        self._last_sigint = 0.0
        self._streaming = False
        self._sigint_installed = False

    # -- lifecycle ----------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        self._sink = host_of(sink)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
            self._sigint_installed = True
        self.spawn(self._read_loop(), name=f"agentik-stdio:{self.name}")
        if self.interactive:
            self._write(
                f"agentik — chatting on {self.channel_key} as {self.user}. "
                f"{self.default_command_prefix}help for commands, Ctrl-C stops an answer, "
                "Ctrl-D quits.\n",
                err=False,
            )
            self._prompt()

    async def serve(self) -> None:
        await self.closed.wait()

    async def aclose(self) -> None:
        if self._sigint_installed:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
            self._sigint_installed = False
        await self.cancel_tasks()
        self.closed.set()

    # -- input ---------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        splitter = _LineSplitter(self.options.max_line_bytes, queue.put_nowait)
        fd = self._stdin.fileno()
        watching = False
        try:
            # Terminals and pipes: the event loop watches the descriptor and
            # reads what is there (no thread, no change to its blocking mode).
            loop.add_reader(fd, self._on_readable, fd, splitter)
            watching = True
        except (OSError, ValueError, NotImplementedError):
            # Regular files cannot be watched: a daemon thread reads them.
            # It uses os.read, so it holds no lock that could block exit.
            threading.Thread(
                target=self._read_blocking,
                args=(fd, loop, splitter),
                name="agentik-stdin",
                daemon=True,
            ).start()
        try:
            while True:
                raw = await queue.get()
                if raw is None:
                    break
                await self._line(raw)
            # End of input: finish the answers already asked for, then stop.
            await self._flush()
            if self.interactive:
                self._write("\n", err=False)
        finally:
            if watching:
                loop.remove_reader(fd)
            self.closed.set()

    async def _flush(self) -> None:
        """Wait until every answer asked for on this channel has been written."""
        if self._sink is not None:
            await self._sink.flush(self.channel_key)

    def _command(self, text: str) -> str | None:
        """The command word of ``text`` (``"new"`` for ``/new``), or ``None``."""
        prefix = (
            self._sink.options_for(self).command_prefix
            if self._sink is not None
            else self.default_command_prefix
        )
        text = text.strip()
        if not prefix or not text.startswith(prefix):  # no prefix: commands are off
            return None
        word = text[len(prefix) :].split(maxsplit=1)
        return word[0].lower() if word else None

    def _on_readable(self, fd: int, splitter: _LineSplitter) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(fd)
        splitter.feed(data)

    def _read_blocking(
        self, fd: int, loop: asyncio.AbstractEventLoop, splitter: _LineSplitter
    ) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(splitter.feed, data)
            if not data:
                return

    async def _line(self, raw: bytes) -> None:
        if raw.startswith(b"\x00TOOLONG:"):
            size = int(raw.split(b":", 1)[1])
            self._write(
                f"error: input line too long ({size} bytes; the limit is "
                f"{self.options.max_line_bytes}): ignored\n",
                err=False,
            )
            self._prompt()
            return
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not text.strip():
            self._prompt()
            return
        assert self._sink is not None
        if not self.interactive and self._command(text) not in (None, "stop"):
            # Piped input is a script: a command acts after the lines before it
            # were answered, so `hello` then `/new` answers hello, then resets.
            # Only `stop` acts at once: it is there to cut the running answer.
            await self._flush()
        await self._sink.handle(
            IncomingMessage(
                channel_key=self.channel_key,
                text=text,
                author_id=self.user,
                author_name=self.user,
                direct=True,
                addressed=True,
            ),
            self,
        )

    def _on_sigint(self) -> None:
        now = time.monotonic()
        twice = now - self._last_sigint < 2.0
        self._last_sigint = now
        sink = self._sink
        if sink is not None and sink.busy(self.channel_key) and not twice:
            self.spawn(sink.interrupt(self.channel_key))
            return
        # Idle, or pressed twice: leave.
        self.closed.set()

    # -- output ----------------------------------------------------------------------------
    def _write(self, text: str, *, err: bool) -> None:
        stream = self._err if err else self._out
        try:
            stream.write(text)
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass

    def _prompt(self) -> None:
        if self.interactive and not self._streaming:
            self._write(self.options.prompt, err=False)

    def owns(self, channel_key: str) -> bool:
        return channel_key == self.channel_key

    async def send(self, message: OutgoingMessage) -> None:
        kind = message.kind
        if kind == "delta":
            self._streaming = True
            self._write(message.text, err=False)
        elif kind == "end":
            if self._streaming:
                self._write("\n", err=False)
            self._streaming = False
            self._prompt()
        elif kind == "answer":
            self._write(message.text + "\n", err=False)
            self._prompt()
        elif kind == "notice":
            if self._streaming:
                self._write("\n", err=False)
                self._streaming = False
            self._write(f"· {message.text}\n", err=not self.interactive)
        else:  # error, command
            if self._streaming:
                self._write("\n", err=False)
                self._streaming = False
            self._write(message.text + "\n", err=False)
            self._prompt()


@hookimpl
def register_transports(register: Any) -> None:
    register("stdio", StdioTransport)
