"""A fake OpenAI-compatible HTTP server that speaks the real wire format.

It lets the real ``openai`` SDK (and our OpenAI backend) run against a local aiohttp
server whose answers are scripted, so tests and benchmarks can exercise streaming,
tool-call deltas, usage chunks, SDK retries, dropped connections and cancellation::

    async with FakeOpenAIServer(model="fake-model") as server:
        server.enqueue(Reply.text("Hello world", chunks=3, usage=(12, 5)))
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
        ...
        assert server.requests[0]["messages"][-1]["content"] == "hi"

Replies are consumed in FIFO order, one per ``POST /v1/chat/completions``; when the
queue is empty ``server.default(body)`` is called (it echoes the last user message).
``GET /v1/models`` lists the one model. ``POST /v1/embeddings`` answers with
deterministic vectors (``server.embed(text)``; by default :func:`hash_embedding`,
a bag of hashed words, so texts sharing words are similar), as floats or as
base64 (``encoding_format``, the SDK's default), and records each request body in
``server.embedding_requests``. The server only ever binds 127.0.0.1.
Like real endpoints it refuses a request body larger than ``max_body_bytes`` with
HTTP 413 (counted in ``server.too_large``). Replies can reproduce quirks real
servers have: a tool-call ``name`` repeated in every delta (``repeat_name``), a
stream that ends with ``[DONE]`` but no ``finish_reason`` (``finish_reason=None``),
and an answer that never ends (``Reply.endless``).

For synchronous code and benchmarks, ``with FakeOpenAIServer.in_thread() as server:``
runs the same server on its own event loop in a daemon thread.  ``python -m
agentik.core.testing.openai_server --port N`` runs a standalone echo server, printing
its base URL on one line and serving until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import re
import signal
import struct
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeOpenAIServer", "Reply"]

_ERROR_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _bad_tool_name(body: Any) -> str | None:
    """OpenAI's error for the first tool whose function name breaks its pattern."""
    tools = body.get("tools") if isinstance(body, dict) else None
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        name = (tool.get("function") or {}).get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            return (
                f"Invalid 'tools[{i}].function.name': string does not match pattern."
                " Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'."
            )
    return None


def hash_embedding(text: str, dim: int = 64) -> list[float]:
    """A deterministic vector for ``text``: each word adds ±1 at a hashed position."""
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        h = hashlib.sha256(word.encode("utf-8")).digest()
        vec[int.from_bytes(h[:4], "little") % dim] += 1.0 if h[4] & 1 else -1.0
    return vec


def _split(text: str, n: int) -> list[str]:
    """Split ``text`` into ``n`` contiguous pieces (some are empty if ``n > len(text)``)."""
    n = max(1, n)
    size, extra = divmod(len(text), n)
    pieces, pos = [], 0
    for i in range(n):
        end = pos + size + (1 if i < extra else 0)
        pieces.append(text[pos:end])
        pos = end
    return pieces


def _text_of(content: Any) -> str:
    """Plain text of a message ``content`` (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _guess_tokens(text: str) -> int:
    return len(text.split())  # crude but deterministic


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(_guess_tokens(_text_of(m.get("content"))) for m in body.get("messages") or [])


def echo_reply(body: dict[str, Any]) -> Reply:
    """Default reply: ``"echo: " + <last user message>`` in 2 chunks, with guessed usage."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    text = "echo: " + (_text_of(users[-1].get("content")) if users else "")
    return Reply.text(text, chunks=2, usage=(_prompt_tokens(body), _guess_tokens(text)))


