"""Who may do what: identities, roles and rules (the ``[access]`` section).

A speaker's :class:`Identity` comes from what their transport vouches for:
an IRC services account (and, verified or not, their ``nick!user@host``),
a Slack user id and team, an HTTP token name, the local terminal user.
:class:`AccessPolicy` gives each speaker a role — ``owner`` > ``admin`` >
``user`` > ``ignored``, plus named roles the operator defines — and, per
role and channel, a :class:`Decision`: whether the bot answers, which tools
the model is offered in that turn, which chat commands may run.

Identity patterns (``owners``, ``admins``, ``ignored``, a named role's
``members``) are written ``<transport instance>:<what>``; ``<what>``
depends on the instance's transport type:

* IRC: ``account:<account>`` (a services account; compared as the server
  compares nicks, under its ``CASEMAPPING``), or ``mask:<nick!user@host>``
  (matches anyone, verified or not, whose hostmask fits: the one way an
  unverified IRC user gets a role; a bare nick is never an identity);
* Slack: ``<team>:<user>`` (``T123:U456``), or ``<user>`` for any team; ids
  compared exactly;
* HTTP: ``token:<token name>``, exact;
* stdio: ``user:<name>``, exact;
* any other transport: ``<author id>``, exact;
* ``*`` alone: every *verified* identity of that instance.

The value may use ``*``, ``?`` and ``[...]`` globs; IRC values only ``*`` and
``?``, as IRC masks do: their brackets are literal (``account:alice[m]`` is
the account ``alice[m]``, never ``alicem``).  A pattern whose meaning depends
on the network's ``CASEMAPPING`` (it holds ``[]\\~{}|^`` or non-ASCII letters:
``alice[m]`` is also ``alice{m}`` under ``rfc1459`` only) is logged as a
warning when the policy is built, at start.  Roles above ``user``
only ever come from verified identities, or from IRC ``mask:`` patterns the
operator wrote.  Roles granted in chat (``!role``, ``!ignore``) are stored
by the bridge through :meth:`AccessPolicy.grant` and take effect at once;
owners are set in the configuration only.

Rules (``[[access.rules]]``) are read in order; for each of ``answer``,
``tools`` and ``commands`` the first rule that matches the channel (globs
over channel keys) and the speaker's role, and sets that key, decides.
Glob lists may exclude with a leading ``-`` (``["*", "-shell__*"]``).
Without a deciding rule: the bot answers, every tool the transport's
``allowed_tools`` lets through is offered, and every command may run except
``stop-others`` (stopping an answer someone else asked for), which needs a
role ranking as ``admin`` — or a rule naming it (a glob never gives it).
``!role``, ``!ignore``, ``!unignore`` and ``!roles`` always need a role
ranking as ``admin``.
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import translate
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field

from .canonical import Canonical
from .errors import ConfigError
from .settings import empty_list, settings_dataclass

if TYPE_CHECKING:
    from .cluster.notify import Notice, Subscription
    from .store.base import AccessChange, AccessGrant, Store

__all__ = [
    "BUILTIN_ROLES",
    "GRANTS_TOPIC",
    "MANAGE_COMMANDS",
    "ROLE_RANK",
    "AccessPolicy",
    "AccessRule",
    "AccessSettings",
    "Decision",
    "GlobList",
    "Identity",
    "RoleSettings",
    "SpeakerMessage",
    "at_least",
    "may_decide",
    "may_forget",
    "may_redact",
    "may_stop",
]

log = logging.getLogger(__name__)

#: The notification topic of grants (:mod:`agentik.core.cluster.notify`): the
#: identity keys whose role changed.
GRANTS_TOPIC = "access"

#: The built-in roles, highest first.
BUILTIN_ROLES: tuple[str, ...] = ("owner", "admin", "user", "ignored")
#: Their ranks (``ignored`` 0 … ``owner`` 3): the one rank table (the approvals and the
#: channel settings compare roles with :func:`at_least` too).
ROLE_RANK: Mapping[str, int] = {name: i for i, name in enumerate(reversed(BUILTIN_ROLES))}
#: Chat commands that change or list roles (and linked channels): always for roles
#: ranking as ``admin``.
MANAGE_COMMANDS = frozenset({"role", "ignore", "unignore", "roles", "link", "unlink", "links"})
#: The pseudo-command of ``!stop`` for an answer someone else asked for.
STOP_OTHERS = "stop-others"
_GLOB = re.compile(r"[*?\[]")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
#: IRC patterns (``account:``, ``mask:``) have the globs of IRC masks: ``*`` and ``?``
#: only.  ``[`` and ``]`` are ordinary nick characters (``alice[m]``), never a class.
_IRC_GLOB = re.compile(r"[*?]")
#: Characters whose case the IRC mappings disagree on: ``[]\~`` and ``{}|^`` (one
#: under ``rfc1459``, partly under ``strict-rfc1459``, two under ``ascii`` and
#: ``rfc8265``), and anything outside ASCII (folded under ``rfc8265`` only).
_MAPPING_DEPENDENT = frozenset("[]\\~{}|^")


def irc_glob(pattern: str) -> str:
    """A regex for an IRC glob: ``*`` any run, ``?`` one character, all else literal."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


