"""Long-term memory backends: the interface the builder requires.

A memory backend stores what the agent learns beyond one conversation and
declares its own tools (``memory_save``, ``memory_read``, ...), which the
agent merges with every other tool.  :class:`NoMemory` is the explicit
"remember nothing" choice (``[memory] backend = "none"``).
"""

from __future__ import annotations

import abc

from .tools.base import Tool

__all__ = ["MemoryBackend", "NoMemory"]


class MemoryBackend(abc.ABC):
    """Base class of long-term memory backends."""

    #: Registry / configuration name.
    name: str = ""

    @abc.abstractmethod
    def tools(self) -> list[Tool]:
        """The tools this backend offers the model."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open resources; called once by the agent's ``start``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called by the agent's ``aclose``."""


class NoMemory(MemoryBackend):
    """Remembers nothing and offers no tools."""

    name = "none"

    def tools(self) -> list[Tool]:
        return []
