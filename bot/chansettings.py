"""Per-channel settings: from ``[channels."<pattern>"]`` in the configuration
and from ``!set`` in the channel itself.

A channel's effective behaviour is its transport's options
(:class:`~agentik.bot.channel.ChannelOptions`, from ``[transports.<name>]``)
overlaid with the settings of every ``[channels."<pattern>"]`` table whose
pattern matches the channel key (the broadest first, so the most specific
pattern wins key by key), overlaid with what the channel's admins set in chat
(``!set``, persisted in the store and audited).  The keys, what each does
and takes: :class:`ChannelSettings`, which inherits each key from the knobs
class that declares it for the table it overlays (:class:`ChannelKnobs`,
:class:`~agentik.core.memory.AnnounceKnob`, :class:`~agentik.core.memory.RecallKnobs`)
and makes it "unset unless given" (:func:`~agentik.core.settings.overlay`);
``docs/reference/config.md`` lists them.  ``tools`` is within the transport's
``allowed_tools`` (the outer bound: a channel can narrow it, never widen it);
unset recall keys keep ``[memory]``'s.

Who may set them is a role (``[agent] settings_role``, default ``admin``)
compared with the speaker's role from a ``role_for`` callable: by default
everyone is ``user``; the access part of the bot supplies the real one (see
:data:`RoleFor`).  A speaker the transport could not verify may never set.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Annotated, Any, get_args

from pydantic import Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic.fields import FieldInfo

from agentik.core import access
from agentik.core.memory import AnnounceKnob, RecallKnobs, RecallPolicy
from agentik.core.settings import OVERLAY_SETTINGS, overlay, setting_fields
from agentik.core.store.base import ChannelSetting, Store
from agentik.core.streamprofiles import PROFILE_NAME
from agentik.transports.base import IncomingMessage, Transport

from .channel import ChannelKnobs, ChannelOptions

if TYPE_CHECKING:
    from agentik.core.cluster.notify import Notice

__all__ = [
    "BUILTIN_ROLES",
    "RECALL_KEYS",
    "SETTING_KEYS",
    "ChannelSettings",
    "ChannelSettingsBook",
    "Effective",
    "RoleFor",
    "SettingError",
    "default_role_for",
    "parse_setting",
    "pattern_specificity",
    "persona_block",
    "recall_override",
    "role_at_least",
    "setting_doc",
    "settings_scope",
]

#: ``role_for(transport_name, message, channel_key) -> role``: the speaker's role
#: in that channel.  The default, :func:`default_role_for`, says ``user`` for
#: everyone; the access policy (``AccessPolicy.role_for``) is wired in its place.
RoleFor = Callable[[str, IncomingMessage, str], str]

#: Built-in roles, lowest first.  A named role ranks as ``user``.
BUILTIN_ROLES: tuple[str, ...] = tuple(reversed(access.BUILTIN_ROLES))
#: ``role_at_least(role, needed)``: whether ``role`` satisfies ``needed``
#: (``owner > admin > user > ignored``; see :func:`agentik.core.access.at_least`).
role_at_least = access.at_least


def default_role_for(transport_name: str, message: IncomingMessage, channel_key: str) -> str:
    """Everyone is ``user`` (until an access policy is wired in)."""
    return "user"


#: Longest persona accepted (characters).
MAX_PERSONA_CHARS = 2000
#: Channels whose chat settings are kept in memory (least recently used dropped first).
CACHED_CHANNELS = 10_000
#: The notification topic of chat settings (:mod:`agentik.core.cluster.notify`): the
#: channel keys whose settings changed.
SETTINGS_TOPIC = "channel_settings"
#: Most tool patterns one channel may list.
MAX_TOOL_PATTERNS = 50


#: Keys that overlay :class:`ChannelOptions` fields of the same name
#: (``[transports.<name>]``): its :class:`ChannelKnobs`.
_OPTION_KEYS = tuple(setting_fields(ChannelKnobs))
#: The automatic-recall keys (overlaying ``[memory]``'s of the same names).
RECALL_KEYS = tuple(setting_fields(RecallKnobs))
#: Keys that overlay :class:`~agentik.core.memory.MemorySettings` (``[memory]``) fields.
_MEMORY_KEYS = (*setting_fields(AnnounceKnob), *RECALL_KEYS)


def _source_field(key: str) -> FieldInfo:
    """The field ``key`` is declared by: ChannelKnobs', [memory]'s knobs' or our own."""
    for source in (ChannelKnobs, AnnounceKnob, RecallKnobs, ChannelSettings):
        if key in setting_fields(source):
            return setting_fields(source)[key]
    raise KeyError(key)


