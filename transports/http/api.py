"""The REST API on Starlette: routes, request parsing, access control, errors.

Every error is JSON with a stable code::

    {"error": {"code": "conversation_not_found", "message": "no conversation 'x'"}}

==========================  ======  ===============================================
code                        status  when
==========================  ======  ===============================================
``unauthorized``            401     no token, or not a configured one
``forbidden``               403     the token may not create conversations here
``host_not_allowed``        403     a ``Host`` the server does not answer to (:mod:`.guard`)
``origin_not_allowed``      403     a web page of another origin (:mod:`.guard`)
``not_found``               404     no such path
``conversation_not_found``  404     unknown id, or one the token may not see
``method_not_allowed``      405     e.g. ``PUT`` on a conversation
``no_turn_running``         409     interrupt with no turn running
``turn_already_interrupted`` 409    interrupt of a turn already being stopped
``run_not_running``         409     interrupt naming a run neither running nor queued
``approval_not_found``      404     no such approval in this conversation
``approval_not_pending``    409     the approval was already decided, expired, or no turn waits
``forbidden``               403     (approvals) the token's role may not decide, or it asked
``body_too_large``          413     body over ``max_body_bytes`` (imports: ``max_import_bytes``)
``conversation_exists``     409     an import under an id the database already has
``invalid_snapshot``        422     an import that is not a valid snapshot (names the field)
``question_not_found``      404     (forms) no form by that id waits in this conversation
``invalid_answer``          422     (forms) an unknown question, or a required one left empty
``forbidden``               403     (forms) the form asks someone else
``message_not_found``       404     (redact) no such message in this conversation
``already_redacted``        409     (redact) the message is already redacted
``forbidden``               403     (redact) neither the message's author nor an admin
``unsupported_media_type``  415     a body that is not ``Content-Type: application/json``
``invalid_body``            422     not JSON, nested too deep, not an object, or a field is wrong
``invalid_parameter``       422     a query parameter or header is wrong
``attachment_too_large``    413     an upload over ``[attachments] max_bytes``
``attachment_rejected``     415     an upload whose bytes are no type taken
``attachment_not_found``    404     no such attachment here (409: a message names one)
``checkpoint_not_found``    404     no such checkpoint in this conversation
``checkpoint_limit``        409     the conversation has ``[checkpoints] keep_manual`` taken by hand
``budget_exceeded``         429     the token's or the conversation's budget is used up
``unavailable``             503     the agent is shutting down
``internal_error``          500     a bug: logged with its traceback
==========================  ======  ===============================================
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import gzip
import hashlib
import hmac
import json
import logging
import re
import time
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Annotated, Any, Literal
from urllib.parse import quote

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agentik.core import Agent, Conversation, ConversationRecord
from agentik.core.approvals import ApprovalError
from agentik.core.attachments import IMAGE_TYPES, check
from agentik.core.budgets import Budgets
from agentik.core.errors import (
    AttachmentRejected,
    BranchError,
    CheckpointLimit,
    ClosedError,
    NotFound,
    PromptRefused,
)
from agentik.core.events import EventBase
from agentik.core.gate import Gate, Speaker, Ticket
from agentik.core.health import status_of, without_reasons
from agentik.core.lifecycle import (
    SnapshotError,
    export_conversation,
    import_conversation,
    validate_snapshot,
)
from agentik.core.messages import Content, ImagePart, Message, TextPart, parts_from
from agentik.core.questions import MAX_FORM_FIELDS, FormError, may_answer
from agentik.core.redaction import RedactionError
from agentik.core.settings import empty_list
from agentik.core.store.search import SearchHit, search_terms
from agentik.core.streamprofiles import PROFILES
from agentik.core.turnsettings import DEFAULT_SETTINGS, TurnOrigin, TurnSettings
from agentik.transports.base import (
    AgentHost,
    HostMetrics,
    IncomingMessage,
)

from .auth import LOCAL, Principal, TokenTable, local_principal
from .guard import Guard, GuardMiddleware
from .openapi import (
    AUTHOR_CHARS,
    AUTHOR_PATTERN,
    CHILDREN,
    TITLE_PATTERN,
    UNPRINTABLE,
    openapi_document,
)
from .settings import HttpSettings
from .sse import EventStream, FrameCache

__all__ = ["ApiContext", "ApiError", "build_app"]

log = logging.getLogger(__name__)


#: ``Retry-After`` (seconds) of a 429 caused by running turns' token reservations.
RESERVED_RETRY_AFTER = 5
#: The longest attachment name kept, and the most attachments one message takes.
NAME_CHARS = 200
MAX_ATTACHMENTS = 10
#: How many of a conversation's latest questions an interrupt naming a queued run
#: looks through (several workers: the run may wait in the shared turn queue).
_QUEUED_LOOK_BACK = 200


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


# -- request bodies ----------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SnapshotBody(_Body):
    """``POST …/conversations/import``: a snapshot (checked by agentik.core.lifecycle)."""

    model_config = ConfigDict(extra="allow")


_TITLE = re.compile(TITLE_PATTERN)


def _printable_title(v: str) -> str:
    if not _TITLE.fullmatch(v):
        raise ValueError("must be one line without control or invisible characters")
    return v


class NewConversationBody(_Body):
    temp: bool = False
    title: str = Field("", max_length=200)

    @field_validator("title")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return _printable_title(v)


class CheckpointBody(_Body):
    """``POST …/checkpoints``: an optional label (one line)."""

    label: str = Field("", max_length=200)

    @field_validator("label")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return _printable_title(v)


class RenameBody(_Body):
    #: ``null`` clears the title (as ``""`` does), as the standalone seed's clients send.
    title: str | None = Field(max_length=200)

    @field_validator("title")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        return None if v is None else _printable_title(v)


_AUTHOR = re.compile(AUTHOR_PATTERN)


class AttachmentRef(_Body):
    """An attachment uploaded to the conversation (``POST .../attachments``), by hash."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: The name shown for it (the upload's file name by default).
    name: str = Field("", max_length=NAME_CHARS)

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        return _file_name(v)


def _check_author(v: str | None) -> str | None:
    if v is None:
        return v
    if len(v) > AUTHOR_CHARS or not _AUTHOR.fullmatch(v):
        raise ValueError(
            f"must be one line of at most {AUTHOR_CHARS} visible characters"
            " (no line breaks or control characters)"
        )
    return v


#: A speaker's name as a request gives it: one line of visible characters, or none.
Author = Annotated[str | None, AfterValidator(_check_author)]


class NewMessageBody(_Body):
    #: The words; may be left out (or blank) when ``attachments`` are given: an
    #: image on its own is a message.
    content: str = ""
    #: The speaker's name the model sees: a display label, not an identity
    #: (the message's ``author_id`` is always the token's).
    author: Author = None
    #: When a turn is running: ``queue``, ``steer`` into it, or ``interrupt`` it.
    busy: Literal["queue", "steer", "interrupt"] = "queue"
    #: Images and files uploaded before (``POST .../attachments``), sent with it.
    attachments: list[AttachmentRef] = Field(default_factory=empty_list, max_length=MAX_ATTACHMENTS)

    @model_validator(mode="after")
    def _words_or_attachments(self) -> NewMessageBody:
        if not self.content.strip() and not self.attachments:
            raise ValueError("content: a message needs words, unless it has attachments")
        return self


def _attached_to(asked: Message) -> list[AttachmentRef]:
    """The stored attachments of the question ``asked``, as a new message names them
    (a regenerate or an edit sends them again; parts that are only links are left)."""
    data = asked.data if isinstance(asked.data, dict) else {}
    return [
        AttachmentRef(sha256=p.sha256, name=p.name)
        for p in parts_from(data.get("parts"))[:MAX_ATTACHMENTS]
        if p.sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", p.sha256)
    ]


class BranchBody(_Body):
    """``POST …/regenerate``: who asks again (default: who asked)."""

    author: Author = None


class EditBody(_Body):
    """``POST …/edit``: the question that replaces the last one."""

    content: str = Field(min_length=1, pattern=r"\S")
    author: Author = None


class InterruptBody(_Body):
    run_id: str | None = None


class RedactBody(_Body):
    reason: str = Field("", max_length=300)


class DecisionBody(_Body):
    decision: Literal["approve", "deny"]
    reason: str | None = Field(None, max_length=300)


class FormAnswerBody(_Body):
    """``POST …/questions/{id}``: a form's answers (question id -> text; ``null`` or
    empty: not answered), all at once or some of them."""

    answers: dict[str, str | None] = Field(max_length=MAX_FORM_FIELDS)
    #: Send the whole form (empty optional questions are skipped, empty required
    #: ones refused); ``false``: keep these answers, the form waits for the rest.
    submit: bool = True


