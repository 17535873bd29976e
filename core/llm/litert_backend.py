"""The ``litert`` backend: an on-device model through LiteRT-LM (``litert-lm-api``).

No network: the model is a ``.litertlm`` file on disk (for example a Gemma 3
build published for LiteRT-LM).  ``pip install 'agentik[litert]'`` brings the
engine; this module imports it only when the backend is created, so agentik
works without it.

How it maps agentik onto the engine:

* **One engine per process**, loaded once (in a worker thread, on first use)
  and shared by every backend instance with the same model and settings.
* **One engine conversation per agent conversation**, kept between turns so
  its KV cache is reused: a request feeds only the messages that are new
  since the last one.  The backend remembers a fingerprint of every message
  the engine conversation has consumed; when a request's history does not
  extend it — after a restart, after compaction rewrote the context, after
  an interrupt (the engine's cancel leaves the engine conversation in an
  unusable state), after an error, or when the system prompt or the tools
  changed — the engine conversation is rebuilt from the request's messages.
  :attr:`LiteRTBackend.stats` counts builds, reuses and releases.
* The engine's streaming generator **blocks**: it runs in a worker thread and
  hands deltas to the event loop (one wake-up per batch, not per token), so
  the loop keeps serving other conversations while the model generates.  The
  engine runs one generation at a time; other conversations wait their turn.
* **Cancellation** (an interrupt) calls the engine's cancel and waits for the
  worker to stop, then drops that engine conversation.
* **System prompt folding**: many small chat templates (Gemma's) have no
  system role and require strictly alternating user/model turns; with
  ``fold_system_prompt`` (the default) the system prompt — and any summary a
  compaction left — is put at the front of the next user message, and
  consecutive user messages are merged.
* **Tools**: when the model declares function calling, tool definitions are
  passed to the engine with its automatic tool calling *off*; the calls the
  model makes come back as :class:`ToolCallItem` so agentik's own tool loop
  (policy, hooks, logs) runs them.  Otherwise :attr:`supports_tools` is false
  and no tools are offered.
* **Memory**: idle engine conversations are released after
  ``idle_release_seconds`` (a timer, reset on use), and at most
  ``max_conversations`` are kept (the least recently used goes first).
* **Errors**: the engine only *logs* why it failed (on stderr); the backend
  checks what it can first (model file, model format, cache directory) and
  raises :class:`~agentik.core.errors.ConfigError` naming the path, and turns
  engine failures at run time into :class:`~agentik.core.errors.LLMError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, ContextTooLong, LLMError, LLMResponseError
from ..messages import ChatMessage, ToolCall, Usage
from .base import (
    FinishItem,
    LLMBackend,
    LLMRequest,
    ReasoningChunk,
    StreamItem,
    TextChunk,
    ToolCallItem,
    ToolSpec,
    UsageItem,
)
from .litert import AuthorMode, LiteRTSettings

__all__ = [
    "LiteRTBackend",
    "LiteRTSettings",
    "LiteRTStats",
    "default_cache_dir",
    "to_engine_messages",
]

log = logging.getLogger(__name__)

#: Environment variables read when the matching argument is not given (the
#: names of agentik's ``litert-google`` seed).
ENV_MODEL_PATH = "AGENTIK_GOOGLE_MODEL_PATH"
ENV_CACHE_DIR = "AGENTIK_GOOGLE_CACHE_DIR"
ENV_THREADS = "AGENTIK_GOOGLE_THREADS"

#: How long an interrupted generation may take to stop before the backend
#: stops waiting for it (the worker still finishes and is cleaned up).
_CANCEL_WAIT = 2.0
#: Shortest time between two batches of deltas handed to the turn (seconds).
_DELTA_INTERVAL = 0.005
#: Tokens counted for each message's chat-template framing (turn markers,
#: role, newlines): a little more than the templates we know use.
_FRAME_TOKENS = 10


#: How the engine says a prompt does not fit its KV cache.
_TOO_LONG_RE = re.compile(
    r"exceeds available state entries|Input token ids are too long|Exceeding the maximum number"
    r" of tokens|Prefill input length exceeds",
    re.IGNORECASE,
)


def _prefill_slack(context: int) -> int:
    """Room kept for the engine's prefill: it works in fixed-size groups, and a
    prefill that would pass the end of the KV cache fails (``FAILED_PRECONDITION:
    Chosen prefill work group size exceeds available state entries``)."""
    return min(128, max(32, context // 16))


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/agentik/litert`` (``~/.cache/agentik/litert``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agentik", "litert")


@dataclass(slots=True)
class LiteRTStats:
    """What the backend did with engine conversations (for tests, metrics, benchmarks).

    ``builds``: engine conversations created (first turn, or a rebuild);
    ``reuses``: requests served by an existing engine conversation, feeding
    only the new messages; ``released_idle`` / ``evicted``: engine
    conversations closed after ``idle_release_seconds`` / to stay within
    ``max_conversations``; ``cancelled``: generations stopped by an
    interrupt; ``engine_loads``: engines this backend loaded (0 when it
    found one already loaded in the process).
    """

    builds: int = 0
    reuses: int = 0
    released_idle: int = 0
    evicted: int = 0
    cancelled: int = 0
    engine_loads: int = 0


# -- the engine, once per process ------------------------------------------------------


@dataclass(slots=True)
class _SharedEngine:
    engine: Any
    refs: int = 0


_engines: dict[tuple[Any, ...], _SharedEngine] = {}
_engines_lock = threading.Lock()


def _acquire_engine(key: tuple[Any, ...], make: Callable[[], Any]) -> tuple[Any, bool]:
    """The process's engine for ``key`` (loading it if needed); True if it was loaded now."""
    with _engines_lock:
        shared = _engines.get(key)
        loaded = False
        if shared is None:
            shared = _SharedEngine(make())
            _engines[key] = shared
            loaded = True
        shared.refs += 1
        return shared.engine, loaded