def _optional(info: FieldInfo) -> Any:
    """The type of ``info`` with its limits, ``None`` allowed (unset)."""
    annotation: Any = info.annotation
    if info.metadata:
        annotation = Annotated[(annotation, *info.metadata)]
    return annotation | None


#: What each key does in a channel (its doc in the configuration reference, so
#: Markdown); its type and limits are its source field's.
_CHANNEL_DOCS = {
    "persona": "Text added to the system prompt in these channels.",
    "answer": "Which lines the bot answers: `addressed`, `all`, or only `direct` messages.",
    "max_answer_lines": "Lines of one answer before the rest waits for `more` (0: no cap).",
    "ambient": "Record what others say (without answering) as context.",
    "ambient_lines": "How many such lines at most reach the model with the next turn.",
    "image_urls": "Fetch the image links of a message for the bot and give them to a model"
    " that takes images (IRC; `[attachments]` `url_*` bound it).",
    "events": "What of a turn the channel sees: `auto`, `answers`, `chat`, `debug`.",
    "tools": "Glob patterns of the tools offered here, within the transport's `allowed_tools`.",
    "model": "The model profile (`[llm.profiles.<name>]`) used here; `default`: `[llm]`.",
    "profile": "The event stream profile the channel is rendered from (`chat`, `debug`,"
    " `metrics` or a `[profiles.<name>]`).",
    "busy": "A message sent while the bot answers: `queue`, `steer`, `interrupt`"
    " (`auto`: `steer` in direct conversations and threads, `queue` elsewhere).",
    "announce": "Tell the channel when reflection or mining saved notes from it"
    " (`[memory] announce`).",
    "recall": "Automatic recall of relevant memory notes before each turn (`[memory] recall`).",
    "recall_k": "At most this many recalled notes per turn (`[memory] recall_k`).",
    "recall_min_score": "Least similarity (cosine) of a recalled note"
    " (`[memory] recall_min_score`).",
    "recall_tokens": "About this many tokens of recalled notes at most (`[memory] recall_tokens`).",
}


# settings_dataclass spelled out, so type checkers see the keyword constructor.
@pydantic_dataclass(frozen=True, kw_only=True, slots=True, config=OVERLAY_SETTINGS)
class ChannelSettings(RecallKnobs, AnnounceKnob, ChannelKnobs):
    """``[channels."<pattern>"]``: settings of the channels whose key
    matches ``<pattern>``.

    ``<pattern>`` is a channel key (``irc:libera:#ops``, ``slack:T1:C123``)
    where ``*`` matches any run of characters and ``?`` one.  Every key is
    optional: one left out keeps what a broader pattern, the transport
    (``[transports.<name>]``) or the default says.  A key's type and limits are
    its source's: :class:`ChannelOptions` or ``[memory]`` (``MemorySettings``).
    """

    # The keys that overlay no other table; the rest are inherited from the
    # knobs they overlay (made "unset unless given" by ``overlay`` below).
    persona: Annotated[str, Field(min_length=1, max_length=MAX_PERSONA_CHARS)] | None = None
    tools: Annotated[tuple[str, ...], Field(max_length=MAX_TOOL_PATTERNS)] | None = None
    model: Annotated[str, Field(min_length=1, max_length=64)] | None = None


# Reading a key the table leaves unset gives ``None`` (type checkers see the
# source's type: the knobs declare it once).
overlay(ChannelSettings, docs=_CHANNEL_DOCS)


def _bounds(key: str) -> tuple[Any, Any]:
    """The ``(ge, le)`` limits of a numeric key (``None``: no limit), from its field."""
    info = _source_field(key)
    metadata = list(info.metadata)
    for member in get_args(info.annotation):  # ``Annotated[int, Field(ge=0)] | None``
        metadata += getattr(member, "__metadata__", ())
    low = high = None
    for m in metadata:
        for item in getattr(m, "metadata", [m]):  # a FieldInfo carries its limits
            low = getattr(item, "ge", low)
            high = getattr(item, "le", high)
    return low, high


