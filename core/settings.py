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

import difflib
import os
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar, Union, cast, get_args, get_origin

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
    "did_you_mean",
    "is_file_path",
    "known_keys",
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


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'channels'?)`` when a candidate is close to ``word``, else ``""``."""
    close = difflib.get_close_matches(str(word), sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unwrap(annotation: Any, step: Any) -> Any:
    """The type one ``loc`` step into ``annotation`` leads to (None: unknown)."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            # Optional[X] and the like: the first member that has keys to offer.
            members = [a for a in get_args(annotation) if a is not type(None)]
            for member in members:
                found = _unwrap(member, step)
                if found is not None:
                    return found
            return None
        else:
            break
    if isinstance(annotation, type) and setting_fields(annotation):
        field = setting_fields(annotation).get(str(step))
        return field.annotation if field is not None else None
    origin = get_origin(annotation)
    if origin in (dict, Mapping):
        return get_args(annotation)[1] if len(get_args(annotation)) == 2 else None
    if origin in (list, tuple, Sequence):
        return get_args(annotation)[0] if get_args(annotation) else None
    return None


def known_keys(cls: Any, loc: Sequence[Any] = ()) -> list[str]:
    """The keys a settings class accepts at ``loc`` (a pydantic error's path, minus the key).

    ``known_keys(Config, ("transports", "libera"))`` walks through fields,
    dict values, list items and ``X | None``; an empty list when the path leads
    nowhere known.
    """
    annotation: Any = cls
    for step in loc:
        annotation = _unwrap(annotation, step)
        if annotation is None:
            return []
    while get_origin(annotation) is Annotated or get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        annotation = members[0] if members else None
    if isinstance(annotation, type):
        return [config_key(name, f) for name, f in setting_fields(annotation).items()]
    return []


def describe_error(
    error: Mapping[str, Any], *, show_input: bool = True, known: Iterable[str] = ()
) -> str:
    """One pydantic error as a short phrase (``unknown key``, the message, the value).

    ``known``: the keys valid where an unknown key was found, for a "did you mean".
    """
    kind = error["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        loc = error.get("loc") or ()
        return "unknown key" + (did_you_mean(str(loc[-1]), known) if loc else "")
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
        known = known_keys(cls, err["loc"][:-1])
        raise ConfigError(
            f"{key}: {describe_error(err, show_input=not secret, known=known)}"
        ) from None


def defaults(cls: type[_T]) -> _T:
    """An instance with every default (for constructor signatures: one declaration)."""
    return cls()
