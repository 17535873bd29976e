"""What approvals, questions and compaction need of a conversation's parts, as Protocols.

They work on one conversation's
:class:`~agentik.core.services.ConversationParts`, while the services (and
the conversation) are built on top of them: their annotations name these
protocols — exactly the members they use, which mypy checks the real classes
against — instead of importing the modules above them (an import cycle,
even one under ``TYPE_CHECKING``, ties the modules together: none can be
read, tested or changed alone).  What an agent provides is
:class:`~agentik.core.services.AgentLike`; what the hooks see of a
conversation, :class:`~agentik.core.hooktypes.ConversationLike`; what the
services, a turn and the health checks read of a live conversation,
:class:`LiveConversation`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .events import Event

if TYPE_CHECKING:
    from .hooktypes import ConversationLike
    from .workingmemory import WorkingMemory

__all__ = ["EventEmitter", "LiveConversation", "PartsLike"]

E = TypeVar("E", bound=Event)


class EventEmitter(Protocol):
    """A conversation's event stream (:class:`~agentik.core.services.ConversationEvents`)."""

    def emit(self, cls: type[E], run_id: str | None, **fields: Any) -> E: ...


class PartsLike(Protocol):
    """What approvals, questions and compaction use of a conversation's
    :class:`~agentik.core.services.ConversationParts`."""

    @property
    def id(self) -> str: ...

    @property
    def channel_key(self) -> str | None: ...

    @property
    def conversation(self) -> ConversationLike: ...

    @property
    def memory(self) -> WorkingMemory: ...

    @property
    def events(self) -> EventEmitter: ...


class LiveConversation(Protocol):
    """What the services (their registry of open and busy conversations), a
    turn and the health checks read of a live
    :class:`~agentik.core.conversation.Conversation`, which is built on them:
    :class:`~agentik.core.services.AgentServices` and
    :class:`~agentik.core.services.AgentLike` are generic in the conversation
    type (the agent fills in the real class), bounded by this protocol."""

    @property
    def id(self) -> str: ...

    @property
    def channel_key(self) -> str | None: ...

    @property
    def temp(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    @property
    def queued(self) -> int: ...

    async def speakers(self) -> tuple[str, ...]: ...