def _release_engine(key: tuple[Any, ...]) -> None:
    with _engines_lock:
        shared = _engines.get(key)
        if shared is None:
            return
        shared.refs -= 1
        if shared.refs <= 0:
            del _engines[key]
            shared.engine.close()


# -- messages -----------------------------------------------------------------------------


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def to_engine_messages(
    messages: Sequence[ChatMessage],
    system: str | None,
    *,
    fold_system_prompt: bool = True,
    author_mode: AuthorMode = "prefix",
) -> tuple[str | None, list[dict[str, Any]]]:
    """Translate working memory into LiteRT-LM messages.

    Returns ``(system_message, messages)``: the system prompt to give the
    engine conversation (``None`` when folded) and the message list.  With
    ``fold_system_prompt`` the system prompt and any ``system`` message (a
    compaction summary) go in front of the next user message, and
    consecutive user messages are merged, so the roles strictly alternate.
    Consecutive tool results become one tool message.
    """
    out: list[dict[str, Any]] = []
    pending: list[str] = [system] if (fold_system_prompt and system) else []

    def add_user(text: str) -> None:
        if pending:
            text = "\n\n".join([*pending, text]) if text else "\n\n".join(pending)
            pending.clear()
        if fold_system_prompt and out and out[-1]["role"] == "user":
            out[-1]["content"] = f"{out[-1]['content']}\n{text}"
        else:
            out.append({"role": "user", "content": text})

    for m in messages:
        if m.role == "system":
            if fold_system_prompt:
                pending.append(m.content)
            else:
                out.append({"role": "system", "content": m.content})
        elif m.role == "user":
            text = m.content
            if m.author and author_mode == "prefix":
                text = f"{m.author}: {text}"
            add_user(text)
        elif m.role == "assistant":
            if pending:
                add_user("")
            msg: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "type": "function",
                        "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and "tool_calls" not in prev:
                # Two answers in a row (an interrupted one, then another):
                # one model turn for strictly alternating templates.
                prev["content"] = "\n".join(p for p in (prev["content"], m.content) if p)
                if "tool_calls" in msg:
                    prev["tool_calls"] = msg["tool_calls"]
            else:
                out.append(msg)
        elif m.role == "tool":
            item = {"type": "tool_response", "name": m.name or "", "response": m.content}
            if out and out[-1]["role"] == "tool":
                out[-1]["content"].append(item)
            else:
                out.append({"role": "tool", "content": [item]})
    if pending:
        add_user("")
    return (None if fold_system_prompt else system), out


