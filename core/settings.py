"""Settings: each declared once, where it is used, and validated by pydantic.

A part of the agent that can be configured declares its settings as one
class: a pydantic dataclass for the core's policies (:class:`TurnPolicy`,
:class:`CompactionPolicy`, :class:`~agentik.core.memory.MemorySettings`,
:class:`~agentik.core.agent.AgentSettings`), a pydantic model for an LLM
backend (its class's ``settings_model``) or a transport.  The configuration
file validates against those very classes (``agentik.bot.config``), so a
default or a limit is written in one place only.

Helpers for such classes:

* :data:`SETTINGS` — the pydantic configuration every settings class uses
  (unknown keys are errors; a field with an alias also accepts its name);
* :func:`settings_dataclass` — the decorator for core policies;
* :data:`Blank` — ``str | None`` where an empty string means "unset";
* :class:`FilePath` — marks a field as a file or folder path, resolved
  against the configuration file's folder (``~`` expanded) by the builder;
* :func:`setting_fields` — the fields of a settings class, by key;
* :func:`validate_settings` — validate a mapping, errors naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass
from pydantic.fields import FieldInfo

from .errors import ConfigError

__all__ = [
    "SETTINGS",
    "Blank",
    "BlankSecret",
    "FilePath",
    "PathSetting",
    "config_key",
    "defaults",
    "describe_error",
    "is_file_path",
    "plain_values",
    "setting_fields",
    "settings_dataclass",
    "validate_settings",
]

#: The pydantic configuration of settings classes.
SETTINGS = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)

_T = TypeVar("_T")


def settings_dataclass(cls: type[_T]) -> type[_T]:
    """A frozen, keyword-only dataclass whose fields pydantic validates.

    It is still a dataclass (``dataclasses.replace`` works and validates), and
    a configuration section can be the class itself.
    """
    decorate = cast(
        "Callable[[type[_T]], type[_T]]",
        _pydantic_dataclass(frozen=True, kw_only=True, slots=True, config=SETTINGS),
    )
    return decorate(cls)


def _blank_is_none(value: Any) -> Any:
    return None if value == "" else value


#: A string setting where ``""`` means unset (``${VAR:-}`` in a file gives ``""``).
Blank = Annotated[str | None, BeforeValidator(_blank_is_none)]
#: A secret where ``""`` means unset.
BlankSecret = Annotated[SecretStr | None, BeforeValidator(_blank_is_none)]


class FilePath:
    """Field metadata: the value is a path, relative to the configuration file.

    ``model_path: Annotated[Blank, FilePath()] = None``.  Library callers give
    paths as they are; the builder resolves configured ones.
    """

    def __repr__(self) -> str:
        return "FilePath()"


def _path_or_str(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else _blank_is_none(value)


#: A path setting (``str`` or ``os.PathLike``; ``""`` is unset), relative to the file.
PathSetting = Annotated[str | None, BeforeValidator(_path_or_str), FilePath()]


def setting_fields(cls: Any) -> dict[str, FieldInfo]:
    """The settable fields of a settings model or pydantic dataclass, by name."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return dict(cls.model_fields)
    fields: dict[str, FieldInfo] = getattr(cls, "__pydantic_fields__", {})
    return {name: f for name, f in fields.items() if f.init is not False}


def config_key(name: str, field: FieldInfo) -> str:
    """The key a configuration file writes for a field (its alias, if it has one)."""
    alias = field.validation_alias
    return alias if isinstance(alias, str) else name


def is_file_path(field: FieldInfo) -> bool:
    """Whether ``field`` holds a path relative to the configuration file."""
    return any(isinstance(m, FilePath) for m in field.metadata) or any(
        isinstance(m, FilePath) for m in getattr(field.annotation, "__metadata__", ())
    )


def plain_values(settings: Any) -> dict[str, Any]:
    """Keyword arguments from a validated settings object: secrets revealed."""
    out: dict[str, Any] = {}
    for name in setting_fields(type(settings)):
        value = getattr(settings, name)
        out[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
    return out


def describe_error(error: Mapping[str, Any], *, show_input: bool = True) -> str:
    """One pydantic error as a short phrase (``unknown key``, the message, the value)."""
    kind = error["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = str(error["msg"])
    if show_input and "input" in error:
        shown = error["input"]
        if isinstance(shown, str | int | float | bool):
            return f"{msg}, got {shown!r}"
    return msg


def validate_settings(cls: type[_T], data: Mapping[str, Any], *, where: str) -> _T:
    """Validate ``data`` into ``cls``; an error is one ConfigError line naming the key.

    ``where`` prefixes the key (``llm`` gives ``llm.n_ctx: ...``).  Values of
    secret fields are never quoted.
    """
    from pydantic import TypeAdapter

    try:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls.model_validate(dict(data))
        return TypeAdapter(cls).validate_python(dict(data))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        field = setting_fields(cls).get(str(err["loc"][0])) if err["loc"] else None
        secret = field is not None and "Secret" in str(field.annotation)
        key = f"{where}.{loc}" if loc else where
        raise ConfigError(f"{key}: {describe_error(err, show_input=not secret)}") from None


def defaults(cls: type[_T]) -> _T:
    """An instance with every default (for constructor signatures: one declaration)."""
    return cls()
