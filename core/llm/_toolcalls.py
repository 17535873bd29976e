"""Tool calls for local models: the forced-call schema and a markup scanner.

Small local models rarely call tools reliably on their own.  Two helpers:

* :func:`forced_call_schema` — a JSON-Schema that only admits a call of one
  of the offered tools (``{"name": <one of them>, "arguments": {...}}``).
  Turned into a llama.cpp grammar, it makes the model's output a valid call
  whatever the model would otherwise have said.
* :class:`ToolCallScanner` — splits a streamed answer into text and
  ``<tool_call>{...}</tool_call>`` blocks, the markup of Hermes/Qwen-style
  chat templates, holding back only text that may be the start of a block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import ToolSpec

__all__ = ["ToolCallScanner", "forced_call_schema", "parse_call"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

#: JSON-Schema keywords llama.cpp's schema-to-grammar converter understands
#: well; anything else in a tool's parameters falls back to "any object".
_PLAIN = {"type", "properties", "required", "items", "enum", "const", "description"}


def _grammar_friendly(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key not in _PLAIN and key not in ("title", "default", "minItems", "maxItems"):
            if key == "additionalProperties" and value is False:
                continue
            return False
        if key == "properties":
            if not isinstance(value, dict) or not all(_grammar_friendly(v) for v in value.values()):
                return False
        if key == "items" and not _grammar_friendly(value):
            return False
    return True


def forced_call_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """A schema admitting exactly one call of one of ``tools``."""
    options = []
    for t in tools:
        params = t.parameters if isinstance(t.parameters, dict) else {}
        if not params.get("properties"):
            params = {"type": "object", "properties": {}}  # no arguments: exactly {}
        elif not _grammar_friendly(params):
            params = {"type": "object"}  # any arguments object
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def parse_call(text: str, names: Sequence[str]) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` from a call written as JSON, or None.

    Accepts ``{"name": ..., "arguments": {...}}`` (``parameters`` too, as some
    templates write it); the name must be one of ``names``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return data["name"], json.dumps(args, ensure_ascii=False)


class ToolCallScanner:
    """Feed streamed text; get back the text to show, collect the calls.

    Text outside ``<tool_call>…</tool_call>`` is passed on as soon as it
    cannot be the start of the opening tag; each block's JSON becomes a call
    (``calls``).  A block that is not a valid call of an offered tool is
    passed on as text, so nothing the model wrote is lost.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.calls: list[tuple[str, str]] = []
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> str:
        """Add ``text``; return what can be shown now."""
        self._buf += text
        out: list[str] = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0:
                    break
                self._close_block(self._buf[:end], out)
                self._buf = self._buf[end + len(CLOSE) :]
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                out.append(self._buf[:start])
                self._buf = self._buf[start + len(OPEN) :]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buf, OPEN)
            out.append(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            break
        return "".join(out)

    def finish(self) -> str:
        """The end of the answer: whatever is still held back, as text."""
        out: list[str] = []
        if self._in_call:
            # A block the model did not close: a call if it parses, else text.
            self._close_block(self._buf, out, closed=False)
        else:
            out.append(self._buf)
        self._buf = ""
        self._in_call = False
        return "".join(out)

    def _close_block(self, body: str, out: list[str], *, closed: bool = True) -> None:
        self._in_call = False
        call = parse_call(body.strip(), self.names)
        if call is None:
            out.append(f"{OPEN}{body}{CLOSE if closed else ''}")
        else:
            self.calls.append(call)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