def _fingerprint(message: dict[str, Any]) -> str:
    raw = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()


def _tool_description(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


# -- worker-to-loop hand-off ------------------------------------------------------------------


class _Feed:
    """Items from a worker thread to the event loop, one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[str, Any]] = []
        self._wake_pending = False
        self._ready = asyncio.Event()

    def push(self, kind: str, value: Any = None) -> None:  # worker thread
        with self._lock:
            self._items.append((kind, value))
            if self._wake_pending:
                return
            self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._ready.set()

    async def take(self) -> list[tuple[str, Any]]:
        """Everything pushed since the last call (waits for at least one item)."""
        while True:
            with self._lock:
                if self._items:
                    # Until the next take, pushes only append: one wake-up per batch.
                    items, self._items = self._items, []
                    self._wake_pending = False
                    return items
                self._ready.clear()
            await self._ready.wait()


def _coalesce(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Join runs of consecutive text (or reasoning) items into one."""
    out: list[tuple[str, Any]] = []
    for kind, value in items:
        if out and kind in ("text", "reasoning") and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


# -- per-conversation state ---------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Slot:
    """An engine conversation and what it has consumed."""

    key: tuple[Any, ...]
    conv: Any = None
    #: The answer cap the engine conversation was created with.
    max_tokens: int | None = None
    consumed: list[str] = field(default_factory=list)
    busy: bool = False
    poisoned: bool = False
    timer: asyncio.TimerHandle | None = None
    #: Set when the worker that last used this slot has finished.
    idle: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True, eq=False)
class _Job:
    """One generation, shared between the loop and its worker thread."""

    slot: _Slot
    history: list[dict[str, Any]] | None  # None: reuse slot.conv
    feed: dict[str, Any]
    system: str | None
    tools: tuple[ToolSpec, ...]
    max_tokens: int | None
    sampler: Any
    cancelled: bool = False
    cancel_sent: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self) -> None:
        """Ask the engine to stop (any thread); the worker repeats it if it was too early."""
        with self.lock:
            self.cancelled = True
            conv = self.slot.conv
            if conv is None or self.cancel_sent:
                return
            self.cancel_sent = True
        conv.cancel_process()


_DEFAULTS = LiteRTSettings()


