"""The front door: one admission pipeline for every way a message comes in.

A chat message (the bridge, for IRC, Slack, stdio and plugin transports), a
message posted to the HTTP API and a turn a restart takes up again all pass
the same steps, in this order::

    Speaker ─▶ access decision ─▶ budget admit ─▶ submit ─▶ bind
               (Gate.decide)      (Gate.admit)    (Ticket.submit)

* a :class:`Speaker` is who knocks: the transport instance, the id the
  transport gives them (an IRC account or nick, a Slack user, an HTTP token
  name, the terminal user), the name shown, and whether the transport
  vouches for the id;
* :meth:`Gate.decide` asks the ``[access]`` policy what the speaker's role
  may do in the channel: whether the bot answers, which tools the turn may
  offer (:class:`~agentik.core.access.Decision`);
* :meth:`Gate.admit` checks the budgets (``[budgets]``) and reserves the
  message's share; a refusal says what is used up, and each front door shows
  it its own way (a chat notice, an HTTP 429);
* :meth:`Ticket.submit` sends the text to the conversation under the budgets'
  sending lock — with the turn's :class:`~agentik.core.turnsettings.TurnSettings`
  the front end chose (a channel's persona, tools and model, or the HTTP API's
  tool bound, and a :class:`~agentik.core.turnsettings.TurnOrigin` naming the
  speaker: ``TurnOrigin.of_speaker``) — and binds the new run to the speaker, so its tokens and tool
  calls are counted for them; a message that starts no turn of its own
  (steered into the running one, refused by a plugin, failed) gives its
  reservation back.

Rights over what is already there — redacting a message, stopping another
person's answer, forgetting a memory note, deciding an approval, importing a
snapshot — are asked of the gate too (:meth:`Gate.may_redact` …), which
applies the one rule of each from :mod:`agentik.core.access`.

A gate is a small value: the host (the bot's bridge) builds one from the
policy, budgets and role function in force each time it is asked, so a
configuration reload is seen at the next message.  Each front door keeps what
is its own: how a refusal reads (the chat lines and HTTP status codes are
pinned by tests), which channel a turn is recorded under, the conversation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .access import AccessPolicy, Decision, may_decide, may_forget, may_redact, may_stop
from .budgets import Budgets, Refusal, Subject
from .messages import Content, split_content

if TYPE_CHECKING:
    from .conversation import Conversation, Sent

__all__ = ["Gate", "RoleFunction", "Speaker", "Ticket"]

log = logging.getLogger(__name__)

#: ``role_for(transport instance, message, channel key) -> role``: the speaker's role
#: (the access policy's :meth:`~agentik.core.access.AccessPolicy.role_for` by default;
#: the message is the transport's own, e.g. an
#: :class:`~agentik.transports.base.IncomingMessage`).
RoleFunction = Callable[[str, Any, str], str]


@dataclass(frozen=True, slots=True, eq=False)
class Speaker:
    """Who knocks at the gate, as their transport instance presents them.

    It reads as a :class:`~agentik.core.access.SpeakerMessage` (``author_id``,
    ``author_name``, ``verified``, ``meta``), so the access policy takes it as it
    takes a message.  ``origin`` is the transport's own message when there is
    one: a role function is handed that, exactly as it arrived.
    """

    #: The transport instance (``libera``, ``web``).
    transport: str
    #: The id the transport gives the speaker (an IRC account or nick, a Slack user
    #: id, an HTTP token name, the terminal user).
    id: str
    #: The name shown (a nick, a display name, an HTTP ``author`` label).
    name: str
    #: Whether the transport vouches for :attr:`id` (an IRC nick without a services
    #: account is not: no identity, no user-scoped data or rights).
    verified: bool = True
    #: Transport details the access policy reads (IRC ``account``, ``hostmask``,
    #: ``casemapping``; Slack ``team``).
    meta: dict[str, Any] = field(default_factory=dict)
    #: The message the speaker sent, for role functions (``None``: the speaker itself).
    origin: Any = None

    @classmethod
    def of(cls, transport: str, message: Any) -> Speaker:
        """The speaker of ``message`` (an incoming message, or anything with
        ``author_id``, ``author_name``, ``verified`` and ``meta``) on ``transport``."""
        return cls(
            transport=transport,
            id=message.author_id,
            name=message.author_name,
            verified=message.verified,
            meta=message.meta,
            origin=message,
        )

    # -- as a SpeakerMessage (what AccessPolicy reads) ---------------------------------------
    @property
    def author_id(self) -> str:
        return self.id

    @property
    def author_name(self) -> str:
        return self.name

    @property
    def qualified(self) -> str | None:
        """The speaker's identity qualified by transport instance (``libera:alice``),
        or ``None`` for a speaker the transport could not verify."""
        if not self.verified or not self.id:
            return None
        return f"{self.transport}:{self.id}"

    @property
    def key(self) -> str:
        """Who spoke, as a key: :attr:`qualified`, or for an unverified speaker
        ``<instance>:~<hostmask or name>`` (never equal to a verified one)."""
        found = self.qualified
        if found is not None:
            return found
        shown = self.meta.get("hostmask") or self.name or self.id
        return f"{self.transport}:~{shown}"

    @property
    def message(self) -> Any:
        """What a role function is handed: :attr:`origin`, else the speaker itself."""
        return self.origin if self.origin is not None else self


class Ticket:
    """A message admitted by :meth:`Gate.admit`: its budget reservation until
    :meth:`submit` binds it to the turn it starts.

    Use it as an async context manager around opening the conversation and
    submitting: on the way out a reservation no turn took (the message was
    steered into a running turn, refused by a plugin, or failed) goes back.
    """

    def __init__(
        self,
        budgets: Budgets | None,
        subject: Subject | None,
        refused: Refusal | None = None,
        decision: Decision | None = None,
    ) -> None:
        self._budgets = budgets
        #: Who the turn is counted for (``None``: budgets are off).
        self.subject = subject
        #: What is used up (``None``: admitted).
        self.refused = refused
        #: The access decision the message passed (``None``: not asked).
        self.decision = decision
        self._bound = False

    @property
    def admitted(self) -> bool:
        return self.refused is None

    async def submit(self, conversation: Conversation, text: Content, **kwargs: Any) -> Sent:
        """``conversation.submit(text, **kwargs)`` under the budgets' sending lock, and
        the new run bound to :attr:`subject` (a steered message starts no run: its
        reservation goes back when the ticket is left).  Pass the turn's
        ``settings=`` (:class:`~agentik.core.turnsettings.TurnSettings`) here."""
        if self.subject is None or self._budgets is None:
            return await conversation.submit(text, **kwargs)
        async with self._budgets.sending(conversation.id):
            sent = await conversation.submit(text, **kwargs)
            if not sent.steered:
                self.bind(sent.run_id, chars=len(split_content(text)[0]))
        return sent

    def bind(self, run_id: str, *, chars: int = 0) -> None:
        """Count run ``run_id`` for :attr:`subject` (a resumed turn binds this way)."""
        if self.subject is not None and self._budgets is not None:
            self._budgets.bind(run_id, self.subject, chars=chars)
            self._bound = True

    def release(self) -> None:
        """Give the reservation back unless a run took it (idempotent)."""
        if self.subject is not None and self._budgets is not None and not self._bound:
            self._bound = True
            self._budgets.release(self.subject)

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class Gate:
    """The admission pipeline and the rights of one host (see the module docstring)."""

    #: Who may do what (``[access]``; an empty policy: everyone is a ``user``).
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: Usage limits (``None``: unlimited).
    budgets: Budgets | None = None
    #: The speaker's role for budgets and rights (``None``: the policy's ``role_for``).
    role_for: RoleFunction | None = None

    def with_budgets(self, budgets: Budgets | None) -> Gate:
        """This gate counting for ``budgets`` instead."""
        return dataclasses.replace(self, budgets=budgets)

    # -- admission -----------------------------------------------------------------------
    def decide(self, speaker: Speaker, channel_key: str) -> Decision:
        """What the speaker's role may do in ``channel_key`` (the access policy's rules):
        whether the bot answers, which tools the turn may offer, which commands run."""
        return self.access.check(speaker.transport, speaker, channel_key)

    def decide_role(self, role: str, channel_key: str) -> Decision:
        """What ``role`` may do in ``channel_key`` (a role known already)."""
        return self.access.decide(role, channel_key)

    def role(self, speaker: Speaker, channel_key: str) -> str:
        """The speaker's role (for budgets and rights)."""
        role_for = self.role_for or self.access.role_for
        return role_for(speaker.transport, speaker.message, channel_key)

    @property
    def budgets_on(self) -> bool:
        return self.budgets is not None and self.budgets.enabled

    async def admit(
        self,
        speaker: Speaker,
        channel_key: str,
        *,
        chars: int = 0,
        role: str | None = None,
        name: str | None = None,
        decision: Decision | None = None,
    ) -> Ticket:
        """Check the budgets for a message of ``chars`` characters and reserve its
        share; the :class:`Ticket` says what is used up (:attr:`Ticket.refused`) or
        carries the reservation to :meth:`Ticket.submit`.  ``role`` and ``name``
        (who the usage is shown as) default to :meth:`role` and the speaker's name."""
        if not self.budgets_on:
            return Ticket(None, None, decision=decision)
        assert self.budgets is not None
        subject = Subject(
            transport=speaker.transport, channel=channel_key, identity=speaker.qualified,
            role=role if role is not None else self.role(speaker, channel_key),
            name=name if name is not None else (speaker.name or speaker.id),
        )  # fmt: skip
        refused = await self.budgets.admit(subject, chars=chars)
        if refused is not None:
            return Ticket(None, subject, refused, decision)
        return Ticket(self.budgets, subject, decision=decision)

    # -- rights (one rule each, from agentik.core.access) ---------------------------------
    def admin(self, speaker: Speaker, channel_key: str) -> bool:
        """Whether the speaker's role ranks as ``admin`` or above (owners do)."""
        return self.access.at_least(self.role(speaker, channel_key), "admin")

    def may_redact(self, speaker: Speaker, channel_key: str, author_id: object) -> bool:
        """Whether the speaker may redact a message whose ``author_id`` is given:
        :func:`~agentik.core.access.may_redact`."""
        return may_redact(self.admin(speaker, channel_key), speaker.qualified, author_id)

    def may_stop(self, speaker: Speaker, channel_key: str, asker: str | None) -> bool:
        """Whether the speaker may stop the answer ``asker`` (a :attr:`Speaker.key`)
        asked for: :func:`~agentik.core.access.may_stop`."""
        return may_stop(self.decide(speaker, channel_key), speaker.key, asker)

    def may_forget(
        self, speaker: Speaker, channel_key: str, note_scope: str, own_scope: str | None
    ) -> bool:
        """Whether the speaker may forget a memory note of ``note_scope`` (``own_scope``:
        the speaker's own user scope): :func:`~agentik.core.access.may_forget`."""
        return may_forget(self.admin(speaker, channel_key), note_scope, own_scope)

    def may_decide(
        self,
        speaker: Speaker,
        channel_key: str,
        *,
        approvers: str,
        asker_id: str | None,
        self_approve: bool,
        approve: bool,
        at_least: Callable[[str, str], bool] | None = None,
    ) -> bool:
        """Whether the speaker may approve (``approve``) or deny an approval asked of
        ``approvers``: :func:`~agentik.core.access.may_decide`.  ``at_least`` compares
        roles (the agent's approvals' own comparison; default: the policy's)."""
        role = self.role(speaker, channel_key)
        compare = at_least or self.access.at_least
        return may_decide(
            compare(role, approvers), speaker.qualified, asker_id,
            self_approve=self_approve, approve=approve,
        )  # fmt: skip
