"""Bearer tokens and what each one may see.

A request carries ``Authorization: Bearer <token>``.  The token is compared
in constant time with every configured one; the match gives a
:class:`Principal`: a name and, optionally, the channel-key prefixes of the
conversations it may use (a token without ``channels`` may use every
conversation: an admin token; each is noted in the log at start-up).
Without configured tokens every request is the ``local`` principal (and the
server only listens on loopback): it sees the conversations under the
``local_channels`` prefixes, by default the HTTP ones only
(:func:`local_principal`).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentik.core.errors import ConfigError

from .settings import HttpSettings, TokenSettings

__all__ = ["LOCAL", "Principal", "TokenTable", "load_tokens", "local_principal"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's name and the channel-key prefixes it may use."""

    name: str
    #: ``None``: every conversation.
    prefixes: tuple[str, ...] | None = None

    def allows(self, channel_key: str | None) -> bool:
        """Whether a conversation bound to ``channel_key`` is visible to this caller.

        A limited token never sees conversations without a channel key.
        """
        if self.prefixes is None:
            return True
        return channel_key is not None and channel_key.startswith(self.prefixes)


#: The caller when no tokens are configured, as :meth:`TokenTable.lookup` answers;
#: what it may see comes from the settings (:func:`local_principal`).
LOCAL = Principal("local")


def local_principal(settings: HttpSettings) -> Principal:
    """The no-token caller with the ``local_channels`` of ``settings`` (``["*"]``: everything)."""
    channels = settings.local_channels
    return Principal(LOCAL.name, None if channels == ["*"] else tuple(channels))


class TokenTable:
    """Configured tokens, looked up in constant time per token."""

    def __init__(self, entries: Sequence[tuple[bytes, Principal]]) -> None:
        self._entries = list(entries)

    @property
    def enabled(self) -> bool:
        """Whether requests must present a token."""
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization`` header value, or ``None``."""
        if not self._entries:
            return LOCAL
        if not authorization:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return None
        presented = value.strip().encode("utf-8", "surrogateescape")
        found: Principal | None = None
        # Compare with every token, so the time taken says nothing about which matched.
        for secret, principal in self._entries:
            if hmac.compare_digest(secret, presented):
                found = principal
        return found


def load_tokens(
    tokens: Sequence[TokenSettings], *, where: str, environ: Mapping[str, str]
) -> TokenTable:
    """Read every token's value from its variable or file; errors name the key.

    A token value must be at least 16 characters: a short secret is a
    configuration mistake, not something to run with.
    """
    entries: list[tuple[bytes, Principal]] = []
    for i, token in enumerate(tokens):
        key = f"{where}.tokens[{i}]"
        if token.env is not None:
            value = environ.get(token.env)
            if value is None:
                raise ConfigError(f"{key}.env: environment variable {token.env} is not set")
            source = f"{key}.env"
        else:
            assert token.file is not None
            try:
                with open(token.file, encoding="utf-8") as f:
                    value = f.readline()
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                raise ConfigError(f"{key}.file: cannot read {token.file}: {reason}") from None
            source = f"{key}.file"
        value = value.strip()
        if len(value) < 16:
            raise ConfigError(
                f"{source}: the token of {token.name!r} is {'empty' if not value else 'too short'}"
                " (use at least 16 characters, e.g. from `openssl rand -hex 32`)"
            )
        prefixes = tuple(token.channels) if token.channels is not None else None
        if prefixes is None:
            log.info(
                "%s: token %r has no channels: it sees and may use every conversation,"
                " other transports' (IRC, Slack) too",
                key,
                token.name,
            )
        entries.append((value.encode("utf-8"), Principal(token.name, prefixes)))
    values = [v for v, _ in entries]
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}.tokens: two tokens have the same value")
    return TokenTable(entries)