class LiteRTBackend(LLMBackend):
    """An on-device ``.litertlm`` model run by the LiteRT-LM engine.

    ``model_path`` (else ``$AGENTIK_GOOGLE_MODEL_PATH``) is the model file;
    ``cache_dir`` (else ``$AGENTIK_GOOGLE_CACHE_DIR``, else
    :func:`default_cache_dir`) where the engine keeps compiled artifacts —
    created if missing; ``threads`` (else ``$AGENTIK_GOOGLE_THREADS``) the
    CPU threads of the engine (unset: its default).  ``max_tokens`` caps each
    answer; ``context_tokens`` the KV cache size (unset: the model's).
    ``top_k``/``top_p``/``temperature``/``seed`` configure sampling (unset:
    the model's defaults).  ``fold_system_prompt``, ``idle_release_seconds``,
    ``max_conversations`` and ``author_mode`` are described in the module
    docstring and ``config.example.toml``.  ``model`` is only a label.
    """

    name = "litert"
    settings_model = LiteRTSettings

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = _DEFAULTS.model_path,
        cache_dir: str | os.PathLike[str] | None = _DEFAULTS.cache_dir,
        threads: int | str | None = _DEFAULTS.threads,
        max_tokens: int | None = _DEFAULTS.max_tokens,
        context_tokens: int | None = _DEFAULTS.context_tokens,
        top_k: int | None = _DEFAULTS.top_k,
        top_p: float | None = _DEFAULTS.top_p,
        temperature: float | None = _DEFAULTS.temperature,
        seed: int | None = _DEFAULTS.seed,
        fold_system_prompt: bool = _DEFAULTS.fold_system_prompt,
        idle_release_seconds: float = _DEFAULTS.idle_release_seconds,
        max_conversations: int = _DEFAULTS.max_conversations,
        author_mode: AuthorMode = _DEFAULTS.author_mode,
        model: str | None = _DEFAULTS.model,
    ) -> None:
        path = os.fspath(model_path) if model_path else os.environ.get(ENV_MODEL_PATH, "")
        if not path:
            raise ConfigError(
                f"llm.model_path is required for the litert backend (or set {ENV_MODEL_PATH})"
            )
        path = os.path.abspath(os.path.expanduser(path))
        if not os.path.exists(path):
            raise ConfigError(f"llm.model_path: no such model file: {path}")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(f"llm.model_path: not a readable file: {path}")
        cache = os.fspath(cache_dir) if cache_dir else os.environ.get(ENV_CACHE_DIR, "")
        cache = os.path.abspath(os.path.expanduser(cache or default_cache_dir()))
        try:
            os.makedirs(cache, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"llm.cache_dir: cannot create {cache}: {exc.strerror or exc}"
            ) from None
        if not os.access(cache, os.W_OK | os.X_OK):
            raise ConfigError(f"llm.cache_dir: not a writable directory: {cache}")
        if threads is None or threads == "":
            threads = os.environ.get(ENV_THREADS) or None
        try:
            n_threads = int(threads) if threads is not None else None
        except ValueError:
            raise ConfigError(f"llm.threads: not a whole number: {threads!r}") from None
        if n_threads is not None and n_threads < 1:
            raise ConfigError(f"llm.threads: must be at least 1, got {n_threads}")
        if author_mode not in ("prefix", "none"):
            raise ConfigError(
                f"llm.author_mode must be prefix|none for litert, not {author_mode!r}"
            )
        if idle_release_seconds <= 0:
            raise ConfigError("llm.idle_release_seconds must be positive")
        if max_conversations < 1:
            raise ConfigError("llm.max_conversations must be at least 1")
        try:
            import litert_lm
        except ImportError as exc:
            raise ConfigError(
                "the litert backend needs the LiteRT-LM engine: pip install 'agentik[litert]'"
                f" ({exc})"
            ) from None
        self._lm = litert_lm
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
        try:
            sampler = (
                litert_lm.SamplerConfig(
                    top_k=top_k, top_p=top_p, temperature=temperature, seed=seed
                )
                if any(v is not None for v in (top_k, top_p, temperature, seed))
                else None
            )
        except ValueError as exc:
            raise ConfigError(f"llm: bad sampler setting: {exc}") from None
        info = self._model_info(path)

        self.model_path = path
        self.cache_dir = cache
        self.threads = n_threads
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self.sampler = sampler
        self.fold_system_prompt = fold_system_prompt
        self.idle_release_seconds = float(idle_release_seconds)
        self.max_conversations = int(max_conversations)
        self.author_mode: AuthorMode = author_mode
        self.model = model or os.path.basename(path)
        #: Whether the model declares function calling (tools are offered only then).
        self.supports_tools = info["function_calling"]
        #: The model's context size in tokens (its KV cache, unless ``context_tokens``).
        self.model_context = info["context"]
        #: Counters of what happened to engine conversations (see :class:`LiteRTStats`).
        self.stats = LiteRTStats()
        self._engine: Any = None
        self._engine_key = (path, cache, n_threads, context_tokens)
        self._engine_lock: asyncio.Lock | None = None
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_conversations + 2, thread_name_prefix="agentik-litert"
        )
        self._workers: set[asyncio.Future[Any]] = set()
        self._jobs: set[_Job] = set()
        self._closed = False
        #: Token counts of message texts (``count_tokens``), by text.
        self._token_counts: dict[str, int] = {}

    @property
    def context_size(self) -> int:
        """Tokens the engine's KV cache holds (``context_tokens``, else the model's)."""
        return int(self.context_tokens or self.model_context)

    def _answer_reserve(self, max_tokens: int | None = None) -> int:
        """Room kept for the answer: its cap, at most a quarter of the context."""
        context = self.context_size
        return min(max_tokens or self.max_tokens or context, context // 4)

    @property
    def context_window(self) -> int:  # type: ignore[override]  # read-only here
        """Prompt tokens a request may use — the KV cache less the room kept for
        the answer and for the engine's prefill padding: what compaction and
        trimming keep every request under."""
        context = self.context_size
        return max(1, context - self._answer_reserve() - _prefill_slack(context))

    def _engine_messages(self, request: LLMRequest) -> tuple[str | None, list[dict[str, Any]]]:
        """``request`` as the engine's system prompt and messages (this backend's options)."""
        return to_engine_messages(
            request.messages,
            request.system,
            fold_system_prompt=self.fold_system_prompt,
            author_mode=self.author_mode,
        )

    async def count_tokens(self, request: LLMRequest) -> int:
        """The size of ``request`` as the engine would prefill it after a rebuild,
        with the model's own tokenizer (message framing counted generously)."""
        engine = await self._get_engine()
        system, wire = self._engine_messages(request)
        texts = [system or ""]
        texts += [
            json.dumps(m["content"]) if not isinstance(m["content"], str) else m["content"]
            for m in wire
        ]
        texts += [json.dumps(m["tool_calls"]) for m in wire if m.get("tool_calls")]
        if self.supports_tools and request.tools and request.tool_choice != "none":
            texts += [json.dumps(_tool_description(t)) for t in request.tools]
        loop = asyncio.get_running_loop()
        counted = await loop.run_in_executor(self._executor, self._count_texts, engine, texts)
        return counted + _FRAME_TOKENS * (len(wire) + 1)

    def _count_texts(self, engine: Any, texts: list[str]) -> int:  # worker thread
        cache = self._token_counts
        total = 0
        for text in texts:
            if not text:
                continue
            n = cache.get(text)
            if n is None:
                n = len(engine.tokenize(text))
                if len(cache) >= 4096:
                    cache.clear()
                cache[text] = n
            total += n
        return total

    def __repr__(self) -> str:
        return f"LiteRTBackend(model_path={self.model_path!r})"

    def _model_info(self, path: str) -> dict[str, Any]:
        """Read the model's header: is it an LLM, its context, function calling."""
        try:
            with self._lm.ModelInfo(path) as info:
                if not info.is_llm_model or info.llm is None:
                    raise ConfigError(
                        f"llm.model_path: {path} is a LiteRT-LM file but not a language model"
                    )
                return {
                    "context": info.max_context_tokens,
                    "function_calling": bool(info.llm.supports_function_calling()),
                }
        except (RuntimeError, OSError) as exc:
            raise ConfigError(
                f"llm.model_path: {path} is not a LiteRT-LM model the engine can read ({exc})"
            ) from None

    # -- engine ----------------------------------------------------------------------------
    async def _get_engine(self) -> Any:
        if self._engine is not None:
            return self._engine
        if self._engine_lock is None:
            self._engine_lock = asyncio.Lock()
        async with self._engine_lock:
            if self._engine is None:
                loop = asyncio.get_running_loop()
                engine, loaded = await loop.run_in_executor(
                    self._executor, _acquire_engine, self._engine_key, self._make_engine
                )
                self._engine = engine
                self.stats.engine_loads += int(loaded)
        return self._engine

    def _make_engine(self) -> Any:  # worker thread
        lm = self._lm
        try:
            return lm.Engine(
                self.model_path,
                backend=lm.Backend.CPU(thread_count=self.threads),
                max_num_tokens=self.context_tokens,
                cache_dir=self.cache_dir,
                enable_benchmark=True,  # per-request token counts for usage
            )
        except RuntimeError as exc:
            raise LLMError(
                f"the LiteRT-LM engine could not load {self.model_path}"
                f" (cache dir {self.cache_dir}); its log on stderr says why ({exc})"
            ) from None

    # -- streaming -------------------------------------------------------------------------
    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        if self._closed:
            raise LLMError("the litert backend is closed")
        engine = await self._get_engine()
        system, wire = self._engine_messages(request)
        if not wire or wire[-1]["role"] == "assistant":
            raise LLMResponseError("nothing to answer: the conversation ends with the model's turn")
        tools = (
            tuple(request.tools)
            if (self.supports_tools and request.tools and request.tool_choice != "none")
            else ()
        )
        sampler = self._sampler_for(request)
        key = (
            system,
            tuple(json.dumps(_tool_description(t), sort_keys=True) for t in tools),
            repr(sampler),
        )
        prints = [_fingerprint(m) for m in wire]
        cid = request.conversation_id
        slot = self._slots.get(cid) if cid is not None else None
        history: list[dict[str, Any]] | None
        max_tokens = request.max_tokens or self.max_tokens

        def reusable(slot: _Slot | None) -> bool:
            return (
                slot is not None
                and cid is not None
                and self._slots.get(cid) is slot
                and not slot.busy
                and not slot.poisoned
                and slot.conv is not None
                and slot.key == key
                and len(prints) == len(slot.consumed) + 1
                and prints[: len(slot.consumed)] == slot.consumed
            )

        # Checked again after the room is measured: the idle timer may have
        # released the engine conversation meanwhile.
        if (
            cid is not None
            and slot is not None
            and reusable(slot)
            and await self._room_for(engine, slot, wire[-1], max_tokens)
            and reusable(slot)
        ):
            history = None
            self.stats.reuses += 1
            self._slots.move_to_end(cid)
        else:
            if slot is not None and cid is not None:
                self._drop(cid, slot)
            slot = _Slot(key=key)
            slot.idle.set()
            if cid is not None:
                self._slots[cid] = slot
                self._evict_over_cap(keep=cid)
            history = wire[:-1]
            self.stats.builds += 1
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        slot.busy = True
        slot.idle.clear()
        job = _Job(
            slot=slot,
            history=history,
            feed=wire[-1],
            system=system,
            tools=tools,
            max_tokens=max_tokens,
            sampler=sampler,
        )
        loop = asyncio.get_running_loop()
        feed = _Feed(loop)
        worker = loop.run_in_executor(self._executor, self._run_job, engine, job, feed)
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)
        self._jobs.add(job)
        finished = failed = False
        calls: list[ToolCall] = []
        texts: list[str] = []
        try:
            paced = 0.0
            while True:
                # At most one batch per _DELTA_INTERVAL: a fast model's tokens go
                # out a few at a time, since per-token events on the loop would
                # cost the engine's callback thread the GIL.  Slower models
                # (most real ones) still stream token by token.
                wait = paced - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                batch = await feed.take()
                paced = loop.time() + _DELTA_INTERVAL
                for kind, value in _coalesce(batch):
                    if kind == "text":
                        texts.append(value)
                        yield TextChunk(value)
                    elif kind == "reasoning":
                        yield ReasoningChunk(value)
                    elif kind == "call":
                        calls.append(value)
                    elif kind == "error":
                        failed = True
                        raise value
                    elif kind == "done":
                        usage, reason = value
                        finished = True
                        if usage is not None:
                            yield UsageItem(usage)
                        for call in calls:
                            yield ToolCallItem(call)
                        yield FinishItem("tool_calls" if calls else reason)
                        answer: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
                        if calls:
                            answer["tool_calls"] = [
                                {
                                    "type": "function",
                                    "function": {
                                        "name": c.name,
                                        "arguments": _arguments(c.arguments),
                                    },
                                }
                                for c in calls
                            ]
                        slot.consumed = [*prints, _fingerprint(answer)]
                        if reason == "length" and self._context_full(slot):
                            slot.poisoned = True
                        return
        finally:
            if not finished:
                # Interrupted, or the engine failed: the engine conversation's
                # state no longer matches the working memory; rebuild next time.
                slot.poisoned = True
                if not failed:
                    job.cancel()
                    self.stats.cancelled += 1
                if not worker.done():
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await asyncio.wait_for(asyncio.shield(worker), _CANCEL_WAIT)
            self._jobs.discard(job)
            slot.busy = False
            self._after_use(cid, slot)

    def _sampler_for(self, request: LLMRequest) -> Any:
        if request.temperature is None:
            return self.sampler
        base = self.sampler
        return self._lm.SamplerConfig(
            top_k=getattr(base, "top_k", None),
            top_p=getattr(base, "top_p", None),
            temperature=request.temperature,
            seed=getattr(base, "seed", None),
        )

    async def _room_for(
        self, engine: Any, slot: _Slot, feed: dict[str, Any], max_tokens: int | None
    ) -> bool:
        """Whether the engine conversation has room for ``feed`` and an answer.

        Its KV cache holds every token it consumed and generated, which can be
        more than the history re-tokenized (an interrupted or long answer):
        when the new message, its prefill padding and the room kept for the
        answer would not fit, the conversation is rebuilt from the (fitted)
        history instead of failing in the engine.
        """
        try:
            used = slot.conv.token_count
        except RuntimeError:
            return False
        content = feed["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(self._executor, self._count_texts, engine, [text])
        context = self.context_size
        need = tokens + 2 * _FRAME_TOKENS + self._answer_reserve(max_tokens)
        return used + need + _prefill_slack(context) <= context

    def _context_full(self, slot: _Slot) -> bool:
        try:
            return slot.conv is None or slot.conv.token_count >= (
                self.context_tokens or self.model_context
            )
        except RuntimeError:
            return True

    def _run_job(self, engine: Any, job: _Job, feed: _Feed) -> None:  # worker thread
        slot = job.slot
        try:
            if job.history is not None:
                conv = engine.create_conversation(
                    messages=job.history,
                    tools=[self._tool(t) for t in job.tools] or None,
                    automatic_tool_calling=False,
                    sampler_config=job.sampler,
                    system_message=job.system,
                    max_output_tokens=job.max_tokens,
                )
                with job.lock:
                    slot.conv = conv
                    slot.max_tokens = job.max_tokens
            if job.cancelled:
                return
            conv = slot.conv
            before = conv.token_count
            chunks = 0
            # Per-message options cost the engine extra work on every send:
            # only when this request's cap differs from the conversation's.
            options = (
                {"max_output_tokens": job.max_tokens} if job.max_tokens != slot.max_tokens else {}
            )
            stream = conv.send_message_async(job.feed, **options)
            for message in stream:
                if job.cancelled:
                    # A cancel that came before the engine started is lost
                    # by the engine: send it again, then drain what is left.
                    with job.lock:
                        resend = not job.cancel_sent
                        job.cancel_sent = True
                    if resend:
                        conv.cancel_process()
                    continue
                chunks += 1
                self._push_message(message, feed)
            usage, reason = self._usage(conv, before, chunks, job.max_tokens)
            feed.push("done", (usage, reason))
        except Exception as exc:
            feed.push("error", self._translate(exc))
        finally:
            slot.idle.set()

    def _push_message(self, message: Any, feed: _Feed) -> None:  # worker thread
        content = message.get("content")
        if isinstance(content, str):
            if content:
                feed.push("text", content)
        elif isinstance(content, list):
            for item in content:
                if isinstance(item, dict) and item.get("type") == "text" and item.get("text"):
                    feed.push("text", item["text"])
        channels = message.get("channels")
        if isinstance(channels, dict):
            for text in channels.values():
                if isinstance(text, str) and text:
                    feed.push("reasoning", text)
        for call in message.get("tool_calls") or ():
            fn = call.get("function", call) if isinstance(call, dict) else {}
            args = fn.get("arguments", {})
            feed.push(
                "call",
                ToolCall(
                    id=call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    name=str(fn.get("name", "")),
                    arguments=args if isinstance(args, str) else json.dumps(args),
                ),
            )

    def _usage(
        self, conv: Any, before: int, chunks: int, max_tokens: int | None
    ) -> tuple[Usage | None, str]:  # worker thread
        try:
            after = conv.token_count
        except RuntimeError:
            return None, "stop"
        try:
            completion = conv.get_benchmark_info().last_decode_token_count
        except RuntimeError:
            completion = chunks
        context = self.context_tokens or self.model_context
        full = after >= context - 1
        reason = "length" if (full or (max_tokens and completion >= max_tokens)) else "stop"
        prompt = max(0, after - completion)
        return Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ), reason

    def _tool(self, spec: ToolSpec) -> Any:
        description = _tool_description(spec)

        class _Declared(self._lm.Tool):  # type: ignore[name-defined]
            """A tool the model may call; agentik runs it, never the engine."""

            def get_tool_description(self) -> dict[str, Any]:
                return description

            def execute(self, param: Any) -> Any:
                raise RuntimeError("automatic tool calling is off: agentik runs tools")

        return _Declared()

    def _translate(self, exc: Exception) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        text = str(exc)
        if _TOO_LONG_RE.search(text):
            return ContextTooLong(
                f"the conversation does not fit the LiteRT-LM model's context"
                f" ({self.context_size} tokens): {text.splitlines()[0] if text else ''}"
            )
        if "send_message_stream failed" in text or "Failed to create conversation" in text:
            hint = (
                ""
                if self.fold_system_prompt
                else "; if its chat template rejects system messages or needs alternating"
                " roles, set llm.fold_system_prompt = true"
            )
            return LLMResponseError(
                f"the LiteRT-LM engine refused this conversation for {self.model_path}"
                f" (its log on stderr says why: a chat-template error, or a context longer"
                f" than {self.context_tokens or self.model_context} tokens){hint}"
            )
        return LLMError(f"the LiteRT-LM engine failed running {self.model_path}: {text}")

    # -- engine conversations' lifetime ------------------------------------------------------
    def _after_use(self, cid: str | None, slot: _Slot) -> None:
        if cid is None or self._slots.get(cid) is not slot:
            self._close_slot(slot)
            return
        if slot.poisoned:
            self._drop(cid, slot)
            return
        loop = asyncio.get_running_loop()
        slot.timer = loop.call_later(self.idle_release_seconds, self._release_idle, cid, slot)

    def _release_idle(self, cid: str, slot: _Slot) -> None:
        if self._slots.get(cid) is slot and not slot.busy:
            self.stats.released_idle += 1
            self._drop(cid, slot)

    def _evict_over_cap(self, *, keep: str) -> None:
        for cid in list(self._slots):
            if len(self._slots) <= self.max_conversations:
                return
            slot = self._slots[cid]
            if cid != keep and not slot.busy:
                self.stats.evicted += 1
                self._drop(cid, slot)

    def _drop(self, cid: str, slot: _Slot) -> None:
        if self._slots.get(cid) is slot:
            del self._slots[cid]
        self._close_slot(slot)

    def _close_slot(self, slot: _Slot) -> None:
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        conv, slot.conv = slot.conv, None
        if conv is None:
            return

        def close() -> None:  # worker thread: wait for the last generation, then free
            slot.idle.wait()
            conv.close()

        if self._closed:
            close()
            return
        fut = asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._workers.add(fut)
        fut.add_done_callback(self._workers.discard)

    @property
    def engine(self) -> Any:
        """The ``litert_lm.Engine`` (shared by the process), or None before the first turn."""
        return self._engine

    def release(self, conversation_id: str) -> bool:
        """Free the engine state of one conversation now; its next turn rebuilds it.

        Returns ``False`` if it held none (a running generation is left alone).
        """
        slot = self._slots.get(conversation_id)
        if slot is None or slot.busy:
            return False
        self._drop(conversation_id, slot)
        return True

    @property
    def live_conversations(self) -> int:
        """Engine conversations currently held (each holds a KV cache)."""
        return len(self._slots)

    async def aclose(self) -> None:
        """Stop generations, free every engine conversation, let go of the engine."""
        if self._closed:
            return
        self._closed = True
        for job in list(self._jobs):
            job.cancel()
        slots = list(self._slots.values())
        self._slots.clear()
        for slot in slots:
            if slot.timer is not None:
                slot.timer.cancel()
        if self._workers:
            await asyncio.gather(*list(self._workers), return_exceptions=True)
        loop = asyncio.get_running_loop()

        def finish() -> None:
            for slot in slots:
                self._close_slot(slot)
            if self._engine is not None:
                self._engine = None
                _release_engine(self._engine_key)

        await loop.run_in_executor(self._executor, finish)
        self._executor.shutdown(wait=True)