def _choices(key: str) -> tuple[str, ...]:
    """The values a ``Literal`` key takes, from its field."""
    return get_args(_source_field(key).annotation)


def _number_help(key: str, kind: str, note: str = "") -> str:
    low, high = _bounds(key)
    if high is None:
        return f"{kind} >= {low:g}{note}"
    return f"{kind} from {low:g} to {high:g}{note}"


#: The keys ``!set`` knows, and what each takes (the help and error texts).
SETTING_KEYS: dict[str, str] = {
    "persona": f'text added to the system prompt here (quote it: "..."; at most '
    f"{MAX_PERSONA_CHARS} characters)",
    "answer": "one of " + ", ".join(_choices("answer")),
    "max_answer_lines": _number_help("max_answer_lines", "a whole number", " (0: no cap)"),
    "ambient": "on or off",
    "ambient_lines": _number_help("ambient_lines", "a whole number"),
    "image_urls": "on or off (fetch image links for a model that takes images)",
    "events": "one of " + ", ".join(_choices("events")),
    "tools": "glob patterns of tool names (fs__read_* web__*), within the transport's "
    "allowed_tools; none: no tools",
    "model": "a model profile of [llm.profiles], or default ([llm])",
    "profile": "an event stream profile: chat, debug, metrics or one of [profiles]",
    "busy": "one of " + ", ".join(_choices("busy")) + " (what a message sent while the bot "
    "answers does)",
    "announce": "on or off (say when notes were saved from this channel)",
    "recall": "on or off",
    "recall_k": _number_help("recall_k", "a whole number"),
    "recall_min_score": _number_help("recall_min_score", "a number"),
    "recall_tokens": _number_help("recall_tokens", "a whole number"),
}
#: Each numeric key's validator: the type and limits of its field.
_NUMBERS = {
    k: TypeAdapter(_optional(_source_field(k)))
    for k in ("max_answer_lines", "ambient_lines", "recall_k", "recall_min_score", "recall_tokens")
}


def setting_doc(key: str) -> str:
    """What ``key`` does in a channel, in plain text: its field's doc (``!set <key>``)."""
    return _CHANNEL_DOCS[key].replace("`", "").rstrip(".")


class SettingError(ValueError):
    """A ``!set``/``!unset`` the bot cannot take; the message says why, naming the key."""


