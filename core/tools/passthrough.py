"""Passthrough tools: a tool that calls another tool directly, no model in between.

A passthrough (``[[passthrough]]`` in the configuration, a
:class:`PassthroughSpec`) exports a tool of its own name whose call goes
straight to a target tool — an MCP server's tool (``time__get_current_time``),
a plugin's or a memory tool — with arguments merged from three places::

    [[passthrough]]
    name = "time_now"
    tool = "time__get_current_time"
    description = "The current time in UTC"
    arguments = { timezone = "UTC" }   # fixed: the caller cannot change them
    defaults = { }                     # used when the caller leaves them out

The exported tool's JSON Schema is the target's without the fixed
arguments, so the model (or a person, with ``!tool``) gives only the rest.
Before the target is called, the merged arguments are validated against the
target's schema; a bad argument is a clear tool error naming it, and the
target is not called.  No model request is made: the result is the target's.

The tool is offered while its target is (an MCP server that is down takes
its passthroughs with it).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any

from pydantic import Field

from ..errors import ToolError
from ..settings import settings_dataclass
from .base import Tool, ToolContext, ToolResult

__all__ = ["PassthroughSpec", "PassthroughTool", "PassthroughToolset"]

_TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


@settings_dataclass
class PassthroughSpec:
    """``[[passthrough]]``: a tool that calls ``tool`` directly with validated arguments."""

    #: The exported tool's name (what the model and ``!tool`` call).
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    #: The target tool: an MCP tool (``<server>__<tool>``), a plugin's or a memory tool.
    tool: Annotated[str, Field(min_length=1, max_length=128)]
    #: What the tool does, for the model; unset: the target's description.
    description: str = ""
    #: Fixed arguments: always sent, the caller cannot change them.
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: Default arguments: sent when the caller leaves them out.
    defaults: dict[str, Any] = Field(default_factory=dict)


def _exported_schema(
    target: dict[str, Any], fixed: Iterable[str], defaults: Iterable[str]
) -> dict[str, Any]:
    """The target's schema without the fixed arguments (and with defaulted ones optional)."""
    schema = copy.deepcopy(target) if target else {"type": "object", "properties": {}}
    fixed, defaults = set(fixed), set(defaults)
    props = schema.get("properties")
    if isinstance(props, dict):
        schema["properties"] = {k: v for k, v in props.items() if k not in fixed}
    required = schema.get("required")
    if isinstance(required, list):
        kept = [k for k in required if k not in fixed and k not in defaults]
        if kept:
            schema["required"] = kept
        else:
            schema.pop("required")
    return schema


def _where(path: Sequence[Any]) -> str:
    return "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path)
    )


class PassthroughTool:
    """The tool a :class:`PassthroughSpec` exports (see the module docstring)."""

    def __init__(
        self, spec: PassthroughSpec, target: Tool, find: Callable[[str], Tool | None]
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._find = find
        self.update(target)

    def update(self, target: Tool) -> None:
        """Follow the target's current description and schema."""
        self.description = self.spec.description or target.description
        self.parameters: dict[str, Any] = _exported_schema(
            target.parameters, self.spec.arguments, self.spec.defaults
        )

    def __repr__(self) -> str:
        return f"PassthroughTool({self.name!r} -> {self.spec.tool!r})"

    def prepare(self, arguments: dict[str, Any]) -> tuple[Tool, dict[str, Any]]:
        """The target and the merged, validated arguments; :class:`ToolError` if bad."""
        target = self._find(self.spec.tool)
        if target is None:
            raise ToolError(f"{self.name}: its tool {self.spec.tool} is not available now")
        if not isinstance(arguments, dict):
            raise ToolError(f"{self.name}: arguments must be an object")
        clash = sorted(
            k
            for k in arguments
            if k in self.spec.arguments and arguments[k] != self.spec.arguments[k]
        )
        if clash:
            raise ToolError(
                f"{self.name}: argument {clash[0]!r} is fixed by the configuration; leave it out"
            )
        merged = {**self.spec.defaults, **arguments, **self.spec.arguments}
        schema = target.parameters or {"type": "object"}
        props = schema.get("properties")
        if isinstance(props, dict) and schema.get("additionalProperties") in (None, False):
            # Servers often ignore what they do not know; a caller's typo should not
            # silently change nothing.
            unknown = sorted(k for k in merged if k not in props)
            if unknown:
                known = ", ".join(sorted(k for k in props if k not in self.spec.arguments))
                raise ToolError(
                    f"{self.name}: unknown argument {unknown[0][:64]!r}"
                    f" (arguments: {known or 'none'})"
                )
        # Here, not at the top: the [[passthrough]] configuration is read by every bot,
        # jsonschema is needed by a call only (docs/operations.md, "What a started bot
        # imports").
        import jsonschema  # type: ignore[import-untyped]
        from jsonschema.exceptions import best_match  # type: ignore[import-untyped]

        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            validator = cls(schema)
        except jsonschema.SchemaError:
            raise ToolError(
                f"{self.name}: the tool {self.spec.tool} has an unusable schema"
            ) from None
        error = best_match(validator.iter_errors(merged))
        if error is not None:
            path = list(error.absolute_path)
            if path and path[0] in self.spec.arguments:
                raise ToolError(
                    f"{self.name}: the configured argument {path[0]!r} does not fit"
                    f" the tool {self.spec.tool}"
                )
            where = f"argument {_where(path)!r}: " if path else "arguments: "
            message = re.sub(r"\s+", " ", error.message)[:200]
            raise ToolError(f"{self.name}: {where}{message}")
        return target, merged

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        target, merged = self.prepare(arguments)
        return await target.call(merged, context)


def _is_toolset(source: Any) -> bool:
    return callable(getattr(source, "tools", None)) and not callable(getattr(source, "call", None))


class PassthroughToolset:
    """The passthrough tools of ``specs``, their targets found among ``sources``
    (tools and toolsets, asked anew at each turn)."""

    def __init__(self, specs: Iterable[PassthroughSpec], sources: Iterable[Any]) -> None:
        self.specs = list(specs)
        self.sources = list(sources)
        self._made: dict[str, PassthroughTool] = {}

    def __repr__(self) -> str:
        return f"PassthroughToolset({[s.name for s in self.specs]!r})"

    def find(self, name: str) -> Tool | None:
        """The tool called ``name`` among the sources now, or ``None``."""
        for source in self.sources:
            if _is_toolset(source):
                for t in source.tools():
                    if t.name == name:
                        return t
            elif getattr(source, "name", None) == name:
                return source
        return None

    def tools(self) -> list[Tool]:
        """A passthrough tool for each spec whose target is offered now."""
        out: list[Tool] = []
        for spec in self.specs:
            target = self.find(spec.tool)
            if target is None:
                continue
            made = self._made.get(spec.name)
            if made is None:
                made = self._made[spec.name] = PassthroughTool(spec, target, self.find)
            else:
                made.update(target)
            out.append(made)
        return out