@dataclass
class Reply:
    """One scripted answer to a chat-completions request.

    ``steps`` are the ``delta`` dicts of the streamed chunks, one chunk each (the first
    chunk also gets ``"role": "assistant"``, the last one ``finish_reason``, unless it
    is None: then no chunk has one, and the stream still ends with ``[DONE]``); a
    non-streaming request gets them merged into one ``chat.completion`` message.
    ``usage`` is ``(prompt_tokens, completion_tokens)`` (guessed when None); ``delay``
    is slept before each chunk; ``drop_after=N`` sends N chunks then aborts the TCP
    connection; ``done=False`` ends the body cleanly but without ``[DONE]``; ``forever``
    repeats the steps (never finishing) until the client goes away. A ``status`` other
    than 200 answers with ``error_body`` and ``headers``.

    ``hold_after=N`` streams N chunks, sets ``held`` and then waits (however long it
    takes) until :meth:`release` is called before sending the rest: a test can act
    while an answer is known to be mid-stream, whatever the machine's speed. Both
    are thread-safe (the server may run in its own thread).
    """

    steps: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = "stop"
    usage: tuple[int, int] | None = None
    delay: float = 0.0
    drop_after: int | None = None
    status: int = 200
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = True
    forever: bool = False
    hold_after: int | None = None
    #: set once ``hold_after`` chunks were written and the stream waits for ``release``
    held: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _released: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(
        default_factory=list, repr=False, compare=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def release(self) -> None:
        """Let a held stream send the rest (thread-safe)."""
        self._released.set()
        self._notify()

    async def wait_held(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until the stream has sent its ``hold_after`` chunks and is holding."""
        async with asyncio.timeout(timeout):
            await self._wait(self.held)

    def _notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)

    async def _wait(self, flag: threading.Event) -> None:
        """Wait on any loop, in any thread, until ``flag`` is set."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.append(entry)
        try:
            while not flag.is_set():
                await entry[1].wait()
                entry[1].clear()
        finally:
            with self._lock:
                self._waiters.remove(entry)

    @classmethod
    def text(
        cls,
        text: str,
        *,
        chunks: int = 1,
        usage: tuple[int, int] | None = None,
        delay: float = 0.0,
        drop_after: int | None = None,
        reasoning: str | None = None,
        finish_reason: str | None = "stop",
        hold_after: int | None = None,
    ) -> Reply:
        """Text split into ``chunks`` content deltas, preceded (if given) by ``reasoning``
        split into ``chunks`` ``reasoning_content`` deltas (llama.cpp/DeepSeek style)."""
        steps = [{"reasoning_content": p} for p in _split(reasoning, chunks)] if reasoning else []
        steps += [{"content": p} for p in _split(text, chunks)]
        return cls(
            steps=steps,
            usage=usage,
            delay=delay,
            drop_after=drop_after,
            finish_reason=finish_reason,
            hold_after=hold_after,
        )

    @classmethod
    def endless(cls, piece: str = "la ", *, delay: float = 0.0) -> Reply:
        """An answer that never ends: ``piece`` as a content delta, again and again,
        until the client closes the stream (a model stuck in a loop)."""
        return cls(steps=[{"content": piece}], delay=delay, forever=True)

    @classmethod
    def tool_calls(
        cls,
        calls: list[tuple[str, str, str]],
        *,
        split: int = 1,
        text: str | None = None,
        usage: tuple[int, int] | None = None,
        delay: float = 0.0,
        drop_after: int | None = None,
        repeat_name: bool = False,
        finish_reason: str | None = "tool_calls",
    ) -> Reply:
        """Tool calls ``(id, name, arguments_json)`` with finish_reason ``tool_calls``.

        An optional ``text`` content chunk comes first. Each call then gets a header chunk
        (index, id, type, function.name, empty arguments) and its arguments split into
        ``split`` chunks; the calls' chunks are interleaved round-robin. With
        ``repeat_name`` every argument chunk carries the id and the whole name again
        (as some servers do).
        """
        steps: list[dict[str, Any]] = [{"content": text}] if text else []
        for i, (call_id, name, _) in enumerate(calls):
            fn = {"name": name, "arguments": ""}
            steps.append(
                {"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": fn}]}
            )
        pieces = [_split(args, split) for _, _, args in calls]
        for r in range(max(1, split)):
            for i, parts in enumerate(pieces):
                delta: dict[str, Any] = {"index": i, "function": {"arguments": parts[r]}}
                if repeat_name:
                    call_id, name, _ = calls[i]
                    delta = {
                        "index": i,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": parts[r]},
                    }
                steps.append({"tool_calls": [delta]})
        return cls(
            steps=steps,
            finish_reason=finish_reason,
            usage=usage,
            delay=delay,
            drop_after=drop_after,
        )

    @classmethod
    def error(
        cls,
        status: int,
        message: str | None = None,
        *,
        error_type: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> Reply:
        """An OpenAI-style JSON error ``{"error": {message, type, param, code}}``.

        ``retry_after`` (seconds) sets ``Retry-After`` plus ``retry-after-ms`` (which the
        SDK prefers). Note the SDK ignores a zero delay and uses its own backoff (~0.5s).
        """
        fallback = ("server_error" if status >= 500 else "invalid_request_error", None)
        default_type, default_code = _ERROR_TYPES.get(status, fallback)
        body = {
            "error": {
                "message": message or f"Fake error {status}",
                "param": None,
                "type": error_type or default_type,
                "code": code if code is not None else default_code,
            }
        }
        headers = {}
        if retry_after is not None:
            secs = int(retry_after) if float(retry_after).is_integer() else retry_after
            headers = {"Retry-After": str(secs), "retry-after-ms": str(int(retry_after * 1000))}
        return cls(status=status, error_body=body, headers=headers)


def _merge(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge streamed deltas into one non-streaming ``message``."""
    content: list[str] | None = None
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for delta in steps:
        if "content" in delta:
            content = (content or []) + [delta["content"] or ""]
        if delta.get("reasoning_content"):
            reasoning.append(delta["reasoning_content"])
        for tc in delta.get("tool_calls") or []:
            call = calls.setdefault(
                tc["index"],
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["function"]["name"] = fn.get("name") or call["function"]["name"]
            call["function"]["arguments"] += fn.get("arguments") or ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if content is None else "".join(content),
        "refusal": None,
        "annotations": [],
    }
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


class FakeOpenAIServer:
    """Scripted OpenAI-compatible server on 127.0.0.1.

    Use ``async with`` on a running loop, or ``with FakeOpenAIServer.in_thread()`` to run
    it in a background thread. ``requests``/``request_headers`` (header names lower-cased)
    record every chat-completions call; ``disconnects`` counts streams the client closed
    before the server finished sending.
    """

    def __init__(
        self, model: str = "fake-model", *, port: int = 0, max_body_bytes: int = 1024 * 1024
    ) -> None:
        self.model = model
        self.port = port
        #: Request bodies larger than this are refused with HTTP 413 (like real
        #: endpoints); ``too_large`` counts them (they are not in ``requests``).
        self.max_body_bytes = max_body_bytes
        self.too_large = 0
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.disconnects = 0
        self.default: Callable[[dict[str, Any]], Reply] = echo_reply
        #: The vector ``/v1/embeddings`` gives a text.
        self.embed: Callable[[str], list[float]] = hash_embedding
        self.embedding_requests: list[dict[str, Any]] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._awaited = 0  # disconnects already consumed by wait_disconnect()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._active: set[asyncio.Transport] = set()  # in-flight streams
        self._closing = False
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._thread_error: BaseException | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (valid once started)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order (thread-safe)."""
        with self._lock:
            self._queue.extend(replies)

    async def start(self) -> None:
        """Bind and start serving on the running loop."""
        # The body limit is ours (see _chat): aiohttp's own would answer before
        # the client finished sending, which a client sees as a broken connection.
        app = web.Application(client_max_size=1 << 40)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        # handler_cancellation: aiohttp cancels a handler whose client went away.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._loop = asyncio.get_running_loop()
        self._closing = False

    async def close(self) -> None:
        """Stop serving; in-flight streams are aborted (not counted as disconnects)."""
        self._closing = True
        for transport in list(self._active):
            transport.abort()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @classmethod
    def in_thread(
        cls, model: str = "fake-model", *, port: int = 0, max_body_bytes: int = 1024 * 1024
    ) -> FakeOpenAIServer:
        """A server to use as a *sync* context manager: it then runs on its own event loop
        in a daemon thread. All attributes may be used from any thread; sync code waits
        for disconnects with ``wait_disconnect_sync``."""
        return cls(model, port=port, max_body_bytes=max_body_bytes)

    def __enter__(self) -> FakeOpenAIServer:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._thread_main(ready)),
            name="FakeOpenAIServer",
            daemon=True,
        )
        self._thread.start()
        ready.wait()
        if self._thread_error is not None:
            raise self._thread_error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    async def _thread_main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        try:
            await self.start()
        except BaseException as exc:
            self._thread_error = exc
            return
        finally:
            ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.close()

    def _note_disconnect(self) -> None:
        with self._cond:
            self.disconnects += 1
        self._wake()

    def _wake(self) -> None:
        with self._cond:
            waiters = list(self._waiters)
            self._cond.notify_all()
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # waiter's loop already closed
                loop.call_soon_threadsafe(event.set)

    async def wait_disconnect(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until ``disconnects`` exceeds the count seen by the previous successful
        call (so a disconnect that already happened returns at once); each call consumes
        one. Works from any event loop. Raises ``TimeoutError`` after ``timeout``."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            target = self._awaited + 1
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    entry[1].clear()
                    with self._lock:
                        if self.disconnects >= target:
                            self._awaited = target
                            return
                    await entry[1].wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)

    async def wait_requests(self, count: int = 1, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until at least ``count`` chat requests have arrived."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                while len(self.requests) < count:
                    entry[1].clear()
                    if len(self.requests) >= count:
                        break
                    await entry[1].wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)

    def wait_disconnect_sync(self, timeout: float = 60.0) -> None:
        """Blocking twin of :meth:`wait_disconnect`, for threads (e.g. ``in_thread``)."""
        with self._cond:
            target = self._awaited + 1
            if not self._cond.wait_for(lambda: self.disconnects >= target, timeout):
                raise TimeoutError(f"no client disconnect within {timeout}s")
            self._awaited = target

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "agentik"}
        return web.json_response({"object": "list", "data": [model]})

    async def _embeddings(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response(Reply.error(400, "Invalid JSON body").error_body, status=400)
        self.embedding_requests.append(body)
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts) or not texts:
            error = Reply.error(400, "input must be a string or a non-empty list of strings")
            return web.json_response(error.error_body, status=400)
        data = []
        for i, text in enumerate(texts):
            vec = [float(x) for x in self.embed(text)]
            if body.get("encoding_format") == "base64":
                raw = struct.pack(f"<{len(vec)}f", *vec)
                emb: Any = base64.b64encode(raw).decode("ascii")
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = sum(_guess_tokens(t) for t in texts)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model") or self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()  # all of it, then judge (as real servers answer)
        if len(raw) > self.max_body_bytes:
            with self._lock:
                self.too_large += 1
            message = (
                f"Request too large: {len(raw)} bytes; the limit is {self.max_body_bytes} bytes"
            )
            error = Reply.error(413, message, code="request_too_large")
            return web.json_response(error.error_body, status=413)
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response(Reply.error(400, "Invalid JSON body").error_body, status=400)
        bad = _bad_tool_name(body)
        if bad is not None:  # as OpenAI refuses it: ^[a-zA-Z0-9_-]{1,64}$
            return web.json_response(Reply.error(400, bad).error_body, status=400)
        self.requests.append(body)
        self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
        self._wake()
        with self._lock:
            reply = self._queue.popleft() if self._queue else None
        if reply is None:
            reply = self.default(body)
        if reply.status != 200:
            return web.json_response(reply.error_body, status=reply.status, headers=reply.headers)
        usage = reply.usage or (_prompt_tokens(body), len(reply.steps))
        usage_obj = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": None,
        }
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, reply, head, usage_obj if include_usage else None)
        if reply.drop_after is not None:  # abort before sending anything
            if request.transport is not None:
                request.transport.abort()
            return web.Response()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        choice = {
            "index": 0,
            "message": _merge(reply.steps),
            "logprobs": None,
            "finish_reason": reply.finish_reason,
        }
        full = {**head, "object": "chat.completion", "choices": [choice], "usage": usage_obj}
        return web.json_response(full, headers=reply.headers)

    async def _stream(
        self, request: web.Request, reply: Reply, head: dict[str, Any], usage: dict[str, Any] | None
    ) -> web.StreamResponse:
        events: Iterable[dict[str, Any]] = (
            self._endless(reply, head) if reply.forever else self._chunks(reply, head, usage)
        )
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **reply.headers,
            }
        )
        transport = request.transport
        if transport is not None:
            self._active.add(transport)
        try:
            await resp.prepare(request)
            for i, event in enumerate(events):
                if reply.drop_after is not None and i >= reply.drop_after:
                    return await self._drop(request, resp)
                if reply.hold_after is not None and i == reply.hold_after:
                    await self._hold(request, reply)
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                # write() waits while the socket's buffer is full, so a client
                # that stops reading also stops an endless reply.
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if reply.drop_after is not None:
                return await self._drop(request, resp)  # everything but [DONE]
            if reply.done:
                await resp.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the peer goes away (handler_cancellation).
            if not self._closing:
                self._note_disconnect()
            raise
        except ConnectionResetError:
            # A write to an already-dead transport; aiohttp's write_eof handles the rest.
            if not self._closing:
                self._note_disconnect()
        finally:
            self._active.discard(transport)
        return resp

    @staticmethod
    def _chunks(
        reply: Reply, head: dict[str, Any], usage: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` events of ``reply``, usage last when asked for."""
        steps = reply.steps or [{"content": ""}]
        events: list[dict[str, Any]] = []
        for i, delta in enumerate(steps):
            last = i == len(steps) - 1
            choice = {
                "index": 0,
                "delta": {"role": "assistant", **delta} if i == 0 else delta,
                "logprobs": None,
                "finish_reason": reply.finish_reason if last else None,
            }
            events.append({**head, "object": "chat.completion.chunk", "choices": [choice]})
        if usage is not None:
            for event in events:
                event["usage"] = None
            events.append(
                {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            )
        return events

    @staticmethod
    def _endless(reply: Reply, head: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The reply's steps again and again, never a ``finish_reason`` (``Reply.forever``)."""
        steps = reply.steps or [{"content": "la "}]
        first = True
        while True:
            for delta in steps:
                choice = {
                    "index": 0,
                    "delta": {"role": "assistant", **delta} if first else delta,
                    "logprobs": None,
                    "finish_reason": None,
                }
                first = False
                yield {**head, "object": "chat.completion.chunk", "choices": [choice]}

    async def _hold(self, request: web.Request, reply: Reply) -> None:
        """Wait (cancellable: the client may go away) until the test releases ``reply``."""
        transport = request.transport
        for _ in range(400):  # let what was written reach the socket (bounded)
            if transport is None or not transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.005)
        reply.held.set()
        reply._notify()
        await reply._wait(reply._released)

    async def _drop(self, request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Abort the connection mid-body (no ``[DONE]``, no chunked terminator)."""
        transport = request.transport
        for _ in range(400):  # let already-written chunks reach the socket (bounded)
            if transport is None or not transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.005)
        if transport is not None:
            transport.abort()
        return resp


async def _serve_cli(model: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with FakeOpenAIServer(model, port=port) as server:
        print(server.base_url, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m agentik.core.testing.openai_server``."""
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible echo server.")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument("--model", default="fake-model", help="model name to report")
    args = parser.parse_args(argv)
    asyncio.run(_serve_cli(args.model, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
