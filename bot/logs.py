"""Structured logging to stderr that never prints a secret.

``setup_logging(level, fmt, secrets)`` installs one stderr handler on the
root logger: ``text`` lines (``time level logger: message``) or ``json``
objects, one per line.  Every configured secret value is replaced by
``***`` in the final output, whatever logger produced it.

**Fields.**  A log call's ``extra=`` values (``transport``, ``channel``,
``conversation_id``, ``run_id``, ``event``, ``duration``, ``tokens``, …) are
keys of the JSON object besides ``ts``, ``level``, ``logger`` and ``msg``;
:func:`log_event` is the short way to write such a line.  Text lines show
the message only, with its control characters escaped (``\\n``, ``\\x1b``):
text from a chat or a model cannot forge a log line or drive the terminal
that shows the log.  A traceback follows on its own lines.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["RedactingFormatter", "add_secrets", "log_event", "setup_logging"]

#: Attributes every LogRecord has: anything else came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
#: In a text line's message: what would end the line or reach the terminal as a
#: command (C0 but tab, DEL, C1, the Unicode line and paragraph separators).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029]")


def _escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


#: Keys of the JSON object that fields may not replace.  ``color_message`` is
#: uvicorn's copy of ``msg`` with ANSI colour codes: noise (and escape sequences)
#: in a JSON line, so it is dropped.
_RESERVED = frozenset({"ts", "level", "logger", "msg", "color_message"})


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def log_event(
    logger: logging.Logger | logging.LoggerAdapter[Any],
    level: int,
    event: str,
    msg: str,
    *args: object,
    **fields: Any,
) -> None:
    """Log ``msg % args`` with ``event`` and ``fields`` as structured fields.

    ``log_event(log, logging.INFO, "answer", "answered in %s", key, run_id=r)``:
    JSON logs get ``"event": "answer", "run_id": r`` as keys.
    """
    if logger.isEnabledFor(level):
        logger.log(level, msg, *args, extra={"event": event, **fields})


class RedactingFormatter(logging.Formatter):
    """Formats a record as text or JSON, then blanks out secrets."""

    def __init__(self, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.fmt = fmt
        # Longest first, so a secret containing another is fully hidden.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._forms: tuple[list[str], list[str]] = ([], [])

    def _secret_forms(self) -> list[str]:
        """Every way a secret may appear in a line, longest first.

        Besides the value itself: escaped by JSON (a quote, a backslash, a
        control character) or by ``%r`` of a string (``repr``), or both.
        """
        if self._forms[0] is not self.secrets:  # add_secrets() replaced the list
            forms = set()
            for secret in self.secrets:
                for form in (secret, repr(secret)[1:-1], _escaped(secret)):
                    forms.add(form)
                    forms.add(json.dumps(form, ensure_ascii=False)[1:-1])
                    forms.add(json.dumps(form)[1:-1])
            self._forms = (self.secrets, sorted(forms, key=len, reverse=True))
        return self._forms[1]

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        trace = "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        if self.fmt == "json":
            obj: dict[str, Any] = {
                "ts": ts,
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": message + trace,
            }
            for key, value in record.__dict__.items():
                if key not in _STANDARD and key not in _RESERVED and not key.startswith("_"):
                    obj[key] = _jsonable(value)
            # JSON escapes C0 itself; DEL, C1 and the separators are valid as
            # they are, but line breaks or commands to many readers and terminals.
            line = _JSON_UNSAFE.sub(
                lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False)
            )
        else:
            line = f"{ts} {record.levelname:<7} {record.name}: {_escaped(message)}{trace}"
        for form in self._secret_forms():
            line = line.replace(form, "***")
        # A lone surrogate (from ``surrogateescape`` or a JSON ``\\udcxx`` escape
        # in a request) cannot be written as UTF-8: the record would be lost.
        # As ``\\udcxx`` it is a JSON escape and a readable text.
        return line.encode("utf-8", "backslashreplace").decode("utf-8")


#: The logger of the lines shown at the default level (``warning``) although they
#: are INFO: one ready line per transport, reload summaries, the stop.
STATUS_LOGGER = "agentik.status"


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
    # What the operator should see at the default level (a transport is ready, a
    # reload was applied, the bot stops) is INFO on its own logger, shown unless
    # the level asks for errors only.
    chosen = logging.getLevelName(level.upper())
    status_level = chosen if isinstance(chosen, int) and chosen > logging.WARNING else logging.INFO
    logging.getLogger(STATUS_LOGGER).setLevel(status_level)
    # Chatty client libraries stay at WARNING unless we are debugging.
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def add_secrets(secrets: Iterable[str]) -> None:
    """Redact ``secrets`` too (a reloaded configuration may bring new ones)."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if getattr(handler, "_agentik", False) and isinstance(formatter, RedactingFormatter):
            known = {*formatter.secrets, *(s for s in secrets if s and len(s) >= 4)}
            formatter.secrets = sorted(known, key=len, reverse=True)