# -- the application -----------------------------------------------------------------


@dataclass(eq=False)
class ApiContext:
    """What the API needs from its transport."""

    agent: Agent
    settings: HttpSettings
    tokens: TokenTable
    #: The transport instance name: conversations it creates are bound to
    #: ``http:<instance>:<token name>:<id>``.
    instance: str
    #: The instance's ``allowed_tools`` (bridge key): the tool bound of every turn
    #: posted here (the turn's settings), in whichever conversation.
    allowed_tools: tuple[str, ...] | None = None
    #: The transport's host (the bot's bridge): its :attr:`~AgentHost.gate` admits
    #: posted messages and decides rights, as it does for chat messages; read at each
    #: request, so a reload's new ``[access]`` policy decides at once.  ``None``: a
    #: host with no rules (everyone is a ``user``).
    host: AgentHost | None = None
    page: str | None = None
    cache: FrameCache = field(default_factory=FrameCache)
    streams: set[EventStream] = field(default_factory=set)
    #: Set while shutting down: new event streams are refused.
    closing: bool = False
    #: Usage limits (the host's when the API started), checked before a posted message
    #: starts a turn; their tokens are counted from the agent's events.
    budgets: Budgets | None = None
    #: The bot's metrics (``render() -> (body, content_type)``), served at ``/metrics``.
    metrics: MetricsSource | None = None
    #: The bearer token ``/metrics`` requires (``metrics_token_env``); ``None``: the API's.
    metrics_token: bytes | None = None


#: What ``/metrics`` serves and where posted messages are counted (declared with
#: the host's members, :class:`~agentik.transports.base.HostMetrics`).
MetricsSource = HostMetrics


#: Longest title taken from a conversation's first message.
TITLE_CHARS = 60
#: Deepest nesting of arrays and objects a request body may have.
MAX_JSON_DEPTH = 32


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests arrays/objects more than ``limit`` levels (no recursion)."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _json_media_type(value: str) -> bool:
    """``application/json``, with parameters allowed (a charset must be UTF-8)."""
    mime, _, params = value.partition(";")
    if mime.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        name, _, arg = param.partition("=")
        if name.strip().lower() == "charset" and arg.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


_UNPRINTABLE = re.compile(UNPRINTABLE)


def _title_from(content: str) -> str:
    """A conversation's title from its first message: its first non-empty line, cut."""
    visible = (_UNPRINTABLE.sub("", ln.replace("\t", " ")).strip() for ln in content.splitlines())
    line = next((ln for ln in visible if ln), "")
    return line[:TITLE_CHARS]


def _said(body: NewMessageBody) -> str:
    """A message's words, or for one that is only attachments their names
    (``[attached: cat.png]``): what a linked channel is shown, what names a
    conversation."""
    if body.content.strip():
        return body.content
    names = ", ".join(a.name or "an attachment" for a in body.attachments)
    return f"[attached: {names}]"


def _file_name(name: str) -> str:
    """An uploaded file's name as shown: one line, visible characters, no path."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    return _UNPRINTABLE.sub("", " ".join(name.split()))[:NAME_CHARS]


#: What is said in ``Content-Type`` for a stored attachment's (sniffed) type.
_SERVED_TYPE = {"text/plain": "text/plain; charset=utf-8"}
#: Room for the multipart framing around the file (headers, boundaries, field names).
_MULTIPART_SLACK = 16 * 1024


def _served_headers(record: Any) -> dict[str, str]:
    """Headers of a served attachment: its type as sniffed when stored, never sniffed
    again by the browser, never run as a page (sandboxed, no sub-resources), and
    downloaded rather than shown unless it is an image."""
    ext = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
           "application/pdf": "pdf", "text/plain": "txt"}.get(record.media_type, "bin")  # fmt: skip
    how = "inline" if record.media_type in IMAGE_TYPES else "attachment"
    return {
        "content-type": _SERVED_TYPE.get(record.media_type, record.media_type),
        "x-content-type-options": "nosniff",
        "content-security-policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'",
        "content-disposition": f'{how}; filename="{record.sha256[:16]}.{ext}"',
        "cross-origin-resource-policy": "same-origin",
        # Content-addressed: the bytes under this URL never change.
        "cache-control": "private, max-age=86400, immutable",
    }


def _conversation_json(conv: Conversation) -> dict[str, Any]:
    """A conversation as the API shows it."""
    caps = conv.capabilities
    return {
        "id": conv.id,
        "title": conv.title,
        "temp": conv.temp,
        "channel_key": conv.channel_key,
        "created_at": conv.created_at,
        "updated_at": conv.updated_at,
        "busy": conv.busy,
        "running_run_id": conv.running_run_id,
        "queued": conv.queued,
        "parent": _parent_json(conv.meta),
        # What its model takes and gives (images and files: docs/images-and-files.md).
        "capabilities": {"image_in": caps.image_in, "image_out": caps.image_out},
    }


def channel_of(channel_key: Any, meta: Mapping[str, Any]) -> str | None:
    """The channel that decides who sees a conversation: its own, or — a child run's
    conversation, which has none — the channel its run tree started in."""
    if isinstance(channel_key, str):
        return channel_key
    inherited = meta.get("parent_channel_key")
    return inherited if isinstance(inherited, str) else None


def _parent_json(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """Where a child run's conversation (an ``[agents.*]`` agent called as a tool)
    comes from — the fields of the parent's ``child_run_linked`` event: the parent's
    conversation and run, its tool call, the child's run and agent.  ``None``: a
    top-level conversation."""
    parent = meta.get("parent_conversation_id")
    if not isinstance(parent, str) or not parent:
        return None

    def text(key: str) -> str | None:
        value = meta.get(key)
        return value if isinstance(value, str) else None

    return {
        "conversation_id": parent,
        "run_id": text("parent_run_id"),
        "call_id": text("parent_call_id"),
        "child_run_id": text("run_id"),
        "agent": text("agent"),
    }


def _unaddressable(cid: str) -> str | None:
    """Why ``cid`` cannot be a conversation's id in this API, or ``None``.

    A path segment never holds ``/`` (not even as ``%2F``: it is decoded before
    routing), and browsers and proxies resolve ``.`` and ``..`` away: such a
    conversation could never be read, answered or deleted.  Control characters
    (line breaks, NUL) would reach logs and headers as they are."""
    if "/" in cid:
        return "it holds a /, which no URL path segment can carry"
    if cid in (".", ".."):
        return f"{cid!r} is a path segment browsers and proxies resolve away"
    if any(unicodedata.category(ch) == "Cc" for ch in cid):
        return "it holds a control character"
    return None


def _attachment(cid: str) -> str:
    """``Content-Disposition`` of an export: a header carries Latin-1 only (and no
    quote or line break), so a plain ASCII name plus the exact one in RFC 5987 form."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", cid)
    exact = quote(f"conversation-{cid}.json", safe="")
    return f"attachment; filename=\"conversation-{plain}.json\"; filename*=UTF-8''{exact}"


