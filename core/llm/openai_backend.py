"""The ``openai`` backend: any OpenAI-compatible chat-completions endpoint.

Uses the official ``openai`` SDK (``AsyncOpenAI``): streaming with
``stream_options.include_usage``, tool-call deltas accumulated per index,
reasoning deltas (``reasoning_content`` or ``reasoning``), retries with
exponential backoff on 429/5xx/connection errors (the SDK's own, honouring
``Retry-After``), a timeout that also bounds the wait for each next chunk,
and cancellation that closes the HTTP response.

This module is also the built-in plugin that registers the backend, through
the same hook a third-party backend uses.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import (
    ConfigError,
    ContextTooLong,
    LLMConnectionError,
    LLMError,
    LLMStatusError,
    LLMTimeout,
)
from ..hookspecs import hookimpl
from ..messages import ChatMessage, ImagePart, ToolCall, Usage
from ..settings import SETTINGS, Blank, BlankSecret
from .base import (
    FinishItem,
    LLMBackend,
    LLMRequest,
    ReasoningChunk,
    StreamItem,
    TextChunk,
    ToolCallItem,
    UsageItem,
)

if TYPE_CHECKING:
    # The SDK takes about half a second to import: it is imported when an
    # OpenAIBackend is built, not with ``agentik.core`` (see tests/test_imports.py).
    import openai
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIBackend", "OpenAISettings"]

_NAME_RE = re.compile(r"[^A-Za-z0-9_-]+")
#: How servers say a request is longer than the model's context (OpenAI's
#: ``context_length_exceeded`` code, and the wording of vLLM, llama.cpp's
#: server, Ollama and others, which often send no code).
_TOO_LONG_CODES = {"context_length_exceeded", "string_above_max_length", "request_too_large"}
_TOO_LONG_RE = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|too many tokens|prompt is too long"
    r"|exceeds? the (model's )?(context|maximum)|request too large",
    re.IGNORECASE,
)
AuthorMode = Literal["name", "prefix", "none"]


class OpenAISettings(BaseModel):
    """The ``openai`` backend's keys in ``[llm]`` (see :class:`OpenAIBackend`)."""

    model_config = SETTINGS | ConfigDict(frozen=True)

    #: The model name, e.g. ``llama3.2`` (Ollama) or ``gpt-4o-mini``; unset: ``$OPENAI_MODEL``.
    model: Blank = None
    #: The endpoint; unset: ``$OPENAI_BASE_URL``, else the SDK's default.
    base_url: Blank = None
    #: The key; unset: ``$OPENAI_API_KEY`` (local servers need none).
    api_key: BlankSecret = None
    #: Seconds to connect and to wait for each next piece of the answer.
    timeout: float = Field(60.0, gt=0)
    #: Seconds to connect (at most ``timeout``).
    connect_timeout: float = Field(10.0, gt=0)
    #: Retries (with backoff) on 429, 5xx and connection errors.
    max_retries: int = Field(2, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, gt=0)
    author_mode: AuthorMode = "prefix"
    #: Extra fields of every request body (server-specific options).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    #: Extra HTTP headers of every request.
    default_headers: dict[str, str] = Field(default_factory=dict)
    #: The model takes images (vision): attached images go to it as image parts
    #: (``data:`` URLs); off: as a one-line description (``[image: cat.png, 1.2 MB]``).
    image_in: bool = False


_DEFAULTS = OpenAISettings()


log = logging.getLogger(__name__)

#: HTTP statuses a server refusing a request's shape answers with (llama.cpp's
#: server says 500 for some invalid requests).
_REFUSED = frozenset({400, 422, 500, 501})


@cache
def _chunk_stream() -> type[Any]:
    """The SDK's chunk stream class, noting whether the server ended it with ``[DONE]``.

    Some servers end a stream with ``[DONE]`` but never send a
    ``finish_reason``: that is a normal end; a stream that stops with neither
    was cut off.  Its chunk type is ``object``, so the SDK yields each chunk as
    the plain JSON dict it decoded (still raising ``APIError`` for an ``error``
    chunk) instead of building a ``ChatCompletionChunk`` model of it, which was
    most of a turn's CPU (about 0.1 ms a chunk).  Made on first use, so that
    importing this module does not import the SDK.
    """
    import openai

    class _ChunkStream(openai.AsyncStream[object]):
        done = False

        def _iter_events(self) -> AsyncIterator[Any]:
            return _Events(self, super()._iter_events())

    return _ChunkStream


