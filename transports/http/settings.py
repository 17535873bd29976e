"""Keys of a ``type = "http"`` transport table (one HTTP server per table)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentik.core.settings import empty_list

from .hosts import parse_authority, parse_origin

__all__ = ["A2ASettings", "HttpSettings", "TokenSettings"]


class TokenSettings(BaseModel):
    """One bearer token: where its secret value comes from and what it may use.

    The value is never written in the configuration: it is read from the
    environment variable ``env`` or from the file ``file`` (its first line).
    """

    model_config = ConfigDict(extra="forbid")

    #: Who uses the token: shown in logs, the default author of its messages,
    #: and part of the channel key of the conversations it creates
    #: (``http:<instance>:<name>:<id>``).
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    #: Environment variable that holds the token.
    env: str | None = None
    #: File that holds the token (first line), relative to the working directory.
    file: str | None = None
    #: Channel-key prefixes of the conversations this token may see and use
    #: (unset: every conversation, IRC and Slack ones included: an admin token).
    channels: list[str] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TokenSettings:
        if (self.env is None) == (self.file is None):
            raise ValueError("give the token's env (a variable name) or its file, not both")
        return self


class A2ASettings(BaseModel):
    """``[transports.<name>.a2a]``: the agent served over the agent-to-agent protocol
    (A2A v1.0, JSON-RPC binding; :mod:`agentik.transports.http.a2a`)."""

    model_config = ConfigDict(extra="forbid")

    #: Serve A2A: the agent card at /.well-known/agent-card.json and the JSON-RPC
    #: endpoint at <prefix><path> (needs the a2a extra: pip install -e '.[a2a]').
    enabled: bool = False
    #: Path of the JSON-RPC endpoint, under the API prefix.
    path: str = "/a2a"
    #: The agent's name on its card (unset: "agentik").
    name: str = Field("agentik", min_length=1, max_length=200)
    #: What the card says the agent does (unset: a generic line).
    description: str = Field("", max_length=2000)
    #: The base URL (scheme://host[:port]) clients reach this server at, written in
    #: the card; unset: the URL the card was requested through.
    public_url: str | None = None
    #: Serve the agent card without a token (A2A clients read it to learn how to
    #: authenticate); false: the card needs a bearer token like everything else.
    public_card: bool = True
    #: A2A tasks are records in the bot's store; only with an engine that keeps none
    #: (a plugin's) are they kept in memory, this many per process (the oldest are
    #: forgotten past it; a task's conversation stays in the store).
    max_tasks: int = Field(1000, ge=1)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", v):
            raise ValueError("path must look like /name or /name/more (letters, digits, ._~-)")
        return v

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        v = v.strip().rstrip("/")
        if parse_origin(v) is None:
            raise ValueError(f"{v!r} is not a base URL: write scheme://host or scheme://host:port")
        return v


class HttpSettings(BaseModel):
    """Settings of one HTTP API server.  Every key is documented in ``config.example.toml``."""

    model_config = ConfigDict(extra="forbid")

    #: Address to listen on.  Without tokens only a loopback address is used.
    host: str = "127.0.0.1"
    #: TCP port (0: any free port).  ``AGENTIK_PORT`` overrides it.
    port: int = Field(8080, ge=0, le=65535)
    #: Path prefix of the API (``""`` for none).
    prefix: str = "/agentik"
    #: Bearer tokens; none: no authentication and loopback only.
    tokens: list[TokenSettings] = Field(default_factory=empty_list)
    #: Largest request body accepted, in bytes (larger: 413).
    max_body_bytes: int = Field(1_048_576, ge=1024)
    #: Largest conversation snapshot ``POST …/conversations/import`` takes, in bytes.
    max_import_bytes: int = Field(16_777_216, ge=1024)
    #: Seconds of silence on an event stream before a heartbeat comment is sent.
    heartbeat: float = Field(15.0, gt=0)
    #: Events one stream client may fall behind before it is told and disconnected.
    subscriber_queue: int = Field(1024, ge=1)
    #: Serve the web chat page at ``/``.
    web_ui: bool = True
    #: Browser origins allowed to call the API from another site (CORS).  Each
    #: one is also an allowed origin (see ``allowed_origins``), except ``"*"``.
    cors_origins: list[str] = Field(default_factory=empty_list)
    #: ``Host`` values answered besides loopback ones (``127.0.0.1``, ``localhost``,
    #: ``[::1]``): names of a reverse proxy in front, ``name`` (any port) or
    #: ``name:port``; ``"*"``: any.  Checked without tokens always, with tokens
    #: when set.  Guards against DNS rebinding.
    allowed_hosts: list[str] = Field(default_factory=empty_list)
    #: Browser origins (``scheme://host[:port]``) allowed besides the server's own
    #: (a page served from the ``Host`` the request names, or a loopback origin
    #: on this port).  A request with any other ``Origin`` header is refused (403):
    #: without tokens always, with tokens when set.  Guards against cross-site requests.
    allowed_origins: list[str] = Field(default_factory=empty_list)
    #: Without tokens: channel-key prefixes of the conversations the local user
    #: sees and uses.  The default shows HTTP conversations only; add ``"irc:"``,
    #: ``"slack:"`` (or write ``["*"]``: every conversation) to expose other
    #: transports' conversations to anything that reaches the API.
    local_channels: list[str] = Field(default_factory=lambda: ["http:"])
    #: Serve the bot's Prometheus metrics at ``GET /metrics`` (outside ``prefix``).
    metrics: bool = True
    #: Environment variable holding the bearer token a scraper must present at
    #: ``/metrics`` (at least 16 characters).  Unset: any API token (none
    #: configured: no token, and the server only listens on loopback).
    metrics_token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    #: The agent-to-agent protocol (A2A) on this server: [transports.<name>.a2a].
    a2a: A2ASettings = Field(default_factory=A2ASettings)

    # -- connection limits (transports/http/server.py) --------------------------------------
    #: Seconds a connection gets to send a complete request head, from when it opens
    #: (or from the first byte of its next request); later bytes do not extend it.
    header_timeout: float = Field(10.0, gt=0)
    #: Seconds an idle kept-alive connection stays open after a response.
    keepalive_timeout: float = Field(30.0, gt=0)
    #: Connections open at once, event streams included; more get 503 and are closed
    #: (an idle one is closed first to take a new one: see docs/http-api.md).
    max_connections: int = Field(256, ge=1)
    #: Connections open at once from one client address; more get 503 (0: no cap).
    #: Behind a reverse proxy every client has the proxy's address: raise it or use 0.
    max_connections_per_client: int = Field(64, ge=0)
    #: Connections past max_connections kept for /health, /ready and requests with an
    #: Authorization header (one request each), when every open one is busy.
    reserved_connections: int = Field(4, ge=0)
    #: Seconds a reserved connection gets to send its request head (at most
    #: header_timeout); then it gets the 503, so idle sockets cannot hold the reserve.
    reserved_header_timeout: float = Field(2.0, gt=0)
    #: Connections the kernel queues until the server accepts them (listen backlog).
    backlog: int = Field(128, ge=1)
    #: Largest request head (request line and headers) in bytes; larger: 431.
    max_header_bytes: int = Field(32768, ge=1024)
    #: Most header lines in one request; more: 431.
    max_headers: int = Field(100, ge=1)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = v.rstrip("/")
        if v and not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", v):
            raise ValueError("prefix must look like /name or /name/more (letters, digits, ._~-)")
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for entry in v:
            if entry != "*" and parse_authority(entry) is None:
                raise ValueError(
                    f"{entry!r} is not a host name: write name, name:port, an IP address"
                    ' or [IPv6] (or "*" for any)'
                )
        return v

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for entry in v:
            if parse_origin(entry) is None:
                raise ValueError(
                    f"{entry!r} is not an origin: write scheme://host or scheme://host:port"
                    " (http or https, no path)"
                )
        return v

    @field_validator("local_channels")
    @classmethod
    def _local(cls, v: list[str]) -> list[str]:
        if "*" in v and len(v) > 1:
            raise ValueError('"*" (every conversation) stands alone')
        if any(not p for p in v):
            raise ValueError('an empty prefix would match every conversation: write ["*"]')
        return v

    @field_validator("tokens")
    @classmethod
    def _unique_names(cls, v: list[TokenSettings]) -> list[TokenSettings]:
        names = [t.name for t in v]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two tokens are named {name!r}")
        return v
