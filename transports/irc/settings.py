"""Keys of a ``type = "irc"`` transport table (one IRC network per table)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from agentik.core.settings import PathSetting, empty_list

__all__ = ["IRCSettings"]

_Recovery = Literal["GHOST", "REGAIN", "RECOVER"]
#: GHOST first: on every services package it only disconnects the other session.
_RECOVERY_ORDER: tuple[_Recovery, ...] = ("GHOST", "REGAIN", "RECOVER")


class IRCSettings(BaseModel):
    """Settings of one IRC connection.  Every key is documented in ``config.example.toml``."""

    model_config = ConfigDict(extra="forbid")

    #: Network name used in channel keys (``irc:<network>:<#channel>``); default: the
    #: transport instance's name.
    network: str | None = None
    host: str = "127.0.0.1"
    #: Default 6697 with TLS, 6667 without.
    port: int | None = Field(None, ge=1, le=65535)
    tls: bool = True
    #: Verify the server's certificate (and host name).  Only turn off for testing.
    ssl_verify: bool = True
    #: Trust this CA file (PEM) instead of the system's, e.g. a private network's CA.
    #: Relative to the configuration file, as every path in it.
    ssl_ca_file: PathSetting = None
    #: Seconds to open the connection, and again for the TLS handshake, before giving up.
    connect_timeout: float = Field(30.0, gt=0)
    #: Server password (PASS).
    password: SecretStr | None = None
    nick: str = "agentik"
    #: Tried in order when the nick is taken; then the nick with digits.
    alt_nicks: list[str] = Field(default_factory=empty_list)
    username: str = "agentik"
    realname: str = "agentik chat bot"
    #: ``plain`` (account + password), ``external`` (TLS client certificate), or ``none``.
    sasl_mechanism: Literal["none", "plain", "external"] = "none"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    #: With SASL configured, never register unauthenticated: when the server does not
    #: offer SASL (services down), hold registration, wait ``sasl_wait`` seconds for it
    #: to be offered (``CAP NEW``), else disconnect and retry.  ``false``: register
    #: without it (a warning) and log in when the server offers it later (``CAP NEW``,
    #: or our own ``CAP LS`` every ``sasl_wait`` seconds).
    sasl_required: bool = True
    #: Seconds to wait for the server to offer SASL; also the bound of one SASL
    #: exchange (hung services) and the interval of the re-asks above.
    sasl_wait: float = Field(20.0, gt=0)
    #: PEM files for a TLS client certificate (SASL EXTERNAL / CertFP).
    client_cert: PathSetting = None
    client_key: PathSetting = None
    #: Sent to NickServ (IDENTIFY) after connecting when SASL is not used.
    nickserv_password: SecretStr | None = None
    #: The nick is taken when we connect (our own old session lingering after a crash
    #: or a failover): ask NickServ to free it with these commands, tried in order
    #: until the services know one (``GHOST``: Atheme, Anope and most others; Atheme's
    #: ``REGAIN``; Anope's ``RECOVER``), then take the nick.  Needs a login: SASL
    #: (nothing more is sent) or ``nickserv_password``.  ``[]``: never ask.
    nickserv_recover: list[_Recovery] = Field(default_factory=lambda: list(_RECOVERY_ORDER))
    #: Channels to join; ``"#chan key"`` for a keyed channel.
    channels: list[str] = Field(default_factory=empty_list)
    #: ``prefix``: answer in channels only to ``nick: ...`` / ``nick, ...``;
    #: ``mention``: also when the nick appears anywhere in the message.
    address_mode: Literal["prefix", "mention"] = "mention"
    #: In channels, start each answer with the asker's nick (``alice: ...``), on its
    #: first line only; never in private messages.
    address_asker: bool = True
    #: Identity of a speaker without a services account (no IRCv3 ``account`` tag):
    #: ``none``: no user notes for them (and no other per-user data or rights);
    #: ``hostmask``: key them on ``nick!user@host`` (spoofable where hosts are not
    #: cloaked; a warning is logged at start).
    unverified_identity: Literal["none", "hostmask"] = "none"
    #: Flood control: lines sent back to back, then ``flood_rate`` lines per second.
    flood_burst: int = Field(4, ge=1)
    flood_rate: float = Field(1.0, gt=0)
    #: Incoming rate limit: at most this many messages per user per minute (a user is
    #: their services account, else their ``ident@host``: a new nick is no new user).
    user_rate_limit: int = Field(20, ge=1)
    #: Reconnect backoff: first delay, cap, and how long a connection must last to reset it.
    reconnect_min: float = Field(5.0, gt=0)
    reconnect_max: float = Field(300.0, gt=0)
    reconnect_stable: float = Field(60.0, gt=0)
    #: Seconds of silence before we PING the server, and before we give up on it.
    ping_interval: float = Field(120.0, gt=0)
    ping_timeout: float = Field(240.0, gt=0)
    #: Lines kept waiting in all (flood control, or while disconnected: delivered
    #: after reconnecting); past this the target with the most lines waiting loses
    #: its oldest line, with a warning in the log; other targets lose nothing.
    queue_limit: int = Field(500, ge=1)
    #: Lines kept waiting for one channel or nick; past this its oldest are dropped
    #: (a warning in the log).  Targets take turns, one line each, so one flooded
    #: channel never delays another's answers by more than its share.
    target_queue_limit: int = Field(100, ge=1)
    #: Answer to CTCP VERSION.
    version: str = "agentik IRC bot"

    @model_validator(mode="after")
    def _check(self) -> IRCSettings:
        if self.sasl_mechanism == "plain" and not (self.sasl_username and self.sasl_password):
            raise ValueError("sasl_mechanism 'plain' needs sasl_username and sasl_password")
        if self.sasl_mechanism == "external" and not self.client_cert:
            raise ValueError("sasl_mechanism 'external' needs client_cert")
        if self.reconnect_max < self.reconnect_min:
            raise ValueError("reconnect_max must be >= reconnect_min")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or (6697 if self.tls else 6667)