class _Events:
    """The SDK's server-sent events, noting ``[DONE]`` on ``stream``.

    A plain iterator, not an async generator: the SDK stops reading at
    ``[DONE]`` and leaves its iterator unfinished, and an unfinished async
    generator is closed by the event loop's finalizer hook (a wake-up of the
    loop from the collector and a task of its own, each answer)."""

    __slots__ = ("events", "stream")

    def __init__(self, stream: Any, events: AsyncIterator[Any]) -> None:
        self.stream = stream
        self.events = events

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Any:
        sse = await self.events.__anext__()
        if sse.data.startswith("[DONE]"):
            self.stream.done = True
        return sse


def _merge_name(have: str, piece: str) -> str:
    """The tool-call name after a delta carrying ``piece``.

    Most servers send the name once; some repeat it whole in every delta
    (which must not be concatenated), and a rare few stream it in fragments.
    A repeat, or a longer name starting with what we have, replaces; anything
    else is a fragment and is appended.
    """
    if piece == have or piece.startswith(have):
        return piece
    return have + piece


def _add_call_delta(calls: dict[int, dict[str, str]], tc: Any) -> None:
    """Accumulate one streamed tool-call delta (a JSON dict) into ``calls`` by index."""
    if type(tc) is not dict:
        return
    acc = calls.setdefault(tc.get("index") or 0, {"id": "", "name": "", "arguments": ""})
    if tc.get("id"):
        acc["id"] = tc["id"]
    fn = tc.get("function")
    if fn and type(fn) is dict:
        if fn.get("name"):
            acc["name"] = _merge_name(acc["name"], fn["name"])
        if fn.get("arguments"):
            acc["arguments"] += fn["arguments"]


