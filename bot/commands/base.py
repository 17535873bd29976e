"""What a chat command is, what its handler is handed, and the registry.

A :class:`Command` is a name, a line of help and an async handler; the
handler gets a :class:`CommandContext` (the speaker's message, the channel,
the access decision, ``say``, and the :class:`CommandHost` — the bridge, seen
through the members commands may use), so a command never imports the
bridge.  Built-in commands and plugins' commands are registered the same
way, through the ``register_commands`` hook
(:func:`agentik.core.hookspecs.register_commands`), into one
:class:`CommandRegistry`; ``!help`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agentik.core.errors import PluginError

from ..chat import author_id, speaker_key

if TYPE_CHECKING:
    from agentik.core import Agent
    from agentik.core.access import AccessPolicy, Decision
    from agentik.core.budgets import Budgets, Subject
    from agentik.transports.base import IncomingMessage, OutgoingKind, Transport

    from ..channel import ChannelOptions, OpenChannel
    from ..chansettings import ChannelSettingsBook, Effective, RoleFor
    from ..links import Links

__all__ = ["Command", "CommandContext", "CommandHost", "CommandRegistry", "Handler"]

#: A command's handler: called with the context of one use, awaited.
Handler = Callable[["CommandContext"], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One chat command (``!name``).

    ``needs_role``: the lowest role that may run it (``admin``; a named role
    of ``[access]``, which admins and owners also satisfy); ``None``: anyone
    the channel's access rules let run it.  The access rules
    (``[[access.rules]] commands``) apply to every command, a plugin's too.
    ``listed_for``: the lowest role the short ``!help`` of a shared room lists
    it for (default: ``needs_role``), for a command that checks its rights
    itself.
    """

    name: str
    help: str
    handler: Handler
    needs_role: str | None = None
    listed_for: str | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower() or any(c.isspace() for c in self.name):
            raise ValueError(f"a command's name is one lowercase word, not {self.name!r}")


class CommandHost(Protocol):
    """What a command may use of the bridge that runs it (the bridge implements it)."""

    agent: Agent
    #: Who may do what (roles, grants, identities).
    access: AccessPolicy
    #: Usage limits (``None``: unlimited).
    budgets: Budgets | None
    #: The speaker's role in a channel.
    role_for: RoleFor
    #: Per-channel settings (``!set``).
    settings: ChannelSettingsBook
    #: The role ``!set``/``!unset`` need.
    settings_role: str
    #: Every command, built-in and plugins' (for ``!help``).
    commands: CommandRegistry
    #: Linked channels (``!link``, ``!unlink``, ``!links``).
    links: Links

    async def channel(self, key: str, transport: Transport, opts: ChannelOptions) -> OpenChannel:
        """The channel ``key``, opened (with its conversation) if it is not."""
        ...

    def open_channel(self, key: str) -> OpenChannel | None:
        """The channel ``key`` if it is open now, else ``None``."""
        ...

    async def interrupt(self, channel_key: str) -> bool:
        """Interrupt the turn running in ``channel_key``; ``False`` if none."""
        ...

    async def effective(self, channel_key: str, transport: Transport) -> Effective:
        """The settings in force in a channel."""
        ...

    async def settings_changed(self, channel_key: str, transport: Transport) -> Effective:
        """A channel's settings changed: put them in force for its next turn."""
        ...

    async def start_over(self, key: str, transport: Transport) -> tuple[OpenChannel | None, int]:
        """A new conversation for channel ``key``: the channel held before (or
        ``None``) and how many queued messages moved to the new one."""
        ...

    def subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for by the budgets."""
        ...

    async def send(
        self, transport: Transport, key: str, text: str, kind: OutgoingKind, reply_to: object
    ) -> int:
        """Send ``text`` to channel ``key``; how many pieces it took."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandContext:
    """One use of a command: what was said, where, by whom, and what it may use."""

    #: The command's name, as typed (lowercase, without the prefix).
    name: str
    #: The words after the name.
    args: list[str]
    message: IncomingMessage
    transport: Transport
    #: The channel's options in force (prefix, caps on answers, ...).
    options: ChannelOptions
    #: What the speaker's role may do here.
    decision: Decision
    host: CommandHost

    @property
    def key(self) -> str:
        """The channel's key."""
        return self.message.channel_key

    @property
    def prefix(self) -> str:
        """The channel's command prefix (``!``)."""
        return self.options.command_prefix

    @property
    def agent(self) -> Agent:
        return self.host.agent

    @property
    def access(self) -> AccessPolicy:
        return self.host.access

    @property
    def author_id(self) -> str | None:
        """The speaker's verified identity (``libera:alice``), else ``None``."""
        return author_id(self.transport, self.message)

    @property
    def speaker(self) -> str:
        """The speaker as a key, verified or not (never equal to a verified one)."""
        return speaker_key(self.transport, self.message)

    @property
    def actor(self) -> str:
        """Who gives the command, as an identity key (``libera:account:alice``), else
        as :attr:`speaker`; recorded with what it changes."""
        return self.access.identity(self.transport.name, self.message).id or self.speaker

    @property
    def shared(self) -> bool:
        """A shared room (not a direct conversation, not a thread): commands answer short."""
        return not self.message.direct and not self.transport.in_thread(self.key)

    async def say(self, text: str) -> None:
        """Answer in the channel (a ``command`` line, to whoever asked)."""
        await self.host.send(self.transport, self.key, text, "command", self.message.reply_to)


class CommandRegistry:
    """Every chat command by name, in the order registered (built-ins first)."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._owners: dict[str, str] = {}

    def register(self, command: Command, *, plugin: str = "agentik") -> None:
        """Add ``command``; a name registered twice is a PluginError naming both plugins."""
        if not isinstance(command, Command):
            raise PluginError(f"plugin {plugin!r} registered a command that is not a Command")
        owner = self._owners.get(command.name)
        if owner is not None:
            raise PluginError(
                f"command {command.name!r} is registered by both {owner!r} and {plugin!r}"
            )
        self._owners[command.name] = plugin
        self._commands[command.name] = command

    def collect(self, impls: Iterable[tuple[str, Callable[..., object]]]) -> None:
        """Call each ``(plugin, register_commands)`` implementation with a ``register``
        that records the plugin (a clash or a crash names it)."""
        for plugin, function in impls:

            def register(command: Command, plugin: str = plugin) -> None:
                self.register(command, plugin=plugin)

            try:
                function(register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"plugin {plugin!r} failed in register_commands: {exc}") from exc

    def get(self, name: str) -> Command | None:
        return self._commands.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._commands

    def __iter__(self) -> Iterator[Command]:
        return iter(list(self._commands.values()))

    def __len__(self) -> int:
        return len(self._commands)

    def help(self) -> dict[str, str]:
        """Each command's name and help line, in order."""
        return {c.name: c.help for c in self._commands.values()}