def _inline_hashes(page: str, tag: str) -> list[str]:
    """CSP source expressions (``'sha256-…'``) of the page's inline ``<tag>`` elements."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"
        for text in found
    ]


def page_headers(page: str) -> dict[str, str]:
    """The web page's response headers: no caching, and a Content-Security-Policy
    that runs only the page's own inline script and style and its own files under
    ``/static/`` (the vendored libraries: never another site's), lets it talk only to
    its own origin, and forbids framing it (another site's page could otherwise
    show it in an invisible frame and have the user click Approve or Delete)."""
    policy = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join([*_inline_hashes(page, "script"), "'self'"]),
            # 'self': KaTeX's stylesheet and fonts, loaded when a message holds math.
            "style-src " + " ".join([*_inline_hashes(page, "style"), "'self'"]),
            "font-src 'self'",
            "connect-src 'self'",
            # blob: the thumbnails of attachments (fetched with the token).
            "img-src data: blob:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return {
        "cache-control": "no-cache",
        "content-security-policy": policy,
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
    }


@dataclass(frozen=True)
class _Asset:
    """One of the page's static files: its bytes, gzip-compressed once (``None``: a
    font, compressed already), its ETag and its media type."""

    body: bytes
    gzipped: bytes | None
    etag: str
    media_type: str


#: What ``/static/`` serves, by ending: the page's scripts, and KaTeX's stylesheet and
#: fonts (loaded only when a message holds math).  Nothing else (no HTML, no licences).
_STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".woff2": "font/woff2",
}


@functools.cache
def _assets() -> dict[str, _Asset]:
    """The page's files under ``static/`` (``highlight.js``, ``vendor/**/*.js``, KaTeX's
    ``.css`` and ``.woff2``), by path; read once, when the page first asks for one."""
    root = resources.files(__package__).joinpath("static")
    found: dict[str, _Asset] = {}

    def walk(folder: Traversable, prefix: str) -> None:
        for item in folder.iterdir():
            if item.is_dir():
                walk(item, prefix + item.name + "/")
            elif (media := _STATIC_TYPES.get("." + item.name.rpartition(".")[2])) is not None:
                body = item.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
                packed = None if media.startswith("font/") else gzip.compress(body, 9, mtime=0)
                found[prefix + item.name] = _Asset(body, packed, etag, media)

    walk(root, "")
    return found


@functools.cache
def static_version() -> str:
    """The version of the files under ``static/`` (a digest of their ETags): a URL that
    names it (``?v=``, as the page asks for its script and libraries) may be cached for
    good, since a changed file changes it."""
    tags = "".join(f"{path}={asset.etag}" for path, asset in sorted(_assets().items()))
    return hashlib.sha256(tags.encode()).hexdigest()[:20]


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):  # "" too: the OpenAPI document says integer
        raise ApiError(422, "invalid_parameter", f"{name} must be an integer")
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(422, "invalid_parameter", f"{name} must be between {low} and {high}")
    return value


def _wants_plain_text(request: Request) -> bool:
    """``Accept`` names ``text/plain`` and not JSON: the caller wants a bare word."""
    accept = request.headers.get("accept", "").lower()
    return "text/plain" in accept and "json" not in accept


Handler = Callable[[Request], Awaitable[Any]]

_INTEGER = re.compile(r"-?[0-9]{1,20}")


class Api:
    """The route handlers, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.agent = ctx.agent
        self.prefix = ctx.settings.prefix
        #: The no-token caller, limited to ``local_channels``.
        self.local = local_principal(ctx.settings)
        self.browser_guard = Guard.from_settings(ctx.settings, tokens=ctx.tokens.enabled)
        self.page_headers = page_headers(ctx.page) if ctx.page is not None else {}
        self._page_gzipped: bytes | None = None
        if ctx.agent.turn_queue is not None:
            # Turns posted here and queued are run through this API on any worker.
            ctx.agent.turn_queue.front_end(f"http:{ctx.instance}", self.run_queued)

    # -- helpers -------------------------------------------------------------------------
    @property
    def gate(self) -> Gate:
        """The host's admission gate as it is now (a reload replaces its policy),
        counting for the budgets this API started with."""
        host = self.ctx.host
        gate = host.gate if host is not None else Gate()
        return gate.with_budgets(self.ctx.budgets)

    def speaker(
        self, principal: Principal, channel_key: str, *, author: str | None = None, text: str = ""
    ) -> Speaker:
        """The caller at the gate: a token is a verified identity (``http:token:<name>``
        patterns), presented as a chat message would present them."""
        message = IncomingMessage(
            channel_key=channel_key, text=text, author_id=principal.name,
            author_name=author or principal.name, direct=bool(text), addressed=bool(text),
        )  # fmt: skip
        return Speaker.of(self.ctx.instance, message)

    def _settings(self, speaker: Speaker, channel: str | None) -> TurnSettings:
        """What a turn posted here runs with: this API's own settings — the agent's,
        within the transport's ``allowed_tools`` — in its own conversations and in
        another transport's alike (a chat channel's persona, tools and model stay
        that channel's turns'), and who posted it."""
        bound = DEFAULT_SETTINGS.allowing(self.ctx.allowed_tools, default=self.agent.policy)
        return bound.with_origin(TurnOrigin.of_speaker(speaker, channel))

    def principal(self, request: Request) -> Principal:
        found = self.ctx.tokens.lookup(request.headers.get("authorization"))
        if found is LOCAL:
            return self.local
        if found is None:
            raise ApiError(
                401,
                "unauthorized",
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="agentik"'},
            )
        return found

    def own_prefix(self, principal: Principal) -> str:
        """The channel-key prefix of the conversations this token creates (its own)."""
        return f"http:{self.ctx.instance}:{principal.name}:"

    def _ours(self, channel_key: str | None) -> bool:
        return channel_key is not None and channel_key.startswith(f"http:{self.ctx.instance}:")

    async def conversation(self, request: Request, principal: Principal) -> Conversation:
        cid = request.path_params["conversation_id"]
        try:
            conv = await self.agent.get_conversation(cid)
        except NotFound:
            conv = None
        if conv is None or not principal.allows(channel_of(conv.channel_key, conv.meta)):
            # Conversations a token may not see look exactly like unknown ones.
            raise ApiError(404, "conversation_not_found", f"no conversation {cid!r}")
        return conv

    async def body(
        self, request: Request, model: type[_Body], *, required: bool, limit: int | None = None
    ) -> Any:
        limit = limit or self.ctx.settings.max_body_bytes
        too_large = ApiError(
            413, "body_too_large", f"the request body is larger than {limit} bytes"
        )
        # JSON only: a form or text/plain body is what another site's page can
        # send without asking (no CORS preflight), so it is never taken.
        media_type = request.headers.get("content-type")
        not_json = ApiError(
            415,
            "unsupported_media_type",
            "send the body as JSON, with Content-Type: application/json"
            + (f" (not {media_type[:100]!r})" if media_type else ""),
        )
        if media_type is not None and not _json_media_type(media_type):
            raise not_json
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise too_large
        if not data:  # (no body; one of only blanks is not JSON: refused below)
            if required:
                raise ApiError(422, "invalid_body", "a JSON object is required")
            return model()
        if media_type is None:
            raise not_json
        too_deep = ApiError(
            422, "invalid_body", f"the body nests arrays or objects over {MAX_JSON_DEPTH} levels"
        )
        try:
            parsed = json.loads(data)
        except RecursionError:
            # Nesting deeper than the parser's own stack: deeper than ours too.
            raise too_deep from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(422, "invalid_body", f"the body is not valid JSON: {exc}") from None
        except ValueError:
            # Python's guard against huge integers (its message names interpreter settings).
            raise ApiError(
                422, "invalid_body", "the body is not valid JSON: a number has too many digits"
            ) from None
        if _deeper_than(parsed, MAX_JSON_DEPTH):
            raise too_deep
        if not isinstance(parsed, dict):
            raise ApiError(422, "invalid_body", "the body must be a JSON object")
        try:
            return model.model_validate(parsed)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "body"
            if err["type"] == "extra_forbidden":
                what = "unknown field"
            elif err["type"] == "value_error":
                what = str(err["ctx"]["error"])
            else:
                what = err["msg"]
            raise ApiError(422, "invalid_body", f"{where}: {what}") from None

    def _after(self, request: Request) -> int | None:
        raw = request.headers.get("last-event-id")
        name = "Last-Event-ID"
        if raw is None or not raw.strip():
            raw, name = request.query_params.get("after"), "after"
        if raw is None or not raw.strip():
            return None
        raw = raw.strip()
        if not re.fullmatch(r"[0-9]{1,18}", raw):
            raise ApiError(422, "invalid_parameter", f"{name} must be an event id (an integer)")
        return int(raw)

    def _profile(self, request: Request) -> str:
        """The stream profile named by ``?profile=`` (default ``debug``): a built-in
        or a ``[profiles.<name>]`` of the configuration."""
        profile = request.query_params.get("profile") or "debug"
        known = self.agent.stream_profiles
        if profile not in known:
            raise ApiError(
                422,
                "invalid_parameter",
                f"profile must be one of {', '.join(sorted(known))} (no profile {profile[:64]!r})",
            )
        return profile

    def _stream(
        self,
        subscription: Any,
        *,
        global_ids: bool,
        accept: Callable[[EventBase], Awaitable[bool]] | None = None,
    ) -> EventStream:
        stream = EventStream(
            subscription,
            cache=self.ctx.cache,
            heartbeat=self.ctx.settings.heartbeat,
            global_ids=global_ids,
            accept=accept,
            on_close=self.ctx.streams.discard,
        )
        self.ctx.streams.add(stream)
        return stream

    # -- routes ---------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """Liveness: ``status`` ok while the agent runs, with the components' states."""
        running = self.agent.state.value == "running" and not self.ctx.closing
        status = "ok" if running else "unavailable"
        if _wants_plain_text(request):
            # The standalone seed's probes read a bare word: same word, same code.
            return PlainTextResponse(status + "\n", status_code=200 if running else 503)
        body = {"status": status, **self._health_detail(request)}
        return JSONResponse(body, status_code=200 if running else 503)

    def _health_detail(self, request: Request) -> dict[str, Any]:
        """Components' states; their reasons only for a caller with a valid token."""
        detail = self.agent.health.detail()
        if (
            self.ctx.tokens.enabled
            and self.ctx.tokens.lookup(request.headers.get("authorization")) is None
        ):
            return without_reasons(detail)
        return detail

    async def ready(self, request: Request) -> Response:
        """Readiness: 200 when every transport is connected (see agentik.core.health)."""
        detail = self._health_detail(request)
        ready = detail["ready"] and self.agent.state.value == "running" and not self.ctx.closing
        body = {"status": "ready" if ready else "not ready", **detail, "ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def status(self, request: Request) -> Response:
        """What ``agentik status`` shows; busy conversations the caller may see."""
        principal = self.principal(request)
        return JSONResponse(status_of(self.agent, self.agent.health, principal.allows))

    async def metrics(self, request: Request) -> Response:
        """The Prometheus exposition: ``metrics_token`` if set, else an API token, else open."""
        source = self.ctx.metrics
        assert source is not None
        required = self.ctx.metrics_token
        header = request.headers.get("authorization") or ""
        if required is not None:
            scheme, _, value = header.strip().partition(" ")
            presented = value.strip().encode("utf-8", "surrogateescape")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(required, presented)
        else:
            ok = self.ctx.tokens.lookup(header or None) is not None
        if not ok:
            raise ApiError(
                401,
                "unauthorized",
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="agentik-metrics"'},
            )
        body, content_type = source.render()
        return Response(body, headers={"Content-Type": content_type})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(
            openapi_document(
                self.prefix,
                auth=self.ctx.tokens.enabled,
                guarded=self.browser_guard.check_host or self.browser_guard.check_origin,
                profiles={
                    name: sp.description
                    for name, sp in self.agent.stream_profiles.items()
                    if name not in PROFILES
                },
            )
        )

    async def page(self, request: Request) -> Response:
        assert self.ctx.page is not None
        if "gzip" not in request.headers.get("accept-encoding", ""):
            return HTMLResponse(self.ctx.page, headers=self.page_headers)
        if self._page_gzipped is None:
            self._page_gzipped = gzip.compress(self.ctx.page.encode(), 9, mtime=0)
        headers = {**self.page_headers, "content-encoding": "gzip", "vary": "accept-encoding"}
        return HTMLResponse(self._page_gzipped, headers=headers)

    async def static(self, request: Request) -> Response:
        """The page's scripts, KaTeX's stylesheet and fonts (vendored libraries):
        revalidated by ETag, or kept for good when the URL names the files' version
        (``?v=``: a reload then asks for nothing); gzip when the browser takes it (not
        the fonts: woff2 is compressed); nothing else under ``static/`` is served."""
        asset = _assets().get(request.path_params["path"])
        if asset is None:
            raise ApiError(404, "not_found", "no such file")
        versioned = request.query_params.get("v") == static_version()
        headers = {
            "cache-control": "max-age=31536000, immutable" if versioned else "no-cache",
            "etag": asset.etag,
            "vary": "accept-encoding",
            "x-content-type-options": "nosniff",
        }
        if asset.etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        body = asset.body
        if asset.gzipped is not None and "gzip" in request.headers.get("accept-encoding", ""):
            body = asset.gzipped
            headers["content-encoding"] = "gzip"
        return Response(body, media_type=asset.media_type, headers=headers)

    async def create_conversation(self, request: Request) -> Response:
        principal = self.principal(request)
        body = await self.body(request, NewConversationBody, required=False)
        prefix = self.own_prefix(principal)
        if not principal.allows(prefix):
            raise ApiError(
                403,
                "forbidden",
                f"this token may not create conversations (they would be bound to {prefix}…)",
            )
        cid = uuid.uuid4().hex
        conv = await self.agent.create_conversation(
            title=body.title, temp=body.temp, conversation_id=cid, channel_key=prefix + cid
        )
        return JSONResponse(
            _conversation_json(conv),
            status_code=201,
            headers={"location": f"{self.prefix}/conversations/{cid}"},
        )

    async def list_conversations(self, request: Request) -> Response:
        principal = self.principal(request)
        offset = _int_param(request, "offset", 0, 0, 1_000_000)
        limit = _int_param(request, "limit", 50, 1, 200)
        assert offset is not None and limit is not None
        children = request.query_params.get("children", "include")
        if children not in CHILDREN:
            raise ApiError(422, "invalid_parameter", "children must be include, exclude or only")
        if principal.prefixes is None and children == "include":
            records = await self.agent.list_conversations(limit=limit + 1, offset=offset)
        else:

            def listed(r: ConversationRecord) -> bool:
                if not principal.allows(channel_of(r.meta.get("channel_key"), r.meta)):
                    return False
                return children == "include" or (
                    (_parent_json(r.meta) is not None) == (children == "only")
                )

            # Filter, then page: scan the newest first until the page is full.
            records, scanned, batch = [], 0, 200
            while len(records) <= offset + limit:
                chunk = await self.agent.list_conversations(limit=batch, offset=scanned)
                records += [r for r in chunk if listed(r)]
                scanned += len(chunk)
                if len(chunk) < batch:
                    break
            records = records[offset : offset + limit + 1]
        items = []
        for record in records[:limit]:
            try:
                conv = await self.agent.get_conversation(record.id)
            except NotFound:
                continue  # deleted meanwhile
            items.append(_conversation_json(conv))
        more = len(records) > limit
        return JSONResponse(
            {
                "items": items,
                "offset": offset,
                "limit": limit,
                "next_offset": offset + limit if more else None,
            }
        )

    async def search(self, request: Request) -> Response:
        """Full-text search over the audit log of the conversations the caller may
        see: their user and assistant messages holding every word of ``q``."""
        principal = self.principal(request)
        if "q" not in request.query_params:
            raise ApiError(422, "invalid_parameter", "q: the words to search for are required")
        query = request.query_params["q"]
        offset = _int_param(request, "offset", 0, 0, 10_000)
        limit = _int_param(request, "limit", 20, 1, 100)
        assert offset is not None and limit is not None
        if not search_terms(query):
            # Punctuation alone (a box being typed into) finds nothing, as in the store.
            return JSONResponse(
                {"items": [], "offset": offset, "limit": limit, "next_offset": None}
            )
        store = self.agent.store
        if "search" not in store.capabilities:
            raise ApiError(501, "not_supported", "this bot's store keeps no search index")
        titles: dict[str, str | None] = {}  # conversation -> its title, None: not visible

        async def visible(cid: str) -> str | None:
            if cid not in titles:
                record = await store.get_conversation(cid)
                seen = record is not None and principal.allows(
                    channel_of(record.meta.get("channel_key"), record.meta)
                )
                titles[cid] = record.title if seen and record is not None else None
            return titles[cid]

        # Filter, then page: read the newest hits until the page is full (a token
        # that sees every conversation pages the index directly).
        hits: list[tuple[SearchHit, str]] = []
        scanned, batch = 0, 200
        if principal.prefixes is None:
            scanned, batch = offset, limit + 1
        while len(hits) <= (0 if principal.prefixes is None else offset) + limit:
            chunk = await store.search_messages(query, limit=batch, offset=scanned)
            for h in chunk:
                title = await visible(h.conversation_id)
                if title is not None:
                    hits.append((h, title))
            scanned += len(chunk)
            if len(chunk) < batch or principal.prefixes is None:
                break
        if principal.prefixes is not None:
            hits = hits[offset:]
        more = len(hits) > limit
        return JSONResponse(
            {
                "items": [
                    {**dataclasses.asdict(h), "conversation_title": title}
                    for h, title in hits[:limit]
                ],
                "offset": offset,
                "limit": limit,
                "next_offset": offset + limit if more else None,
            }
        )

    async def get_conversation(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        doc = _conversation_json(conv)
        if doc["running_run_id"] is None:
            doc["running_run_id"] = await self._running_elsewhere(conv)
        return JSONResponse(doc)

    async def _running_elsewhere(self, conv: Conversation) -> str | None:
        """The turn of ``conv`` another worker runs (several workers: as its stored
        events say), so a reader opening the conversation here follows it rather than
        taking its question for unanswered; ``None`` on one process."""
        queue = self.agent.turn_queue
        if queue is None or conv.running_run_id is not None:
            return None
        return await queue.running_elsewhere(conv.id)

    async def export_conversation(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        # A temp conversation lives in the agent's in-memory store.
        store = self.agent.store_for(conv)
        doc = await export_conversation(store, conv.id)
        if doc is None:
            raise ApiError(404, "conversation_not_found", f"no conversation {conv.id!r}")
        return JSONResponse(doc, headers={"content-disposition": _attachment(conv.id)})

    async def list_checkpoints(self, request: Request) -> Response:
        """``GET …/checkpoints``: the conversation's checkpoints, newest first."""
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        found = await conv.checkpoints()
        return JSONResponse({"items": [c.to_dict() for c in found]})

    async def take_checkpoint(self, request: Request) -> Response:
        """``POST …/checkpoints``: keep a snapshot of the conversation now (201)."""
        self._refuse_when_closing()
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, CheckpointBody, required=False)
        try:
            record = await conv.checkpoint(body.label)
        except NotFound:
            raise ApiError(404, "conversation_not_found", f"no conversation {conv.id!r}") from None
        except CheckpointLimit as exc:
            # Refused, not made room for: each kept one was taken on purpose.
            how = (
                f"; delete one first: DELETE {request.url.path}/{{checkpoint_id}}"
                if exc.limit > 0
                else ""
            )
            raise ApiError(409, "checkpoint_limit", f"{exc}{how}") from None
        return JSONResponse(record.to_dict(), status_code=201)

    @staticmethod
    def _checkpoint_id(request: Request) -> int | None:
        """The path's ``checkpoint_id`` (``None``: past the engines' 64-bit integers,
        so it names no checkpoint)."""
        try:
            checkpoint_id = int(request.path_params["checkpoint_id"])
        except ValueError:
            raise ApiError(422, "invalid_parameter", "checkpoint_id must be an integer") from None
        return checkpoint_id if 0 < checkpoint_id < 2**62 else None

    async def get_checkpoint(self, request: Request) -> Response:
        """``GET …/checkpoints/{checkpoint_id}``: that checkpoint's snapshot (it imports
        like an export)."""
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        checkpoint_id = self._checkpoint_id(request)
        doc = None if checkpoint_id is None else await conv.checkpoint_document(checkpoint_id)
        if doc is None:
            raise ApiError(
                404,
                "checkpoint_not_found",
                f"no checkpoint {request.path_params['checkpoint_id']} in this conversation",
            )
        return JSONResponse(doc)

    async def delete_checkpoint(self, request: Request) -> Response:
        """``DELETE …/checkpoints/{checkpoint_id}``: forget that checkpoint (204); one
        taken by hand makes room for another.  As deleting the conversation: any
        caller that sees it."""
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        checkpoint_id = self._checkpoint_id(request)
        if checkpoint_id is None or not await conv.delete_checkpoint(checkpoint_id):
            raise ApiError(
                404,
                "checkpoint_not_found",
                f"no checkpoint {request.path_params['checkpoint_id']} in this conversation",
            )
        return Response(status_code=204)

    async def import_conversation(self, request: Request) -> Response:
        self._refuse_when_closing()
        principal = self.principal(request)
        prefix = self.own_prefix(principal)
        if not principal.allows(prefix):
            raise ApiError(
                403,
                "forbidden",
                f"this token may not create conversations (they would be bound to {prefix}…)",
            )
        if not self._may_import(principal, prefix):
            raise ApiError(
                403,
                "forbidden",
                "importing a snapshot needs a role ranking as admin ([access] admins or owners)"
                " or a token without a channels limit",
            )
        raw = request.query_params.get("ids", "new")
        if raw not in ("new", "keep"):
            raise ApiError(422, "invalid_parameter", "ids: must be new or keep")
        body = await self.body(
            request, SnapshotBody, required=True, limit=self.ctx.settings.max_import_bytes
        )
        doc = body.model_dump()
        try:
            validate_snapshot(doc)
        except SnapshotError as exc:
            raise ApiError(422, "invalid_snapshot", str(exc)) from None
        if (why := _unaddressable(doc["conversation"]["id"])) is not None:
            # Checked whether kept or not: the document (SNAPSHOT_ID_PATTERN) says so.
            raise ApiError(422, "invalid_snapshot", f"conversation.id: {why}")
        for i, kept in enumerate(doc.get("checkpoints") or []):
            # A checkpoint's document imports as a conversation later: the same rule.
            inner = kept.get("document") if isinstance(kept, dict) else None
            of = inner.get("conversation") if isinstance(inner, dict) else None
            inner_id = of.get("id") if isinstance(of, dict) else None
            if isinstance(inner_id, str) and (why := _unaddressable(inner_id)) is not None:
                where = f"checkpoints[{i}].document.conversation.id"
                raise ApiError(422, "invalid_snapshot", f"{where}: {why}")
        cid = uuid.uuid4().hex if raw == "new" else doc["conversation"]["id"]
        # The conversation joins this token's channels, like one it created.
        doc["conversation"] = {**doc["conversation"], "id": cid}
        try:
            await import_conversation(
                self.agent.store, doc, bind=prefix + cid,
                max_bytes=self.agent.attachments.max_bytes,
            )  # fmt: skip
        except SnapshotError as exc:
            code = "conversation_exists" if "already exists" in str(exc) else "invalid_snapshot"
            raise ApiError(409 if code == "conversation_exists" else 422, code, str(exc)) from None
        conv = await self.agent.get_conversation(cid)
        return JSONResponse(
            _conversation_json(conv),
            status_code=201,
            # A kept id may be any text: the header is ASCII (percent-encoded).
            headers={"location": f"{self.prefix}/conversations/{quote(cid, safe='')}"},
        )

    def _may_import(self, principal: Principal, prefix: str) -> bool:
        """Who may import a snapshot (an admin-level right, like redacting others'
        messages): a token whose role ranks as ``admin`` or above, or a token without
        a ``channels`` limit (it already reads and deletes every conversation).  What
        a snapshot holds grants nothing either way (agentik.core.lifecycle)."""
        if principal.prefixes is None:
            return True
        if self.ctx.host is None:
            return False
        return self.gate.admin(self.speaker(principal, prefix), prefix)

    async def rename_conversation(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, RenameBody, required=True)
        await conv.rename(body.title)
        return JSONResponse(_conversation_json(conv))

    async def delete_conversation(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        try:
            await self.agent.delete_conversation(conv.id)
        except NotFound:
            raise ApiError(404, "conversation_not_found", f"no conversation {conv.id!r}") from None
        return Response(status_code=204)

    async def post_message(self, request: Request) -> Response:
        self._refuse_when_closing()  # a stopping bot starts no new turn
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, NewMessageBody, required=True)
        return await self._post(principal, conv, body)

    async def regenerate(self, request: Request) -> Response:
        """The last question again, in a new branch (its earlier answer stays in the
        audit log, out of the model's context)."""
        principal, conv, body, asked = await self._branching(
            request, BranchBody, required=False, verb="regenerate"
        )
        attached = _attached_to(asked)
        redacted = isinstance(asked.data, dict) and "redacted" in asked.data
        if redacted or (not asked.content.strip() and not attached):
            # (its words are a placeholder now; or its only parts were links)
            raise ApiError(
                409, "cannot_branch",
                "the last question was redacted or has nothing left to ask again: edit it instead",
            )  # fmt: skip
        message = NewMessageBody(
            content=asked.content, author=body.author or asked.author, attachments=attached
        )
        return await self._post(principal, conv, message, branch_of=asked.id)

    async def edit_last(self, request: Request) -> Response:
        """``content`` in place of the last question, in a new branch (the question
        and its answer stay in the audit log, out of the model's context)."""
        principal, conv, body, asked = await self._branching(
            request, EditBody, required=True, verb="edit"
        )
        # The question's images and files stay with the new words (as a chat page's
        # edit keeps them): only the text is replaced.
        message = NewMessageBody(
            content=body.content, author=body.author, attachments=_attached_to(asked)
        )
        return await self._post(principal, conv, message, branch_of=asked.id)

    async def _branching(
        self, request: Request, model: type[_Body], *, required: bool, verb: str
    ) -> tuple[Principal, Conversation, Any, Message]:
        """What a new branch starts from: the caller, the conversation, the request's
        body, and the last question (a 409 when there is none to ``verb``)."""
        self._refuse_when_closing()
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, model, required=required)
        queue = self.agent.turn_queue
        if queue is not None and self._ours(conv.channel_key):
            # Several workers: the turn queue runs this conversation's turns, maybe
            # elsewhere; its working memory as stored, not as this worker last saw it.
            if await queue.turn_pending(conv.id):
                raise ApiError(
                    409, "cannot_branch",
                    "a turn is running or queued: stop it or wait for it first",
                )  # fmt: skip
            queue.refresh(conv)
        asked = await conv.last_question()
        if asked is None:
            raise ApiError(409, "cannot_branch", f"there is no question to {verb}")
        return principal, conv, body, asked

    async def _post(
        self,
        principal: Principal,
        conv: Conversation,
        body: NewMessageBody,
        *,
        branch_of: int | None = None,
    ) -> Response:
        """A message posted (or a branch: ``branch_of``, the question it replaces)
        through the gate, as a chat message is."""
        accepted = await self.accept_message(principal, conv, body, branch_of=branch_of)
        return JSONResponse(accepted, status_code=202)

    async def accept_message(
        self,
        principal: Principal,
        conv: Conversation,
        body: NewMessageBody,
        *,
        branch_of: int | None = None,
    ) -> dict[str, Any]:
        """What :meth:`_post` does, its answer as a dict (``run_id``…); refusals raise
        :class:`ApiError` (the A2A endpoint, :mod:`.a2a`, posts through it too)."""
        branch = branch_of is not None
        if branch and (conv.running_run_id is not None or conv.queued):
            raise ApiError(
                409, "cannot_branch", "a turn is running or queued: stop it or wait for it first"
            )
        ours = self._ours(conv.channel_key)
        # A message posted into another transport's conversation is recorded
        # as coming from this API, not from that channel.
        channel = conv.channel_key if ours else f"http:{self.ctx.instance}:{principal.name}"
        author = body.author or principal.name
        # The gate, as for a chat message: access decision, budgets, submit and bind.
        gate = self.gate
        # The token's name is the verified identity (http:token:<name> patterns).
        asked = conv.channel_key or channel or ""
        speaker = self.speaker(principal, asked, author=author, text=body.content)
        decision = gate.decide(speaker, asked)
        if not decision.answer:
            raise ApiError(403, "forbidden", "this token may not ask the bot here")
        if self.ctx.metrics is not None:
            self.ctx.metrics.message_in(self.ctx.instance)
        ticket = await self._admit(
            gate, principal, channel or f"conversation:{conv.id}", author, body.content
        )
        queue = self.agent.turn_queue
        # Several workers (a shared store): this API's conversations are served by any
        # worker through the turn queue; a steer, an interrupt or the answer to a
        # question go straight in where this worker runs the conversation already.
        questions = self.agent.questions
        queued = (
            queue is not None
            and ours
            and not (queue.holds(conv.id) and (body.busy != "queue" or conv.awaiting_human))
            # The turn of another worker asked (ask_user): this message answers it there.
            and not (questions.shared and await questions.waits_elsewhere(conv.id))
        )
        steered = False
        content: Content = body.content
        if body.attachments:
            # (Queued, they go by reference: the queued message names them by hash.)
            words = [TextPart(text=body.content)] if body.content.strip() else []
            content = [
                *words,
                *(ImagePart(sha256=a.sha256, name=a.name) for a in body.attachments),
            ]  # (the conversation takes each part's type from what it stored)
        if self.ctx.host is not None:
            # A linked conversation: its chat channels render the answer from its start.
            await self.ctx.host.posting(conv.id, self.ctx.instance)
        try:
            async with ticket:
                if queue is not None and queued:
                    payload = {"via": f"http:{self.ctx.instance}", "token": principal.name,
                               "author": author, "asked": asked, "channel": channel}  # fmt: skip
                    # ``interrupt`` through a worker that does not run the turn: the
                    # worker running it is asked to stop it (this one is queued after).
                    running = (
                        await queue.running_elsewhere(conv.id)
                        if body.busy in ("interrupt", "steer")
                        else None
                    )
                    stop = running if body.busy == "interrupt" else None
                    if body.busy == "steer" and running is not None:
                        # ``steer`` through a worker that does not run the turn: queued
                        # (nothing lost), and the worker running it takes it in.
                        payload["steer"] = running
                    run_id, here = await queue.submit(
                        conv, content, author=author,
                        author_id=f"{self.ctx.instance}:{principal.name}", channel=channel,
                        settings=self._settings(speaker, channel), payload=payload,
                        branch_of=branch_of,
                    )  # fmt: skip
                    if stop is not None:
                        await queue.stop_elsewhere(conv.id, stop)
                    if here:
                        ticket.bind(run_id, chars=len(body.content))
                    if "steer" in payload:
                        # As on one process: the running turn's run id (a message it
                        # does not reach gets a turn of its own, after it).
                        run_id, steered = str(payload["steer"]), True
                else:
                    sent = await ticket.submit(
                        conv,
                        content,
                        author=author,
                        author_id=f"{self.ctx.instance}:{principal.name}",
                        channel=channel,
                        allow_tool=decision.tools,
                        busy=body.busy,
                        settings=self._settings(speaker, channel),
                        branch=branch,
                    )
                    run_id, steered = sent.run_id, sent.steered
        except PromptRefused as exc:
            raise ApiError(422, "prompt_refused", str(exc)) from None
        except FormError as exc:  # a line answering a form (``-`` on a required question)
            raise ApiError(422, "invalid_answer", str(exc)) from None
        except AttachmentRejected as exc:
            # (the only refusal left: an attachment the conversation does not hold; not
            # 404, which would say the conversation is not found)
            raise ApiError(409, "attachment_not_found", str(exc)) from None
        except BranchError as exc:
            raise ApiError(409, "cannot_branch", str(exc)) from None
        if self.ctx.host is not None:
            # A linked conversation: the people in its chat channels see it said.
            await self.ctx.host.posted(conv.id, self.ctx.instance, author, _said(body))
        title = conv.title
        if ours and not title and queue is not None:
            # Another worker may have named it (this one's copy is older).
            record = await self.agent.store.get_conversation(conv.id)
            title = record.title if record is not None else title
        if ours and not title:
            # An untitled conversation of this API is named by its first message,
            # here and not by a client, so no reader races a second request for it.
            await conv.rename(_title_from(_said(body)))
            title = conv.title
        accepted: dict[str, Any] = {
            "conversation_id": conv.id,
            "run_id": run_id,
            "queued": conv.queued,
            "title": title,
            "steered": steered,
        }
        if branch:
            accepted["branch_of"] = branch_of
        return accepted

    async def run_queued(self, conv: Conversation, turn: Any, message: Any) -> Any:
        """A turn posted here and queued (several workers), claimed by this worker: the
        asker's rights and the turn's settings, decided again now as for a posted
        message (``None``: it may not ask any more)."""
        p = turn.payload
        asked, channel = str(p.get("asked") or ""), p.get("channel")
        incoming = IncomingMessage(
            channel_key=asked, text=message.content, author_id=str(p.get("token") or ""),
            author_name=str(p.get("author") or p.get("token") or ""), direct=True, addressed=True,
        )  # fmt: skip
        speaker = Speaker.of(self.ctx.instance, incoming)
        decision = self.gate.decide(speaker, asked)
        if not decision.answer:
            return None
        return decision.tools, self._settings(
            speaker, channel if isinstance(channel, str) else None
        )

    async def _admit(
        self, gate: Gate, principal: Principal, channel: str, author: str, text: str
    ) -> Ticket:
        """Check the budgets before a turn (429 when used up); the ticket that counts
        the turn for the caller."""
        ticket = await gate.admit(
            self.speaker(principal, channel, author=author, text=text), channel,
            chars=len(text), name=author,
        )  # fmt: skip
        refused, budgets = ticket.refused, gate.budgets
        if refused is not None and budgets is not None:
            wait = max(1, int(refused.resets_at - budgets.clock() + 0.999))
            if refused.reserved:
                # Used up only with running turns' reservations: worth a retry soon.
                wait = min(wait, RESERVED_RETRY_AFTER)
            raise ApiError(429, "budget_exceeded", refused.text, headers={"Retry-After": str(wait)})
        return ticket

    async def upload_attachment(self, request: Request) -> Response:
        """Store one file (multipart ``file`` field) for the conversation; its type
        from its bytes, at most ``[attachments] max_bytes``, read with that cap."""
        self._refuse_when_closing()
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        asked = conv.channel_key or self.own_prefix(principal)
        if not self.gate.decide(self.speaker(principal, asked, author=principal.name, text=""),
                                asked).answer:  # fmt: skip
            raise ApiError(403, "forbidden", "this token may not send here")
        max_bytes = self.agent.attachments.max_bytes
        media = request.headers.get("content-type", "")
        if not media.lower().startswith("multipart/form-data"):
            raise ApiError(
                415, "unsupported_media_type",
                "send the file as multipart/form-data, in a field named file",
            )  # fmt: skip
        limit = max_bytes + _MULTIPART_SLACK
        too_large = ApiError(
            413, "attachment_too_large", f"an attachment may be at most {max_bytes} bytes"
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        data = bytearray()
        async for chunk in request.stream():  # never more than the cap in memory
            data += chunk
            if len(data) > limit:
                raise too_large
        upload = await _form_file(request, bytes(data))
        name = _file_name(upload[0])
        try:
            media_type = check(upload[1], max_bytes, name=name)
        except AttachmentRejected as exc:
            if len(upload[1]) > max_bytes:
                raise too_large from None
            raise ApiError(415, "attachment_rejected", str(exc)) from None
        store = self.agent.store_for(conv)
        record = await store.attachment_put(conv.id, upload[1], media_type, at=time.time())
        url = f"{self.ctx.settings.prefix}/conversations/{conv.id}/attachments/{record.sha256}"
        return JSONResponse(
            {"sha256": record.sha256, "media_type": record.media_type, "size": record.size,
             "name": name, "kind": "image" if media_type in IMAGE_TYPES else "file",
             "url": url},
            status_code=201, headers={"location": url},
        )  # fmt: skip

    async def get_attachment(self, request: Request) -> Response:
        """The bytes of an attachment the conversation holds, with safe headers."""
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        sha = request.path_params["sha256"]
        store = self.agent.store_for(conv)
        record = await store.attachment_get(conv.id, sha) if _SHA.fullmatch(sha) else None
        data = await store.attachment_data(sha) if record is not None else None
        if record is None or data is None:
            raise ApiError(404, "attachment_not_found", "no such attachment here")
        return Response(data, headers=_served_headers(record))

    async def list_messages(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        after = _int_param(request, "after", None, 0, 2**62)
        before = _int_param(request, "before", None, 0, 2**62)
        offset = _int_param(request, "offset", None, 0, 1_000_000)
        limit = _int_param(request, "limit", 100, 1, 1000)
        assert limit is not None
        # With ``after`` or ``offset`` (counted from the oldest): a page forward;
        # without: the latest page (before ``before``), to scroll back from.
        rows = await conv.messages(after=after, before=before, offset=offset, limit=limit)
        full = len(rows) == limit
        forward = after is not None or offset is not None
        return JSONResponse(
            {
                "items": [m.to_dict() for m in rows],
                "next_after": rows[-1].id if full and forward else None,
                "prev_before": rows[0].id if full and not forward else None,
                "next_offset": offset + limit if full and offset is not None else None,
            }
        )

    async def conversation_status(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        status = conv.status(todo=await conv.todo())
        if status.run_id is None and (elsewhere := await self._running_elsewhere(conv)):
            status = dataclasses.replace(status, state="running", run_id=elsewhere)
        return JSONResponse(status.to_dict())

    async def interrupt(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, InterruptBody, required=False)
        running = conv.running_run_id
        if body.run_id is not None and body.run_id != running and await conv.withdraw(body.run_id):
            # A turn still waiting behind another: taken back, it never runs.
            return JSONResponse(
                {"conversation_id": conv.id, "run_id": body.run_id, "withdrawn": True},
                status_code=202,
            )
        queue = self.agent.turn_queue
        if running is None and queue is not None:
            # Several workers: the turn may run on another one, which is asked to stop it.
            elsewhere = await queue.running_elsewhere(conv.id)
            if elsewhere is not None and body.run_id in (None, elsewhere):
                await queue.stop_elsewhere(conv.id, elsewhere)
                return JSONResponse({"conversation_id": conv.id, "run_id": elsewhere},
                                    status_code=202)  # fmt: skip
            running = elsewhere
        if (
            queue is not None
            and body.run_id is not None
            and body.run_id != running
            and await self._queued_turn(conv, body.run_id)
            and await queue.withdraw(conv.id, body.run_id)
        ):
            # Waiting in the shared turn queue, on whichever worker runs the turns.
            return JSONResponse(
                {"conversation_id": conv.id, "run_id": body.run_id, "withdrawn": True},
                status_code=202,
            )
        if running is None:
            raise ApiError(409, "no_turn_running", "no turn is running in this conversation")
        if body.run_id is not None and body.run_id != running:
            raise ApiError(409, "run_not_running", f"run {body.run_id!r} is not the running turn")
        if conv.interrupting:
            raise ApiError(409, "turn_already_interrupted", f"run {running} is already stopping")
        await conv.interrupt()
        return JSONResponse({"conversation_id": conv.id, "run_id": running}, status_code=202)

    @staticmethod
    async def _queued_turn(conv: Conversation, run_id: str) -> bool:
        """Whether ``run_id`` is a turn of ``conv`` that may still wait in the turn
        queue: a user message of its latest rows (a queued turn's message is among
        them) carries it."""
        rows = await conv.messages(limit=_QUEUED_LOOK_BACK, kinds=("user",))
        return any(m.run_id == run_id for m in rows)

    async def conversation_events(self, request: Request) -> Any:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        after, profile = self._after(request), self._profile(request)
        replay = request.query_params.get("replay")
        if replay not in (None, "turn"):
            raise ApiError(422, "invalid_parameter", "replay must be turn (or left out)")
        self._refuse_when_closing()
        queue = self.ctx.settings.subscriber_queue
        cluster = self.agent.cluster_events
        from_turn = replay == "turn"
        if cluster is not None:
            # Workers: the turn may run on another one; same seq, replay included.
            sub: Any = await cluster.subscribe(
                conv, after=after, profile=profile, max_pending=queue, from_turn=from_turn
            )
        else:
            sub = conv.events(after=after, profile=profile, max_pending=queue, from_turn=from_turn)
        return self._stream(sub, global_ids=False)

    async def all_events(self, request: Request) -> Any:
        principal = self.principal(request)
        after, profile = self._after(request), self._profile(request)
        self._refuse_when_closing()
        cluster = self.agent.cluster_events
        sub: Any
        if cluster is not None:
            # Workers: every worker's stored events, ids the same on all of them.
            sub = await cluster.subscribe_all(
                after=after, profile=profile, max_pending=self.ctx.settings.subscriber_queue
            )
        else:
            sub = self.agent.events(
                after=after, profile=profile, max_pending=self.ctx.settings.subscriber_queue
            )
        accept = None if principal.prefixes is None else self._visible_to(principal)
        return self._stream(sub, global_ids=True, accept=accept)

    # -- approvals (issue 19) ------------------------------------------------------------
    async def list_approvals(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        state = request.query_params.get("state", "pending")
        if state not in ("pending", "all"):
            raise ApiError(422, "invalid_parameter", "state must be pending or all")
        approvals = self.agent.approvals
        if state == "pending":
            rows = await approvals.pending(conversation_id=conv.id)
        else:
            rows = list(await self.agent.store.approvals(conversation_id=conv.id, limit=200))
        # What the caller may do with each (the web page offers only those buttons):
        # the same rules as deciding (the gate's); a pending one only.
        gate, key = self.gate, conv.channel_key or ""
        who = self.speaker(principal, key)
        items = []
        for a in rows:
            pending = a.state == "pending"

            def may(approve: bool, a: Any = a) -> bool:
                return gate.may_decide(
                    who, key, approvers=a.approvers, asker_id=a.asker_id,
                    self_approve=a.self_approve, approve=approve, at_least=approvals.at_least,
                )  # fmt: skip

            approve, deny = pending and may(True), pending and may(False)
            items.append({**a.to_dict(), "may_approve": approve, "may_deny": deny})
        return JSONResponse({"items": items})

    async def decide_approval(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, DecisionBody, required=True)
        approval_id = request.path_params["approval_id"]
        approvals = self.agent.approvals
        # The caller, as a chat message would present them: a token is a verified identity.
        key = conv.channel_key or ""
        role = self.gate.role(self.speaker(principal, key), key)
        try:
            found = await approvals.find(approval_id, conversation_id=conv.id)
            done = await approvals.decide(
                found,
                body.decision,
                approver=principal.name,
                approver_id=f"{self.ctx.instance}:{principal.name}",
                role=role,
                reason=body.reason,
            )
        except ApprovalError as exc:
            status, code = {
                "not_found": (404, "approval_not_found"),
                "not_pending": (409, "approval_not_pending"),
            }.get(exc.code, (403, "forbidden"))
            raise ApiError(status, code, str(exc)) from None
        return JSONResponse(done.to_dict())

    async def answer_form(self, request: Request) -> Response:
        """A form (a multi-question ``ask_user``) answered as a JSON body, by the
        caller as a chat message would present them (the person asked, or anyone
        with ``answer_from = "anyone"``)."""
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, FormAnswerBody, required=True)
        try:
            question_id = int(request.path_params["question_id"])
        except ValueError:
            raise ApiError(422, "invalid_parameter", "question_id must be an integer") from None
        # The answerer is the token (a verified identity), as the question's rule needs.
        author_id = f"{self.ctx.instance}:{principal.name}"
        key = conv.channel_key or f"http:{self.ctx.instance}:{principal.name}"
        if not self.gate.decide(self.speaker(principal, key), key).answer:
            raise ApiError(403, "forbidden", "this token may not talk to the bot here")
        questions = self.agent.questions
        found = await questions.find_anywhere(conv.id, question_id)
        if found is None or not found.form:
            raise ApiError(404, "question_not_found", f"no form {question_id} waits here")
        if not may_answer(found, principal.name, author_id):
            raise ApiError(403, "forbidden", f"form {question_id} asks someone else")
        try:
            if body.submit:
                done = await conv.answer_form(
                    dict(body.answers), question_id=question_id, author=principal.name,
                    author_id=author_id,
                )  # fmt: skip
            else:
                done = None
                for fid, text in body.answers.items():
                    if text is None or not text.strip():
                        continue
                    done = await conv.answer_form(
                        {fid: text}, question_id=question_id, author=principal.name,
                        author_id=author_id, field=fid,
                    )  # fmt: skip
                if done is None:
                    raise FormError("no answer given")
        except FormError as exc:
            raise ApiError(422, "invalid_answer", str(exc)) from None
        except PromptRefused as exc:
            raise ApiError(422, "prompt_refused", str(exc)) from None
        if done is None:
            raise ApiError(404, "question_not_found", f"no form {question_id} waits here")
        q = done.question
        return JSONResponse(
            {
                "question_id": q.id,
                "done": done.done,
                "answered": [f["id"] for f in q.form if f["id"] in q.partial],
                "missing": list(done.missing) if not done.done else [],
            }
        )

    async def redact_message(self, request: Request) -> Response:
        principal = self.principal(request)
        conv = await self.conversation(request, principal)
        body = await self.body(request, RedactBody, required=False) or RedactBody()
        try:
            message_id = int(request.path_params["message_id"])
        except ValueError:
            raise ApiError(422, "invalid_parameter", "message_id must be an integer") from None
        if not 1 <= message_id < 2**63:
            raise ApiError(404, "message_not_found", f"no message {message_id} here")
        rows = await self.agent.store.messages(conv.id, after=message_id - 1, limit=1)
        if not rows or rows[0].id != message_id:
            raise ApiError(404, "message_not_found", f"no message {message_id} here")
        identity = f"{self.ctx.instance}:{principal.name}"
        gate = self.gate
        if gate.access.in_use:
            # As in chat (the gate's one rule): the author (the token that sent it) or
            # a role ranking as admin or above (owners too).  Without [access] (nobody
            # has a role) any caller reaching the conversation may, as documented.
            data = rows[0].data if isinstance(rows[0].data, dict) else {}
            key = conv.channel_key or ""
            if not gate.may_redact(self.speaker(principal, key), key, data.get("author_id")):
                raise ApiError(403, "forbidden", "only the author or an admin may redact it")
        try:
            done = await self.agent.redact(conv.id, message_id, by=identity, reason=body.reason)
        except NotFound as exc:
            raise ApiError(404, "message_not_found", str(exc)) from None
        except RedactionError as exc:
            raise ApiError(409, "already_redacted", str(exc)) from None
        return JSONResponse(dataclasses.asdict(done))

    def guard(self, handler: Handler) -> Handler:
        """Turn our errors (and a client gone mid-body) into JSON responses."""

        async def endpoint(request: Request) -> Any:
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message, exc.headers)
            except ClientDisconnect:
                return error_response(422, "invalid_body", "the client went away mid-body")
            except ClosedError:
                if self.agent.state.value == "running" and not self.ctx.closing:
                    # The conversation was deleted while the request ran.
                    cid = request.path_params.get("conversation_id", "")
                    return error_response(404, "conversation_not_found", f"no conversation {cid!r}")
                return error_response(503, "unavailable", "the agent is shutting down")

        return endpoint

    def _refuse_when_closing(self) -> None:
        if self.ctx.closing:
            raise ApiError(503, "unavailable", "the server is shutting down")

    def _visible_to(self, principal: Principal) -> Callable[[EventBase], Awaitable[bool]]:
        seen: dict[str, bool] = {}

        async def accept(event: EventBase) -> bool:
            cid = event.conversation_id
            if not cid:  # events_lost: for this subscriber
                return True
            allowed = seen.get(cid)
            if allowed is None:
                try:
                    conv = await self.agent.get_conversation(cid)
                    allowed = principal.allows(channel_of(conv.channel_key, conv.meta))
                except (NotFound, ClosedError):
                    allowed = False
                if len(seen) > 10_000:
                    seen.clear()
                seen[cid] = allowed
            return allowed

        return accept


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(500, "internal_error", "internal error (see the server log)")


def _methods(handlers: dict[str, Handler]) -> Handler:
    """One endpoint for every method of a path, so a 405 lists them all in ``Allow``."""

    async def endpoint(request: Request) -> Any:
        if request.method != "HEAD":
            return await handlers[request.method](request)
        response = await handlers["GET"](request)  # the same checks, the same status
        if isinstance(response, EventStream):
            # Headers only: an event stream never ends by itself.
            await response.discard()
            return Response(status_code=200, media_type="text/event-stream")
        return response

    return endpoint


def build_app(ctx: ApiContext) -> Starlette:
    """The Starlette application of one HTTP transport instance."""
    api = Api(ctx)
    p = ctx.settings.prefix
    conv = p + "/conversations/{conversation_id}"
    paths: list[tuple[str, dict[str, Handler]]] = [
        ("/health", {"GET": api.health}),
        ("/ready", {"GET": api.ready}),
        (p + "/status", {"GET": api.status}),
        (p + "/openapi.json", {"GET": api.openapi}),
        (
            p + "/conversations",
            {"GET": api.list_conversations, "POST": api.create_conversation},
        ),
        (p + "/conversations/import", {"POST": api.import_conversation}),
        (p + "/search", {"GET": api.search}),
        (conv + "/export", {"GET": api.export_conversation}),
        (conv + "/checkpoints", {"GET": api.list_checkpoints, "POST": api.take_checkpoint}),
        (
            conv + "/checkpoints/{checkpoint_id}",
            {"GET": api.get_checkpoint, "DELETE": api.delete_checkpoint},
        ),
        (
            conv,
            {
                "GET": api.get_conversation,
                "PATCH": api.rename_conversation,
                "DELETE": api.delete_conversation,
            },
        ),
        (conv + "/messages", {"GET": api.list_messages, "POST": api.post_message}),
        (conv + "/attachments", {"POST": api.upload_attachment}),
        (conv + "/attachments/{sha256}", {"GET": api.get_attachment}),
        (conv + "/regenerate", {"POST": api.regenerate}),
        (conv + "/edit", {"POST": api.edit_last}),
        (conv + "/status", {"GET": api.conversation_status}),
        (conv + "/interrupt", {"POST": api.interrupt}),
        (conv + "/messages/{message_id}/redact", {"POST": api.redact_message}),
        (conv + "/approvals", {"GET": api.list_approvals}),
        (conv + "/approvals/{approval_id}", {"POST": api.decide_approval}),
        (conv + "/questions/{question_id}", {"POST": api.answer_form}),
        (conv + "/events", {"GET": api.conversation_events}),
        (p + "/events", {"GET": api.all_events}),
    ]
    if ctx.page is not None:
        paths.append(("/", {"GET": api.page}))
        # A conversation's own address (deep links, reload, back/forward): the same
        # page, which opens it; the id is one percent-encoded segment, any text.
        paths.append(("/c/{conversation_id:path}", {"GET": api.page}))
        paths.append(("/static/{path:path}", {"GET": api.static}))
    if ctx.metrics is not None:
        paths.append(("/metrics", {"GET": api.metrics}))
    routes = [
        Route(
            path,
            _methods({m: api.guard(h) for m, h in handlers.items()}),
            methods=list(handlers),
        )
        for path, handlers in paths
    ]
    # Host and Origin first, before CORS answers a preflight or any route runs.
    middleware = [Middleware(GuardMiddleware, guard=api.browser_guard)]
    if ctx.settings.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=ctx.settings.cors_origins,
                allow_methods=["GET", "POST", "PATCH", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
                expose_headers=["Location"],
            )
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    # The route handlers, for routes mounted beside them (A2A: transport.py).
    app.state.api = api
    return app


_SHA = re.compile(r"[0-9a-f]{64}")


async def _form_file(request: Request, body: bytes) -> tuple[str, bytes]:
    """``(file name, bytes)`` of the ``file`` field of a multipart body already read
    (and capped): Starlette's parser runs over those bytes, never the socket."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    replay = Request(request.scope, receive)
    try:
        form = await replay.form(max_files=1, max_fields=4, max_part_size=4096)
    except HTTPException as exc:  # starlette's parse errors
        raise ApiError(422, "invalid_body", f"not a valid multipart body: {exc.detail}") from None
    except Exception as exc:
        raise ApiError(422, "invalid_body", f"not a valid multipart body: {exc}") from None
    try:
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(422, "invalid_body", "the multipart body needs a file field named file")
        return upload.filename or "", await upload.read()
    finally:
        await form.close()