class OpenAIBackend(LLMBackend):
    """An OpenAI-compatible endpoint.

    ``base_url`` defaults to ``$OPENAI_BASE_URL`` (else the SDK's default);
    ``api_key`` to ``$OPENAI_API_KEY`` (local servers need none);
    ``model`` to ``$OPENAI_MODEL``.  ``timeout`` (seconds) bounds connecting
    and the wait for every chunk; ``max_retries`` retries 429/5xx/connection
    errors with backoff before the first chunk.  ``author_mode`` says how the
    author of a user message reaches the model: a ``"name: "`` prefix in the
    content (default: every model understands it), the ``name`` field (only
    ``[A-Za-z0-9_-]``; many local servers ignore it), or not at all.
    """

    name = "openai"
    settings_model = OpenAISettings

    def __init__(
        self,
        *,
        model: str | None = _DEFAULTS.model,
        base_url: str | None = _DEFAULTS.base_url,
        api_key: str | None = None,
        timeout: float = _DEFAULTS.timeout,
        connect_timeout: float = _DEFAULTS.connect_timeout,
        max_retries: int = _DEFAULTS.max_retries,
        temperature: float | None = _DEFAULTS.temperature,
        max_tokens: int | None = _DEFAULTS.max_tokens,
        author_mode: AuthorMode = _DEFAULTS.author_mode,
        extra_body: Mapping[str, Any] | None = None,
        default_headers: Mapping[str, str] | None = None,
        image_in: bool = _DEFAULTS.image_in,
    ) -> None:
        model = model or os.environ.get("OPENAI_MODEL")
        if not model:
            raise ConfigError("llm.model is required for the openai backend (or set OPENAI_MODEL)")
        if author_mode not in ("name", "prefix", "none"):
            raise ConfigError(f"llm.author_mode must be name|prefix|none, not {author_mode!r}")
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        # Keep the key only inside the client and to scrub error messages.
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or "not-needed"
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.author_mode: AuthorMode = author_mode
        self.extra_body = dict(extra_body or {})
        #: Attached images go to the model as image parts (``image_in``).
        self.supports_image_in = bool(image_in)
        #: What this endpoint refused once and is no longer sent (see :meth:`stream`):
        #: ``tool_choice`` (``"auto"`` is every server's default anyway) and
        #: ``stream`` together with tools (then tool requests are not streamed).
        self.compat: set[Literal["no_tool_choice", "no_stream_with_tools"]] = set()
        import openai  # here, not at the top: see TYPE_CHECKING above

        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self._api_key,
            timeout=openai.Timeout(timeout, connect=min(connect_timeout, timeout)),
            max_retries=max_retries,
            default_headers=dict(default_headers) if default_headers else None,
        )

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._client.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` closed the client (its HTTP connection pool)."""
        return self._client.is_closed()

    # -- request building -------------------------------------------------------
    def _wire_message(self, m: ChatMessage) -> dict[str, Any]:
        if m.role == "user":
            out: dict[str, Any] = {"role": "user", "content": m.content}
            if m.author and self.author_mode == "name":
                name = _NAME_RE.sub("_", m.author)[:64].strip("_")
                if name:
                    out["name"] = name
            elif m.author and self.author_mode == "prefix":
                out["content"] = f"{m.author}: {m.content}"
            images = [_image_part(p) for p in m.parts if isinstance(p, ImagePart)]
            if any(images):
                text = out["content"]
                out["content"] = [
                    *([{"type": "text", "text": text}] if text else []),
                    *(i for i in images if i is not None),
                ]
            return out
        if m.role == "assistant":
            out = {"role": "assistant", "content": m.content or None}
            if m.tool_calls:
                out["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            elif out["content"] is None:
                out["content"] = ""
            return out
        if m.role == "tool":
            return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
        return {"role": m.role, "content": m.content}

    def build_params(self, request: LLMRequest) -> dict[str, Any]:
        """The JSON body of the ``/chat/completions`` request (for tests/plugins)."""
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(self._wire_message(m) for m in request.messages)
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools and request.tool_choice != "none":
            params["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
            params["tool_choice"] = request.tool_choice
        temperature = request.temperature if request.temperature is not None else self.temperature
        if temperature is not None:
            params["temperature"] = temperature
        max_tokens = request.max_tokens or self.max_tokens
        if max_tokens:
            params["max_tokens"] = max_tokens
        # Backend-specific extras go into the body itself (it is sent as is).
        for key, value in self.extra_body.items():
            params.setdefault(key, value)
        if params.get("tools"):
            if "no_tool_choice" in self.compat and params.get("tool_choice") == "auto":
                del params["tool_choice"]
            if "no_stream_with_tools" in self.compat:
                params["stream"] = False
                params.pop("stream_options", None)
        return params

    def _fall_back(self, exc: openai.APIStatusError, params: Mapping[str, Any]) -> bool:
        """Whether a refusal is of the request's tool options, now left out (then retry).

        llama.cpp's own server (and others like it) refuse a streamed request with
        tools or with ``tool_choice``: first ``tool_choice: "auto"`` is dropped (it is
        the default), then, if refused again, tool requests are sent without
        streaming.  Each step is taken once per backend and logged once.
        """
        if exc.status_code not in _REFUSED or not params.get("tools"):
            return False
        said = f"{exc.message} {exc.body}".lower()
        if "tool" not in said:
            return False
        where = self.base_url or "the OpenAI API"
        if params.get("tool_choice") == "auto" and "no_tool_choice" not in self.compat:
            self.compat.add("no_tool_choice")
            step = "sending tools without tool_choice"
        elif params.get("stream") and "no_stream_with_tools" not in self.compat:
            self.compat.add("no_stream_with_tools")
            step = "sending requests with tools without streaming"
        else:
            return False
        log.warning(
            "the model at %s refused the request's tool options (HTTP %s: %s): %s from now on",
            where, exc.status_code, self._scrub(str(exc.message))[:200], step,
        )  # fmt: skip
        return True

    # -- streaming ----------------------------------------------------------------
    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        import openai  # already imported by __init__
        from openai.types.chat import ChatCompletion

        while True:
            params = self.build_params(request)
            try:
                if not params["stream"]:
                    completion = await self._client.post(
                        "/chat/completions",
                        body=params,
                        cast_to=ChatCompletion,
                        options={"security": {"bearer_auth": True}},
                    )
                    for item in _completion_items(completion):
                        yield item
                    return
                # The request body is already plain JSON: post it through the SDK's
                # client (same retries, timeouts, auth, SSE decoding and errors as
                # ``chat.completions.create``) without its per-field request
                # transformation, which costs ~0.3 ms of CPU per history message.
                response = await self._client.post(
                    "/chat/completions",
                    body=params,
                    cast_to=ChatCompletion,
                    stream=True,
                    stream_cls=_chunk_stream(),
                    options={"security": {"bearer_auth": True}},
                )
            except openai.APIStatusError as exc:
                if self._fall_back(exc, params):
                    continue
                raise self._translate(exc) from exc
            except openai.APIError as exc:
                raise self._translate(exc) from exc
            break
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        try:
            # Each chunk is the JSON dict the server sent (see _chunk_stream); a part
            # not shaped as the API says (not an object) is skipped.
            async for chunk in response:
                if type(chunk) is not dict:
                    continue
                u = chunk.get("usage")
                if type(u) is dict:
                    yield UsageItem(
                        Usage(
                            prompt_tokens=u.get("prompt_tokens") or 0,
                            completion_tokens=u.get("completion_tokens") or 0,
                            total_tokens=u.get("total_tokens") or 0,
                        )
                    )
                for choice in chunk.get("choices") or ():
                    if type(choice) is not dict or choice.get("index", 0) != 0:
                        continue
                    delta = choice.get("delta")
                    if delta and type(delta) is dict:
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        if isinstance(reasoning, str) and reasoning:
                            yield ReasoningChunk(reasoning)
                        content = delta.get("content")
                        if content:
                            yield TextChunk(content)
                        for tc in delta.get("tool_calls") or ():
                            _add_call_delta(calls, tc)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
        except openai.APIError as exc:
            raise self._translate(exc) from exc
        finally:
            await response.close()
        if finish is None:
            if not response.done:
                raise LLMConnectionError("the model's stream ended before it finished")
            # Ended with [DONE] but no finish_reason (some servers): a normal end.
            finish = "tool_calls" if calls else "stop"
        for index in sorted(calls):
            acc = calls[index]
            yield ToolCallItem(
                ToolCall(
                    id=acc["id"] or f"call_{uuid.uuid4().hex[:24]}",
                    name=acc["name"],
                    arguments=acc["arguments"] or "{}",
                )
            )
        yield FinishItem(finish)

    def _scrub(self, text: str) -> str:
        if self._api_key and self._api_key != "not-needed":
            text = text.replace(self._api_key, "***")
        return text

    def _translate(self, exc: openai.APIError) -> LLMError:
        import openai  # already imported by __init__

        where = self.base_url or "the OpenAI API"
        if isinstance(exc, openai.APITimeoutError):
            return LLMTimeout(f"the model at {where} timed out")
        if isinstance(exc, openai.APIConnectionError):
            return LLMConnectionError(f"could not reach the model at {where}: {exc.message}")
        if isinstance(exc, openai.APIStatusError) and _too_long(exc):
            return ContextTooLong(
                self._scrub(
                    f"the model at {where} refused the request as too large for its context"
                    f" (HTTP {exc.status_code}: {exc.message})"
                ),
                status_code=exc.status_code,
            )
        if isinstance(exc, openai.APIStatusError):
            return LLMStatusError(
                self._scrub(f"the model at {where} answered HTTP {exc.status_code}: {exc.message}"),
                status_code=exc.status_code,
            )
        return LLMError(self._scrub(f"the model at {where} failed: {exc.message}"))


def _image_part(part: ImagePart) -> dict[str, Any] | None:
    """An OpenAI ``image_url`` content part: the bytes as a ``data:`` URL, or the
    image's own URL; ``None`` for a part with neither (the turn described it)."""
    if part.data is not None:
        encoded = base64.b64encode(part.data).decode("ascii")
        return {
            "type": "image_url",
            "image_url": {"url": f"data:{part.media_type};base64,{encoded}"},
        }
    if part.url is not None:
        return {"type": "image_url", "image_url": {"url": part.url}}
    return None


def _completion_items(completion: ChatCompletion) -> list[StreamItem]:
    """A non-streamed answer as the items a stream of it would have given."""
    items: list[StreamItem] = []
    u = completion.usage
    if u is not None:
        items.append(
            UsageItem(
                Usage(
                    prompt_tokens=u.prompt_tokens or 0,
                    completion_tokens=u.completion_tokens or 0,
                    total_tokens=u.total_tokens or 0,
                )
            )
        )
    choice = next((c for c in completion.choices if c.index == 0), None)
    if choice is None:
        items.append(FinishItem("stop"))
        return items
    m = choice.message
    reasoning = getattr(m, "reasoning_content", None) or getattr(m, "reasoning", None)
    if isinstance(reasoning, str) and reasoning:
        items.append(ReasoningChunk(reasoning))
    if m.content:
        items.append(TextChunk(m.content))
    calls = [c for c in m.tool_calls or () if getattr(c, "function", None) is not None]
    for c in calls:
        fn = c.function  # type: ignore[union-attr]
        items.append(
            ToolCallItem(
                ToolCall(
                    id=c.id or f"call_{uuid.uuid4().hex[:24]}",
                    name=fn.name,
                    arguments=fn.arguments or "{}",
                )
            )
        )
    finish = choice.finish_reason or ("tool_calls" if calls else "stop")
    items.append(FinishItem(finish))
    return items


def _too_long(exc: openai.APIStatusError) -> bool:
    """Whether the endpoint refused the request for its size (413, or a 400 saying so)."""
    if exc.status_code == 413:
        return True
    if exc.status_code != 400:
        return False
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code in _TOO_LONG_CODES:
        return True
    return bool(_TOO_LONG_RE.search(exc.message or ""))


@hookimpl
def register_llm_backends(register: Any) -> None:
    register("openai", OpenAIBackend)
