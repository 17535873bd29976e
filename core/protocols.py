"""What approvals, questions and compaction need of a conversation's parts, as Protocols.

They work on one conversation's
:class:`~agentik.core.services.ConversationParts`, while the services (and
the conversation) are built on top of them: their annotations name these
protocols — exactly the members they use, which mypy checks the real classes
against — instead of importing the modules above them (an import cycle,
even one under ``TYPE_CHECKING``, ties the modules together: none can be
read, tested or changed alone).  What an agent provides is
:class:`~agentik.core.services.AgentLike`; what the hooks see of a
conversation, :class:`~agentik.core.hooktypes.ConversationLike`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .events import Event

if TYPE_CHECKING:
    from .hooktypes import ConversationLike
    from .workingmemory import WorkingMemory

__all__ = ["EventEmitter", "PartsLike"]

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