#: The IRC mappings a start-up warning describes.
_MAPPINGS = ("rfc1459", "strict-rfc1459", "ascii", "rfc8265")


def mapping_dependent(value: str) -> bool:
    """Whether an IRC name or mask names different people under different ``CASEMAPPING``s."""
    return any(c in _MAPPING_DEPENDENT or not c.isascii() for c in value)


def at_least(role: str, needed: str, rank: Callable[[str], int] | None = None) -> bool:
    """Whether ``role`` satisfies ``needed``.

    A built-in ``needed`` (``owner`` > ``admin`` > ``user`` > ``ignored``) is
    satisfied by any role ranking as high.  A named ``needed`` (``approvers =
    "deployer"``) is satisfied by that role itself, or by ``admin`` and ``owner``:
    never by another role that merely shares its rank.  ``rank`` gives a role's
    rank (default: a named role ranks as ``user``; :class:`AccessPolicy` passes its
    own, where named roles rank as configured).
    """
    have = (rank or _default_rank)(role)
    if needed in ROLE_RANK:
        return have >= ROLE_RANK[needed]
    return role == needed or have >= ROLE_RANK["admin"]


def may_redact(admin: bool, me: str | None, author_id: object) -> bool:
    """Who may redact a message, in chat (``!redact N``) and over HTTP alike: its
    author (``me``, the caller's verified qualified identity, equal to the message's
    ``author_id``) or anyone whose role ranks as ``admin`` or above (``admin``:
    :attr:`Decision.admin`; owners rank above admins, so they may too)."""
    return admin or (me is not None and author_id == me)


def may_stop(decision: Decision, me: str, asker: str | None) -> bool:
    """Who may stop a running answer (``!stop``): anyone when nobody is known to have
    asked for it (``asker`` ``None``), its asker (``me``, the caller's speaker key, equal
    to ``asker``), or a role the rules give ``stop-others`` (admins by default)."""
    return asker is None or asker == me or decision.may_command(STOP_OTHERS)


def may_forget(admin: bool, note_scope: str, own_scope: str | None) -> bool:
    """Who may forget a memory note visible to them (``!forget N``): a channel's note,
    or their own (``own_scope``: the caller's user scope), by anyone who sees it; a
    global note or another person's only by a role ranking as ``admin`` or above."""
    return note_scope.startswith("channel:") or note_scope == own_scope or admin


def may_decide(
    role_ok: bool, me: str | None, asker_id: str | None, *, self_approve: bool, approve: bool
) -> bool:
    """Who may decide an approval (in chat, on the web page, over HTTP alike): a
    verified caller (``me``) whose role satisfies the rule's ``approvers``
    (``role_ok``); approving one's own request only where the rule allows it
    (``self_approve``).  :meth:`agentik.core.approvals.Approvals.decide` says why not."""
    if me is None or not role_ok:
        return False
    return not approve or self_approve or asker_id != me


def _default_rank(role: str) -> int:
    return ROLE_RANK.get(role, ROLE_RANK["user"])


class SpeakerMessage(Protocol):
    """What :meth:`AccessPolicy.role_for` reads of an incoming message
    (:class:`agentik.transports.base.IncomingMessage` is one)."""

    @property
    def author_id(self) -> str: ...
    @property
    def author_name(self) -> str: ...
    @property
    def verified(self) -> bool: ...
    @property
    def meta(self) -> dict[str, Any]: ...


# -- settings -------------------------------------------------------------------------
@settings_dataclass
class RoleSettings:
    """``[access.roles.<name>]``: a named role."""

    #: Identity patterns of its members (as in ``owners``).
    members: tuple[str, ...] = ()
    #: How the role compares with the built-in ones: as a ``user`` or as an ``admin``.
    rank: Literal["user", "admin"] = "user"


@settings_dataclass
class AccessRule:
    """``[[access.rules]]``: what the given roles may do in the given channels.

    A key left out is not decided by this rule (a later rule, or the default, decides).
    """

    #: Channel-key globs it applies to (``irc:libera:#team``, ``slack:*``).
    channels: tuple[str, ...] = ("*",)
    #: Roles it applies to (built-in or named); ``*``: every role.
    roles: tuple[str, ...] = ("*",)
    #: Tool-name globs the model is offered (``-`` excludes): ``["fs__read_*"]``.
    tools: tuple[str, ...] | None = None
    #: Commands (without prefix) they may run, globs (``-`` excludes);
    #: ``stop-others`` (``!stop`` of an answer someone else asked for) only when named.
    commands: tuple[str, ...] | None = None
    #: Whether the bot answers them at all (commands aside).
    answer: bool | None = None