def _whole(key: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SettingError(f"{key}: {text!r} is not {SETTING_KEYS[key]}") from None
    try:
        return int(_NUMBERS[key].validate_python(value))
    except ValidationError:
        raise SettingError(f"{key}: {value} is not {SETTING_KEYS[key]}") from None


_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


def parse_setting(
    key: str,
    words: list[str],
    *,
    profiles: Iterable[str] | None = None,
    stream_profiles: Iterable[str] | None = None,
) -> Any:
    """The value ``!set <key> <words…>`` means (JSON-able), or :class:`SettingError`.

    ``profiles``: the configured model profile names ``model`` may take
    (besides ``default``); ``stream_profiles``: the event stream profile names
    ``profile`` may take; ``None`` does not check the name.
    """
    if key not in SETTING_KEYS:
        raise SettingError(f"unknown setting {key!r}; settings: {', '.join(SETTING_KEYS)}")
    if not words:
        raise SettingError(f"{key}: give a value: {SETTING_KEYS[key]} ({setting_doc(key)})")
    if key == "persona":
        text = " ".join(words).strip()
        if not text:
            raise SettingError(f"persona: give a value: {SETTING_KEYS[key]}")
        if len(text) > MAX_PERSONA_CHARS:
            raise SettingError(
                f"persona: {len(text)} characters is too long (at most {MAX_PERSONA_CHARS})"
            )
        return text
    if key == "tools":
        patterns = [p for w in words for p in w.split(",") if p]
        if patterns == ["none"]:
            return []
        if len(patterns) > MAX_TOOL_PATTERNS:
            raise SettingError(f"tools: at most {MAX_TOOL_PATTERNS} patterns")
        if not patterns:
            raise SettingError(f"tools: give a value: {SETTING_KEYS[key]}")
        return patterns
    if len(words) > 1:
        raise SettingError(f"{key}: one value expected ({SETTING_KEYS[key]}), got {len(words)}")
    text = words[0]
    if key == "model":
        if text.lower() == "default":
            return "default"
        if profiles is not None and text not in profiles:
            known = ", ".join(["default", *sorted(profiles)])
            raise SettingError(f"model: no profile {text!r}; profiles: {known}")
        return text
    if key == "profile":
        if not PROFILE_NAME.fullmatch(text):
            raise SettingError(f"profile: {text!r} is not {SETTING_KEYS[key]}")
        if stream_profiles is not None and text not in stream_profiles:
            known = ", ".join(stream_profiles)
            raise SettingError(f"profile: no profile {text!r}; profiles: {known}")
        return text
    if key in ("answer", "events", "busy"):
        allowed = _choices(key)
        if text.lower() not in allowed:
            raise SettingError(f"{key}: {text!r} is not {SETTING_KEYS[key]}")
        return text.lower()
    if key in ("ambient", "announce", "recall", "image_urls"):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise SettingError(f"{key}: {text!r} is not {SETTING_KEYS[key]}")
    if key == "recall_min_score":
        try:
            return float(_NUMBERS[key].validate_python(float(text)))
        except (ValueError, ValidationError):
            raise SettingError(f"{key}: {text!r} is not {SETTING_KEYS[key]}") from None
    return _whole(key, text)


def split_args(text: str) -> list[str]:
    """Words of a command's arguments, by shell-like rules (quotes group words)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise SettingError(f"cannot read the value: {str(exc).lower()}") from None


def pattern_specificity(pattern: str) -> int:
    """How specific a channel pattern is: its characters other than ``*`` and ``?``;
    a pattern without wildcards beats every pattern with one."""
    literal = sum(1 for c in pattern if c not in "*?")
    return literal + (1_000_000 if not any(c in pattern for c in "*?[") else 0)


def settings_scope(transport: Transport, channel_key: str) -> str:
    """The key a channel's settings are kept under: a thread
    (``slack:<team>:<channel>:<thread_ts>``) takes its channel's settings."""
    if transport.in_thread(channel_key):
        return channel_key.rsplit(":", 1)[0]
    return channel_key


def recall_override(base: RecallPolicy, keys: Mapping[str, Any]) -> RecallPolicy | None:
    """``base`` (``[memory]``'s recall) with a channel's recall ``keys`` over it;
    ``None`` when the channel sets none (the conversation follows ``base``)."""
    if not keys:
        return None
    return dataclasses.replace(
        base,
        enabled=keys.get("recall", base.enabled),
        k=keys.get("recall_k", base.k),
        min_score=keys.get("recall_min_score", base.min_score),
        tokens=keys.get("recall_tokens", base.tokens),
    )


def persona_block(channel_key: str, persona: str) -> str:
    """The channel's persona as it is added to the system prompt: fenced so the
    persona cannot close its own block.

    A channel admin writes the persona; the block's end marker is what tells
    the model that the operator speaks again.  So every line of the persona
    is quoted (``| ``: a line break in it cannot start an unquoted line), and
    the markers carry a tag made from a hash of the persona (a text cannot
    contain a hash of itself), which the opening line names as the only end:
    an "end of channel instructions" inside the persona stays inside.
    """
    tag = hashlib.sha256(persona.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    quoted = "\n".join(f"| {line}" for line in persona.splitlines() or [""])
    return (
        f"--- Channel instructions for {channel_key} [{tag}] (set by the channel's admins;"
        " they add to the instructions above; every line of them starts with '| ' and"
        f" they end only at the line '--- End of channel instructions [{tag}] ---') ---\n"
        f"{quoted}\n"
        f"--- End of channel instructions [{tag}] ---"
    )


@dataclass(frozen=True, slots=True)
class Effective:
    """A channel's settings in force: the bridge options, persona and tool patterns,
    and where each key's value comes from (``chat (…)``, ``config [channels."…"]``,
    ``transport``, ``default``)."""

    channel_key: str
    options: ChannelOptions
    persona: str | None = None
    tools: tuple[str, ...] | None = None
    #: The model profile in force; ``None``: ``[llm]`` (``default``).
    model: str | None = None
    #: ``announce`` set for the channel; ``None``: ``[memory] announce`` decides.
    announce: bool | None = None
    sources: dict[str, str] = field(default_factory=dict)
    #: The automatic-recall keys set for this channel (the rest: ``[memory]``'s).
    recall: dict[str, Any] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        if key in RECALL_KEYS:
            return self.recall.get(key, "as [memory]")
        if key == "persona":
            return self.persona
        if key == "model":
            return self.model or "default"
        if key == "tools":
            return self.tools
        if key == "announce":
            return self.announce
        return getattr(self.options, key)


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return " ".join(value) if value else "none (no tools)"
    if isinstance(value, str) and len(value) > 60:
        return json.dumps(value[:59] + "…", ensure_ascii=False)
    if isinstance(value, str) and " " in value:
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def describe(eff: Effective) -> str:
    """One line: every key's value and where it comes from."""
    parts = []
    for k in SETTING_KEYS:
        shown = _show(eff.value(k))
        if k == "tools" and eff.tools is None:
            shown = "all the transport allows"
        if k == "announce" and eff.announce is None:
            shown = "as [memory] announce"
        parts.append(f"{k} {shown} [{eff.sources.get(k, 'default')}]")
    return f"settings of {eff.channel_key}: " + " · ".join(parts)


#: The chat settings of a channel that has none (shared; never changed in place).
_NO_CHAT: dict[str, ChannelSetting] = {}


class ChannelSettingsBook:
    """The per-channel settings of one bot: config patterns, plus chat settings
    read from the store once per channel and kept up to date by :meth:`set`."""

    def __init__(
        self,
        store: Store,
        patterns: Mapping[str, ChannelSettings] | None = None,
        *,
        profiles: Iterable[str] = (),
    ) -> None:
        self.store = store
        #: The configured model profile names (``[llm.profiles.<name>]``).
        self.profiles: tuple[str, ...] = tuple(profiles)
        self.patterns: list[tuple[str, ChannelSettings]] = []
        self.configure(patterns)
        self._chat: dict[str, dict[str, ChannelSetting]] = {}
        self._follow()

    def _follow(self) -> None:
        """Drop a channel's cached settings when the store's notifier says they changed
        (another process sharing the database set them; topic :data:`SETTINGS_TOPIC`),
        and every cached channel on a resync: the next message reads them again.  The
        subscription holds the book weakly (a book dropped stops following)."""
        ref = weakref.ref(self)

        def changed(notice: Notice) -> None:
            book = ref()
            if book is None:
                sub.close()
            elif notice.resync:
                book._chat.clear()
            else:
                for key in notice.ids:
                    book._chat.pop(key, None)

        sub = self.store.notifier().subscribe(SETTINGS_TOPIC, changed)

    def configure(self, patterns: Mapping[str, ChannelSettings] | None) -> None:
        """Use these ``[channels."<pattern>"]`` tables (from the next message on;
        settings made in chat are kept)."""
        # Broadest first; on a tie the later table wins (it comes later here).
        items = list((patterns or {}).items())
        order = sorted(range(len(items)), key=lambda i: (pattern_specificity(items[i][0]), i))
        self.patterns = [items[i] for i in order]

    def matching(self, channel_key: str) -> list[tuple[str, ChannelSettings]]:
        """The config tables that apply to ``channel_key``, broadest first."""
        return [(p, s) for p, s in self.patterns if fnmatchcase(channel_key, p)]

    async def chat(self, channel_key: str) -> dict[str, ChannelSetting]:
        """The settings set in chat for ``channel_key`` (cached after the first read;
        the cache keeps the :data:`CACHED_CHANNELS` most recently used channels)."""
        found = self._chat.pop(channel_key, None)
        if found is None:
            rows = await self.store.channel_settings(channel_key)
            # Most channels never set anything: they share one empty mapping.
            found = {r.key: r for r in rows if r.key in SETTING_KEYS} or _NO_CHAT
            while len(self._chat) >= CACHED_CHANNELS:
                del self._chat[next(iter(self._chat))]
        self._chat[channel_key] = found  # now the most recently used
        return found

    async def set(self, channel_key: str, key: str, value: Any, *, actor: str) -> None:
        """Persist (and audit) ``key = value`` for the channel; ``None`` unsets."""
        now = time.time()
        text = None if value is None else json.dumps(value, ensure_ascii=False)
        await self.store.set_channel_setting(channel_key, key, text, actor=actor, at=now)
        # Committed: the other processes on this database drop the channel (ids only).
        await self.store.notifier().publish(SETTINGS_TOPIC, channel_key)
        chat = await self.chat(channel_key)
        if chat is _NO_CHAT:  # shared by the channels without settings: never changed
            chat = self._chat[channel_key] = {}
        if text is None:
            chat.pop(key, None)
        else:
            chat[key] = ChannelSetting(
                channel_key=channel_key, key=key, value=text, set_by=actor, set_at=now
            )

    async def effective(self, channel_key: str, base: ChannelOptions) -> Effective:
        """``base`` (the transport's options) overlaid with config patterns and chat settings."""
        values: dict[str, Any] = {}
        sources = {k: "transport" for k in _OPTION_KEYS}
        for pattern, table in self.matching(channel_key):
            for key in SETTING_KEYS:
                v = getattr(table, key)
                if v is not None:
                    values[key] = v
                    sources[key] = f'config [channels."{pattern}"]'
        for key, row in (await self.chat(channel_key)).items():
            try:
                values[key] = _checked(key, json.loads(row.value), self.profiles)
            except (ValueError, SettingError):
                continue  # a row this version cannot read: ignored, not fatal
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(row.set_at))
            sources[key] = f"chat, {row.set_by}, {when}"
        overrides = {k: values[k] for k in _OPTION_KEYS if k in values}
        # Without overrides, the transport's options as they are (a copy would be
        # validated again on every message, and kept by every open channel).
        options = dataclasses.replace(base, **overrides) if overrides else base
        tools = values.get("tools")
        model = values.get("model")
        return Effective(
            model=None if model in (None, "default") else model,
            channel_key=channel_key,
            options=options,
            persona=values.get("persona"),
            tools=None if tools is None else tuple(tools),
            announce=values.get("announce"),
            sources=sources,
            recall={k: values[k] for k in RECALL_KEYS if k in values},
        )


def _checked(key: str, value: Any, profiles: Iterable[str] = ()) -> Any:
    """A stored value, validated as ``!set`` would have (a ``model`` whose profile
    is no longer configured is not read: the channel falls back)."""
    if key == "model":
        if not isinstance(value, str):
            raise SettingError(key)
        return parse_setting(key, [value], profiles=profiles)
    if key == "tools":
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise SettingError(key)
        return parse_setting(key, value) if value else []
    if isinstance(value, bool):
        return parse_setting(key, ["on" if value else "off"])
    if key == "persona":
        if not isinstance(value, str):
            raise SettingError(key)
        return parse_setting(key, [value])
    return parse_setting(key, [str(value)])


def allowed_tool_names(
    tools: Iterable[str], outer: tuple[str, ...] | None, channel: tuple[str, ...]
) -> tuple[str, ...]:
    """The names among ``tools`` that both glob lists allow (``outer`` ``None``: all),
    each escaped so it matches only itself as a pattern."""
    return tuple(
        _escape(name)
        for name in tools
        if (outer is None or any(fnmatchcase(name, p) for p in outer))
        and any(fnmatchcase(name, p) for p in channel)
    )


_OLD_ALIASES = {"Answer": "answer", "Events": "events", "Busy": "busy"}


if not TYPE_CHECKING:  # mypy keeps checking names imported from here

    def __getattr__(name: str) -> Any:
        """``Answer``, ``Events``, ``Busy``: the ``Literal`` types of those keys, now
        declared only by :class:`ChannelOptions` (deprecated here)."""
        if name in _OLD_ALIASES:
            key = _OLD_ALIASES[name]
            message = f"chansettings.{name} is deprecated: the type of ChannelOptions.{key}"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return setting_fields(ChannelOptions)[key].annotation
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _escape(name: str) -> str:
    """``name`` as a glob pattern matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
