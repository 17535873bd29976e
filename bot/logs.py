"""Structured logging to stderr that never prints a secret.

``setup_logging(level, fmt, secrets)`` installs one stderr handler on the
root logger: ``text`` lines (``time level logger: message``) or ``json``
objects, one per line.  Every configured secret value is replaced by
``***`` in the final output, whatever logger produced it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable

__all__ = ["RedactingFormatter", "add_secrets", "setup_logging"]


class RedactingFormatter(logging.Formatter):
    """Formats a record as text or JSON, then blanks out secrets."""

    def __init__(self, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.fmt = fmt
        # Longest first, so a secret containing another is fully hidden.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        if self.fmt == "json":
            line = json.dumps(
                {
                    "ts": ts,
                    "level": record.levelname.lower(),
                    "logger": record.name,
                    "msg": message,
                },
                ensure_ascii=False,
            )
        else:
            line = f"{ts} {record.levelname:<7} {record.name}: {message}"
        for secret in self.secrets:
            line = line.replace(secret, "***")
        return line


def setup_logging(level: str = "warning", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Route all logging to stderr at ``level``, redacting ``secrets``."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_agentik", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(fmt, secrets))
    handler._agentik = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Chatty client libraries stay at WARNING unless we are debugging.
    for noisy in ("httpx", "httpcore", "openai", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def add_secrets(secrets: Iterable[str]) -> None:
    """Redact ``secrets`` too (a reloaded configuration may bring new ones)."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if getattr(handler, "_agentik", False) and isinstance(formatter, RedactingFormatter):
            known = {*formatter.secrets, *(s for s in secrets if s and len(s) >= 4)}
            formatter.secrets = sorted(known, key=len, reverse=True)