@settings_dataclass
class AccessSettings:
    """``[access]``: identities, roles and rules (see :mod:`agentik.core.access`)."""

    #: Identity patterns of the owners (``libera:account:alice``); config only.
    owners: tuple[str, ...] = ()
    #: Identity patterns of the admins.
    admins: tuple[str, ...] = ()
    #: Identity patterns the bot ignores: no answer, no command, not recorded.
    ignored: tuple[str, ...] = ()
    #: Named roles, ``[access.roles.<name>]``.
    roles: dict[str, RoleSettings] = Field(default_factory=dict)
    #: Rules, ``[[access.rules]]``, read in order.
    rules: list[AccessRule] = Field(default_factory=empty_list)

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the key of a bad role name or rule."""
        for name in self.roles:
            if name in BUILTIN_ROLES or not _NAME.match(name):
                raise ConfigError(
                    f"access.roles.{name}: a role name is a word (letters, digits, - and _)"
                    " other than owner, admin, user and ignored"
                )
        known = {*BUILTIN_ROLES, *self.roles, "*"}
        for i, rule in enumerate(self.rules):
            for role in rule.roles:
                if role not in known:
                    raise ConfigError(f"access.rules[{i}].roles: unknown role {role!r}")
                if role == "ignored":
                    raise ConfigError(
                        f"access.rules[{i}].roles: ignored speakers get nothing;"
                        " no rule applies to them"
                    )


# -- identities ------------------------------------------------------------------------
#: How IRC names are compared: ``fold(name, casemapping)``.
Fold = Callable[[str, str | None], str]


def _ascii_fold(name: str, casemapping: str | None) -> str:
    return name.lower()


@dataclass(frozen=True, slots=True)
class Identity:
    """Who spoke, as their transport instance vouches for it."""

    #: The transport instance (``libera``).
    transport: str
    #: The verified identity key (``libera:account:alice``), or ``None``.
    id: str | None
    #: The name shown (the nick, the Slack display name).
    name: str
    #: IRC: ``nick!user@host`` as the server compares it (also for unverified users).
    hostmask: str | None = None

    @property
    def verified(self) -> bool:
        return self.id is not None


def _irc_identity(instance: str, message: SpeakerMessage, fold: Fold) -> Identity:
    meta = message.meta or {}
    cm = meta.get("casemapping")
    account = meta.get("account")
    ident = f"{instance}:account:{fold(account, cm)}" if account else None
    mask = meta.get("hostmask")
    return Identity(instance, ident, message.author_name, fold(mask, cm) if mask else None)


def _slack_identity(instance: str, message: SpeakerMessage, fold: Fold) -> Identity:
    team = (message.meta or {}).get("team") or "-"
    ident = f"{instance}:{team}:{message.author_id}" if message.verified else None
    return Identity(instance, ident, message.author_name)


def _prefixed(kind: str) -> Any:
    def make(instance: str, message: SpeakerMessage, fold: Fold) -> Identity:
        ok = message.verified and message.author_id
        return Identity(instance, f"{instance}:{kind}:{message.author_id}" if ok else None,
                        message.author_name)  # fmt: skip

    return make


def _plain_identity(instance: str, message: SpeakerMessage, fold: Fold) -> Identity:
    ok = message.verified and message.author_id
    return Identity(instance, f"{instance}:{message.author_id}" if ok else None,
                    message.author_name)  # fmt: skip


_IDENTITIES = {
    "irc": _irc_identity,
    "slack": _slack_identity,
    "http": _prefixed("token"),
    "stdio": _prefixed("user"),
}


# -- patterns ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Pattern:
    instance: str
    #: ``id`` (matched against the verified key), ``mask`` (the IRC hostmask),
    #: ``any`` (every verified identity of the instance).
    kind: Literal["id", "mask", "any"]
    #: The full key (``id``) or the hostmask glob (``mask``), not yet casefolded.
    value: str


def parse_pattern(text: str, transports: Mapping[str, str], *, where: str) -> _Pattern:
    """One identity pattern, checked against the configured ``transports`` (name → type).

    Raises :class:`ConfigError` naming ``where`` and what is wrong.
    """
    instance, sep, rest = text.partition(":")
    if not sep or not rest or any(c.isspace() for c in text):
        raise ConfigError(
            f"{where}: {text!r} is not an identity pattern (write <transport>:<what>, "
            "e.g. libera:account:alice, slack:T123:U456, http:token:ci, stdio:*)"
        )
    kind = transports.get(instance)
    if kind is None:
        known = ", ".join(sorted(transports)) or "none configured"
        raise ConfigError(f"{where}: {text!r}: no transport named {instance!r} ({known})")
    if rest == "*":
        return _Pattern(instance, "any", "")
    if kind == "irc":
        what, sep, value = rest.partition(":")
        if what == "account" and value:
            return _Pattern(instance, "id", text)
        if what == "mask" and value:
            nick, bang, host = value.partition("!")
            if not bang or "@" not in host or not nick:
                raise ConfigError(
                    f"{where}: {text!r}: a mask is nick!user@host (globs allowed), "
                    "never a bare nick"
                )
            return _Pattern(instance, "mask", value)
        raise ConfigError(
            f"{where}: {text!r}: an IRC identity is {instance}:account:<account>, "
            f"{instance}:mask:<nick!user@host> or {instance}:*"
        )
    if kind == "slack":
        parts = rest.split(":")
        if len(parts) == 1:
            return _Pattern(instance, "id", f"{instance}:*:{parts[0]}")
        if len(parts) == 2 and all(parts):
            return _Pattern(instance, "id", text)
        raise ConfigError(
            f"{where}: {text!r}: a Slack identity is {instance}:<team>:<user>, "
            f"{instance}:<user> or {instance}:*"
        )
    prefix = {"http": "token", "stdio": "user"}.get(kind)
    if prefix is not None:
        what, sep, value = rest.partition(":")
        if what != prefix or not value:
            raise ConfigError(
                f"{where}: {text!r}: a {kind} identity is {instance}:{prefix}:<name> "
                f"or {instance}:*"
            )
    return _Pattern(instance, "id", text)


class _Table:
    """Identity patterns → (priority, role); lower priority wins."""

    def __init__(self) -> None:
        self.exact: dict[str, tuple[int, str]] = {}
        self.globs: list[tuple[re.Pattern[str], int, str]] = []
        self.masks: dict[str, list[tuple[re.Pattern[str], int, str]]] = {}
        self.any: dict[str, tuple[int, str]] = {}
        #: All globs (and all masks per instance) in one regex: most speakers match none.
        self._any_glob: re.Pattern[str] | None = None
        self._any_mask: dict[str, re.Pattern[str]] = {}

    def seal(self) -> _Table:
        """Build the combined regexes once every pattern is added."""
        if self.globs:
            self._any_glob = re.compile("|".join(f"(?:{rx.pattern})" for rx, _, _ in self.globs))
        for instance, masks in self.masks.items():
            self._any_mask[instance] = re.compile(
                "|".join(f"(?:{rx.pattern})" for rx, _, _ in masks)
            )
        return self

    def add(self, p: _Pattern, prio: int, role: str, fold: Any, *, irc: bool = False) -> None:
        if p.kind == "any":
            self._keep(self.any, p.instance, prio, role)
        elif p.kind == "mask":
            rx = re.compile(irc_glob(fold(p.value)))
            self.masks.setdefault(p.instance, []).append((rx, prio, role))
        elif irc:
            # ``<instance>:account:<name>``: the name folded as the server compares it.
            instance, _, rest = p.value.partition(":")
            what, _, name = rest.partition(":")
            key = f"{instance}:{what}:{fold(name)}"
            if _IRC_GLOB.search(name):
                prefix = re.escape(f"{instance}:{what}:")
                self.globs.append((re.compile(prefix + irc_glob(fold(name))), prio, role))
            else:
                self._keep(self.exact, key, prio, role)
        elif _GLOB.search(p.value.partition(":")[2]):
            self.globs.append((re.compile(translate(fold(p.value))), prio, role))
        else:
            self._keep(self.exact, fold(p.value), prio, role)

    @staticmethod
    def _keep(d: dict[str, tuple[int, str]], key: str, prio: int, role: str) -> None:
        old = d.get(key)
        if old is None or prio < old[0]:
            d[key] = (prio, role)

    def lookup(self, who: Identity) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None

        def take(hit: tuple[int, str] | None) -> None:
            nonlocal best
            if hit is not None and (best is None or hit[0] < best[0]):
                best = hit

        if who.id is not None:
            take(self.exact.get(who.id))
            take(self.any.get(who.transport))
            if self._any_glob is not None and self._any_glob.fullmatch(who.id):
                for rx, prio, role in self.globs:
                    if rx.fullmatch(who.id):
                        take((prio, role))
        combined = self._any_mask.get(who.transport)
        if who.hostmask is not None and combined is not None and combined.fullmatch(who.hostmask):
            for rx, prio, role in self.masks[who.transport]:
                if rx.fullmatch(who.hostmask):
                    take((prio, role))
        return best


# -- rules -----------------------------------------------------------------------------------
class GlobList:
    """Globs with ``-`` exclusions: a name is allowed if it fits one and no exclusion."""

    __slots__ = ("_cache", "_no", "_yes", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        yes = [p for p in self.patterns if not p.startswith("-")]
        no = [p[1:] for p in self.patterns if p.startswith("-")]
        self._yes = re.compile("|".join(f"(?:{translate(p)})" for p in yes)) if yes else None
        self._no = re.compile("|".join(f"(?:{translate(p)})" for p in no)) if no else None
        self._cache: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = bool(self._yes is not None and self._yes.match(name)) and not (
                self._no is not None and self._no.match(name)
            )
            if len(self._cache) < 4096:
                self._cache[name] = hit
        return hit

    def __repr__(self) -> str:
        return f"GlobList({list(self.patterns)!r})"


@dataclass(frozen=True, slots=True)
class Decision:
    """What a role may do in a channel."""

    role: str
    #: Whether the bot answers (commands aside).
    answer: bool
    #: Which tools are offered (``None``: every tool the transport allows).
    tools: GlobList | None
    #: Which commands may run (``None``: the defaults).
    commands: GlobList | None
    #: The role ranks as ``admin`` (or above).
    admin: bool

    def may_command(self, name: str) -> bool:
        """Whether ``name`` (``new``, ``stop-others``, …) may run."""
        if self.role == "ignored":
            return False
        if name in MANAGE_COMMANDS:
            return self.admin
        if self.commands is not None:
            if name == STOP_OTHERS:
                # Never by a glob: a rule names it to give it.
                return STOP_OTHERS in self.commands.patterns and self.commands(name)
            return self.commands(name)
        return name != STOP_OTHERS or self.admin

    def may_use_tool(self, name: str) -> bool:
        return self.tools is None or self.tools(name)


@dataclass(frozen=True, slots=True)
class _Rule:
    channels_exact: frozenset[str]
    channels_glob: re.Pattern[str] | None
    roles: frozenset[str] | None
    tools: GlobList | None
    commands: GlobList | None
    answer: bool | None

    def applies(self, channel: str, role: str) -> bool:
        if self.roles is not None and role not in self.roles:
            return False
        if channel in self.channels_exact:
            return True
        return self.channels_glob is not None and self.channels_glob.match(channel) is not None


def _compile_rule(rule: AccessRule) -> _Rule:
    exact = frozenset(c for c in rule.channels if not _GLOB.search(c))
    globs = [c for c in rule.channels if _GLOB.search(c)]
    return _Rule(
        channels_exact=exact,
        channels_glob=re.compile("|".join(f"(?:{translate(c)})" for c in globs)) if globs else None,
        roles=None if "*" in rule.roles else frozenset(rule.roles),
        tools=None if rule.tools is None else GlobList(rule.tools),
        commands=None if rule.commands is None else GlobList(rule.commands),
        answer=rule.answer,
    )


# -- the policy -------------------------------------------------------------------------------
class AccessPolicy:
    """Roles of speakers and what each role may do where.

    Built from :class:`AccessSettings` and the configured transport
    instances (name → type); an empty policy gives everyone ``user`` and
    decides nothing (the defaults).  Grants made in chat are loaded with
    :meth:`load` and changed with :meth:`grant`; they apply at once.
    """

    #: How many (channel, role) decisions are kept.
    CACHE = 4096

    def __init__(
        self,
        settings: AccessSettings | None = None,
        transports: Mapping[str, str] | None = None,
        *,
        irc_casefold: Fold | None = None,
    ) -> None:
        self.settings = settings or AccessSettings()
        #: IRC name folding, ``fold(name, casemapping)``: the transport's own
        #: (:func:`agentik.transports.irc.wire.casefold`; the bot passes it).
        self._fold: Fold = irc_casefold or _ascii_fold
        #: Transport instance → type (``{"libera": "irc"}``).
        self.transports = dict(transports or {})
        s = self.settings
        s.check()
        self._ranks = {**ROLE_RANK, **{n: ROLE_RANK[r.rank] for n, r in s.roles.items()}}
        # Config patterns: owners first, then admins, named roles in order, ignored last.
        entries: list[tuple[str, int, str, str]] = []
        for i, text in enumerate(s.owners):
            entries.append((text, 0, "owner", f"access.owners[{i}]"))
        for i, text in enumerate(s.admins):
            entries.append((text, 1, "admin", f"access.admins[{i}]"))
        for n, (name, role) in enumerate(s.roles.items()):
            for i, text in enumerate(role.members):
                entries.append((text, 2 + n, name, f"access.roles.{name}.members[{i}]"))
        for i, text in enumerate(s.ignored):
            entries.append((text, 10_000, "ignored", f"access.ignored[{i}]"))
        self._config = [
            (parse_pattern(text, self.transports, where=where), prio, role)
            for text, prio, role, where in entries
        ]
        for (p, _, _), (text, _, _, where) in zip(self._config, entries, strict=True):
            if self._is_irc(p.instance) and p.kind != "any":
                value = p.value if p.kind == "mask" else p.value.split(":", 2)[2]
                if mapping_dependent(value):
                    log.warning(
                        "%s: %r names different %s depending on the network's CASEMAPPING"
                        " ([]\\~ equal {}|^ under rfc1459 and strict-rfc1459 only; letters"
                        " outside ASCII match in any case under rfc8265 only): it is compared"
                        " as %r under rfc1459, %r under strict-rfc1459, %r under ascii, %r"
                        " under rfc8265, whichever %s announces (see docs/security.md)",
                        where, text, "accounts" if p.kind == "id" else "users",
                        *(self._fold(value, m) for m in _MAPPINGS), p.instance,
                    )  # fmt: skip
        self._rules = [_compile_rule(r) for r in s.rules]
        # An index: the rules naming a channel exactly, by channel; the rest (globs) in order.
        self._by_channel: dict[str, list[int]] = {}
        self._glob_rules: list[int] = []
        for i, rule in enumerate(self._rules):
            for channel in rule.channels_exact:
                self._by_channel.setdefault(channel, []).append(i)
            if rule.channels_glob is not None:
                self._glob_rules.append(i)
        #: Grants made in chat: identity key → role.
        self.grants: dict[str, AccessGrant] = {}
        self._tables: dict[tuple[str, str | None], _Table] = {}
        self._decisions: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        self._alike: Canonical[Decision] = Canonical(most=self.CACHE)
        self._store: Store | None = None
        self._following: Subscription | None = None
        #: IRC: (instance, casefolded nick) → account key, from the last message seen.
        self._seen: OrderedDict[tuple[str, str], str] = OrderedDict()
        #: IRC instance → the ``CASEMAPPING`` its last message came with (for names
        #: given without a message: :meth:`identity_from_key`, full patterns in chat).
        self._casemapping: dict[str, str | None] = {}

    # -- roles ---------------------------------------------------------------------------
    def rank(self, role: str) -> int:
        return self._ranks.get(role, ROLE_RANK["user"])

    @property
    def in_use(self) -> bool:
        """Whether anyone has a role other than ``user``: ``[access]`` is set, or
        roles were given in chat (an empty policy is the defaults)."""
        return self.settings != AccessSettings() or bool(self.grants)

    def at_least(self, role: str, needed: str) -> bool:
        """Whether ``role`` satisfies ``needed``: :func:`at_least`, named roles by their rank."""
        return at_least(role, needed, self.rank)

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role name: built-in and named."""
        return (*BUILTIN_ROLES, *self.settings.roles)

    def identity(self, transport_name: str, message: SpeakerMessage) -> Identity:
        """The speaker of ``message`` on transport instance ``transport_name``."""
        kind = self.transports.get(transport_name, "")
        if kind == "irc" and message.meta and "casemapping" in message.meta:
            self._casemapping[transport_name] = message.meta["casemapping"]
        make = _IDENTITIES.get(kind, _plain_identity)
        return make(transport_name, message, self._fold)

    def role_for(self, transport_name: str, message: SpeakerMessage, channel_key: str) -> str:
        """The role of ``message``'s speaker (``channel_key`` is for rules and callers)."""
        return self.role_of(self.identity(transport_name, message), message.meta)

    def role_of(self, who: Identity, meta: Mapping[str, Any] | None = None) -> str:
        cm: str | None = None
        if self._is_irc(who.transport):
            if meta is not None and "casemapping" in meta:
                cm = meta["casemapping"]
            else:  # no message (a key named in chat): the mapping last announced
                cm = self._casemapping.get(who.transport)
        hit = self._table(who.transport, cm).lookup(who)
        if hit is not None and hit[1] == "owner":
            return "owner"
        grant = self._granted(who)
        if grant is not None:
            # A named role the configuration dropped since: a user.
            return grant if grant in self._ranks else "user"
        return hit[1] if hit is not None else "user"

    def _granted(self, who: Identity) -> str | None:
        if not self.grants:
            return None
        if who.id is not None:
            g = self.grants.get(who.id)
            if g is not None:
                return g.role
        if who.hostmask is not None:
            prefix = f"{who.transport}:mask:"
            for key, g in self.grants.items():
                if key.startswith(prefix) and re.fullmatch(irc_glob(key[len(prefix):]),
                                                           who.hostmask):  # fmt: skip
                    return g.role
        return None

    def _is_irc(self, instance: str) -> bool:
        return self.transports.get(instance) == "irc"

    def _table(self, instance: str, cm: str | None) -> _Table:
        table = self._tables.get((instance, cm))
        if table is None:
            table = _Table()
            irc = self._is_irc(instance)
            for p, prio, role in self._config:
                if p.instance != instance:
                    continue
                if irc:
                    table.add(p, prio, role, lambda v: self._fold(v, cm), irc=True)
                else:
                    table.add(p, prio, role, lambda v: v)
            self._tables[(instance, cm)] = table.seal()
        return table

    # -- rules --------------------------------------------------------------------------------
    def decide(self, role: str, channel_key: str) -> Decision:
        """What ``role`` may do in ``channel_key`` (cached)."""
        key = (channel_key, role)
        found = self._decisions.get(key)
        if found is not None:
            return found
        found = self._evaluate(role, channel_key)
        # Channels under the same rules get equal decisions: one object serves them
        # all (a decision a channel was 80 bytes).  Few are ever distinct: roles x
        # the rules' combinations; the guard only bounds a pathological config.
        found = self._alike(found)
        self._decisions[key] = found
        if len(self._decisions) > self.CACHE:
            self._decisions.popitem(last=False)
        return found

    def _evaluate(self, role: str, channel_key: str) -> Decision:
        answer: bool | None = None
        tools: GlobList | None = None
        commands: GlobList | None = None
        tools_set = commands_set = False
        if role != "ignored":
            exact = self._by_channel.get(channel_key, ())
            order = sorted({*exact, *self._glob_rules}) if exact else self._glob_rules
            for i in order:
                rule = self._rules[i]
                if not rule.applies(channel_key, role):
                    continue
                if answer is None and rule.answer is not None:
                    answer = rule.answer
                if not tools_set and rule.tools is not None:
                    tools, tools_set = rule.tools, True
                if not commands_set and rule.commands is not None:
                    commands, commands_set = rule.commands, True
                if answer is not None and tools_set and commands_set:
                    break
        return Decision(
            role=role,
            answer=role != "ignored" and (answer is None or answer),
            tools=tools,
            commands=commands,
            admin=self.rank(role) >= ROLE_RANK["admin"],
        )

    def check(self, transport_name: str, message: SpeakerMessage, channel_key: str) -> Decision:
        """The speaker's role and what it may do in ``channel_key``: the one call per turn."""
        return self.decide(self.role_for(transport_name, message, channel_key), channel_key)

    # -- chat arguments --------------------------------------------------------------------------
    def seen(self, transport_name: str, message: SpeakerMessage) -> None:
        """Remember which account an IRC nick spoke with (for ``!role <nick>``)."""
        if not self._is_irc(transport_name):
            return
        who = self.identity(transport_name, message)
        if who.id is None:
            return
        nick = self._fold(message.author_name, (message.meta or {}).get("casemapping"))
        self._seen[(transport_name, nick)] = who.id
        self._seen.move_to_end((transport_name, nick))
        if len(self._seen) > 10_000:
            self._seen.popitem(last=False)

    def resolve(
        self,
        word: str,
        transport_name: str,
        meta: Mapping[str, Any] | None = None,
        account_of: Callable[[str], str | None] | None = None,
    ) -> str:
        """The identity key a chat argument names; raises ``ValueError`` with a reason.

        IRC: ``account:<name>``, ``mask:<nick!user@host>``, or a nick: the
        account ``account_of(nick)`` knows (the transport's tracking of users
        sharing a channel), else the account the bot saw on its last message.  Slack: ``<@U123>`` or
        ``U123`` (the asker's team).  HTTP: ``token:<name>``; stdio:
        ``<name>``.  Anywhere: a full pattern naming a configured instance.
        """
        word = word.strip()
        kind = self.transports.get(transport_name, "")
        cm = (meta or {}).get("casemapping")
        head = word.partition(":")[0]
        if head in self.transports and head not in ("account", "mask", "token", "user"):
            try:
                p = parse_pattern(word, self.transports, where="argument")
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("argument: ")) from None
            glob = _IRC_GLOB if self._is_irc(p.instance) else _GLOB
            if p.kind == "any" or (glob.search(word.partition(":")[2]) and p.kind != "mask"):
                raise ValueError("name one identity, not a pattern")
            value = p.value if p.kind == "id" else f"{p.instance}:mask:{p.value}"
            return self._fold_key(value)
        if kind == "irc":
            if word.startswith("account:") and len(word) > 8:
                return f"{transport_name}:account:{self._fold(word[8:], cm)}"
            if word.startswith("mask:"):
                try:
                    p = parse_pattern(f"{transport_name}:{word}", self.transports, where="argument")
                except ConfigError as exc:
                    raise ValueError(str(exc).removeprefix("argument: ")) from None
                return f"{transport_name}:mask:{self._fold(p.value, cm)}"
            known = account_of(word) if account_of is not None else None
            if known:
                return f"{transport_name}:account:{self._fold(known, cm)}"
            found = self._seen.get((transport_name, self._fold(word, cm)))
            if found is None:
                raise ValueError(
                    f"I have not seen {word} speak with a services account; "
                    f"write account:<name> (or mask:<nick!user@host> to ignore)"
                )
            return found
        if kind == "slack":
            m = re.fullmatch(r"<@([A-Z0-9]+)(?:\|[^>]*)?>|([UW][A-Z0-9]+)", word)
            if m is None:
                raise ValueError("name a Slack user by mention (@name) or user id (U123…)")
            team = (meta or {}).get("team") or "-"
            return f"{transport_name}:{team}:{m.group(1) or m.group(2)}"
        if kind == "http":
            name = word.removeprefix("token:")
            return f"{transport_name}:token:{name}"
        if kind == "stdio":
            return f"{transport_name}:user:{word.removeprefix('user:')}"
        return f"{transport_name}:{word}"

    def _fold_key(self, key: str) -> str:
        instance, _, rest = key.partition(":")
        if self._is_irc(instance):
            what, _, value = rest.partition(":")
            return f"{instance}:{what}:{self._fold(value, self._casemapping.get(instance))}"
        return key

    def role_of_key(self, key: str) -> str:
        """The role of an identity key (as :meth:`resolve` gives), as :meth:`role_for` would."""
        instance, _, rest = key.partition(":")
        if rest.startswith("mask:"):
            g = self.grants.get(key)
            return g.role if g is not None else "user"
        return self.role_of(Identity(instance, key, key))

    def identity_from_key(self, key: str) -> Identity:
        """The :class:`Identity` an identity key names (``libera:account:alice``,
        ``libera:mask:nick!user@host`` for a hostmask only); ``ValueError``."""
        try:
            p = parse_pattern(key, self.transports, where="identity")
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("identity: ")) from None
        irc = self._is_irc(p.instance)
        glob = _IRC_GLOB if irc else _GLOB
        if p.kind == "any" or (p.kind == "id" and glob.search(key.partition(":")[2])):
            raise ValueError(f"{key!r} is a pattern; name one identity")
        if p.kind == "mask":
            if _IRC_GLOB.search(p.value):
                raise ValueError(f"{key!r} is a pattern; name one nick!user@host")
            cm = self._casemapping.get(p.instance)
            return Identity(p.instance, None, p.value.partition("!")[0], self._fold(p.value, cm))
        return Identity(p.instance, self._fold_key(p.value), key)

    # -- grants ----------------------------------------------------------------------------------
    async def load(self, store: Store) -> int:
        """Load the grants stored in ``store`` (and keep it for :meth:`grant`); how many.

        From then on the grants follow the store's notifications (topic
        :data:`GRANTS_TOPIC`): a role given through another process sharing the
        database applies here as soon as it is announced, and at the latest at the
        notifier's next resync (``[cluster] poll_seconds``)."""
        self._store = store
        self._follow(store)
        self.grants = {g.identity: g for g in await store.access_grants()}
        for g in self.grants.values():
            if g.role not in self.roles:
                log.warning(
                    "access: %s was given the role %r in chat, which the configuration no"
                    " longer defines; treated as a user (agentik access roles)",
                    g.identity,
                    g.role,
                )
        return len(self.grants)

    async def grant(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> str | None:
        """Give ``identity`` ``role`` (``None``: remove its grant); stored and audited.

        Returns the grant it had.  Raises ``ValueError`` for an unknown role or ``owner``.
        """
        if role is not None and role not in self.roles:
            raise ValueError(f"unknown role {role!r} (roles: {', '.join(self.roles)})")
        if role == "owner":
            raise ValueError("owners are set in the configuration only")
        old = self.grants.get(identity)
        if self._store is not None:
            await self._store.access_set(identity, role, by=by, channel=channel)
            # Committed: the other processes on this database re-read (ids only).
            await self._store.notifier().publish(GRANTS_TOPIC, identity)
        if role is None:
            self.grants.pop(identity, None)
        else:
            from .store.base import AccessGrant

            self.grants[identity] = AccessGrant(
                identity=identity, role=role, granted_by=by, granted_at=time.time()
            )
        return old.role if old is not None else None

    def forget_store(self) -> None:
        """Drop the store :meth:`load` kept (now closed): :meth:`grant` changes memory only."""
        self._store = None
        if self._following is not None:
            self._following.close()
            self._following = None

    def _follow(self, store: Store) -> None:
        """Re-read the grants when the notifier says they changed (or resyncs).  The
        subscription holds this policy weakly: a policy replaced (a reload) and
        dropped stops following by itself."""
        if self._following is not None:
            self._following.close()
        ref = weakref.ref(self)

        async def changed(notice: Notice) -> None:
            policy = ref()
            if policy is None or policy._store is not store:
                sub.close()
                return
            try:
                # Grants are few: all of them are read again, whatever the ids.
                fresh = {g.identity: g for g in await store.access_grants()}
            except Exception as exc:  # closing, or the database is away: next time
                log.debug("access: re-reading the grants failed: %s", exc)
                return
            if policy._store is store:
                policy.grants = fresh

        sub = store.notifier().subscribe(GRANTS_TOPIC, changed)
        self._following = sub

    async def audit(self, limit: int = 100) -> list[AccessChange]:
        """The latest role changes, newest first."""
        if self._store is None:
            return []
        return await self._store.access_audit(limit=limit)

    def config_roles(self) -> list[tuple[str, str]]:
        """(pattern, role) of the configuration, owners first."""
        out: list[tuple[str, str]] = []
        s = self.settings
        out += [(p, "owner") for p in s.owners]
        out += [(p, "admin") for p in s.admins]
        for name, role in s.roles.items():
            out += [(p, name) for p in role.members]
        out += [(p, "ignored") for p in s.ignored]
        return out
