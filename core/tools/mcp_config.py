"""The configuration of an MCP server (``[[mcp.servers]]``) and the names its tools
are offered under.

Apart from :mod:`agentik.core.tools.mcp` (the client), so that reading a
configuration, or a bot with no MCP server, does not load the client's modules
(0.2 MB; issue 31, fifteenth pass).  :mod:`~agentik.core.tools.mcp` re-exports both.
"""

from __future__ import annotations

import hashlib
import re
from fnmatch import fnmatchcase
from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ..settings import SETTINGS, BlankSecret, PathSetting

__all__ = ["MAX_TOOL_NAME", "MCPServerConfig", "tool_name", "uncut_tool_name"]

_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")
#: Longest tool name a model is offered: OpenAI documents ``^[a-zA-Z0-9_-]{1,64}$``.
MAX_TOOL_NAME = 64


def uncut_tool_name(server: str, remote: str) -> str:
    """``<server>__<tool>`` with the characters a model API refuses replaced by ``_``:
    :func:`tool_name` before a long name is cut."""
    return f"{server}__{_NAME_BAD.sub('_', remote)}"


def tool_name(server: str, remote: str) -> str:
    """The name a server's tool is offered under: ``<server>__<tool>``, with
    characters a model API refuses replaced by ``_``; a name over
    :data:`MAX_TOOL_NAME` characters is cut and ends in ``_`` and 8 hex digits
    of a hash of the tool's own name, so it is stable across restarts and two
    long names that share a prefix stay apart."""
    name = uncut_tool_name(server, remote)
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(remote.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"


# settings_dataclass spelled out, so type checkers see the keyword constructor.
@dataclass(frozen=True, kw_only=True, slots=True, config=SETTINGS)
class MCPServerConfig:
    """One MCP server; its tools become ``<name>__<tool>``.

    A program spoken to over stdio, or a streamable HTTP URL.  This class is
    also the configuration's ``[[mcp.servers]]`` table (one declaration of
    each key).
    """

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: PathSetting = None
    url: str | None = None
    headers: dict[str, str] | None = None
    bearer_token: BlankSecret = None
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    timeout: Annotated[float, Field(gt=0)] = 60.0
    #: ``eager``: connect when the toolset starts; ``lazy``: when its tools are
    #: first needed.  Unset: ``eager`` (the configuration's ``[mcp] startup``).
    startup: Literal["eager", "lazy"] | None = None
    restart_min: Annotated[float, Field(gt=0)] = 0.5
    restart_max: Annotated[float, Field(gt=0)] = 30.0
    #: Caps on what this server puts into every model request (docs/mcp.md):
    #: at most this many of its tools are offered (the first ones it lists) ...
    max_tools: Annotated[int, Field(ge=1, le=10_000)] = 100
    #: ... a description longer than this many characters is cut ...
    max_description: Annotated[int, Field(ge=64, le=1_000_000)] = 2_000
    #: ... and a tool whose input schema is over this many bytes (as JSON) is left out.
    max_schema: Annotated[int, Field(ge=256, le=10_000_000)] = 16_000

    def __post_init__(self) -> None:
        if "__" in self.name or _NAME_BAD.search(self.name):
            raise ValueError(
                f"MCP server name {self.name!r}: use letters, digits, '_' or '-' (no '__')"
            )
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"MCP server {self.name!r}: give either command (stdio) or url (streamable HTTP)"
            )
        if self.restart_max < self.restart_min:
            raise ValueError(f"MCP server {self.name!r}: restart_max is below restart_min")

    @property
    def token(self) -> str | None:
        """The bearer token, revealed."""
        return self.bearer_token.get_secret_value() if self.bearer_token else None

    def __repr__(self) -> str:
        # Never show the token, header or environment values.
        where = f"command={self.command!r}" if self.command else f"url={self.url!r}"
        return f"MCPServerConfig(name={self.name!r}, {where})"

    def offers(self, tool_name: str) -> bool:
        if any(fnmatchcase(tool_name, p) for p in self.deny):
            return False
        return self.allow is None or any(fnmatchcase(tool_name, p) for p in self.allow)
