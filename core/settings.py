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
* :func:`empty_list` — the default factory of a list field (not ``list``);
* :func:`setting_fields` — the fields of a settings class, by key;
* :func:`validate_settings` — validate a mapping, errors naming the key;
* :func:`overlay` — make a class that overlays others (every key optional,
  ``None``: unset) from the fields it inherits, without declaring them again.

A setting that a narrower scope may override (a channel over its transport,
a named agent over the turn limits) is declared once, in a small "knobs"
class: a pydantic dataclass without slots (so that several can be combined),
spelled out like :class:`~agentik.bot.channel.ChannelKnobs` so that type
checkers see its constructor.  The full settings class inherits it (the
defaults apply), and so does the overlay, which :func:`overlay` turns into
"unset unless given": same type and limits, default ``None``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar, Union, cast, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass
from pydantic.dataclasses import rebuild_dataclass
from pydantic.fields import FieldInfo

from .errors import ConfigError

__all__ = [
    "OVERLAY_SETTINGS",
    "SETTINGS",
    "Blank",
    "BlankInt",
    "BlankSecret",
    "FilePath",
    "PathSetting",
    "config_key",
    "defaults",
    "describe_error",
    "did_you_mean",
    "empty_list",
    "is_file_path",
    "knobs_dataclass",
    "known_keys",
    "model_with_knobs",
    "overlay",
    "plain_values",
    "setting_fields",
    "settings_dataclass",
    "validate_settings",
]

#: The pydantic configuration of settings classes.
SETTINGS = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)
#: :data:`SETTINGS` for a class that :func:`overlay` completes: its schema is built
#: once, by ``overlay``, not also when the class is made (start-up, issue 31).
OVERLAY_SETTINGS = SETTINGS | ConfigDict(defer_build=True)

_T = TypeVar("_T")


def empty_list() -> list[Any]:
    """A new empty list: the ``default_factory`` of a pydantic field that holds a list.

    Not ``list`` itself.  Pydantic reads a factory's signature when it builds the
    class, and :func:`inspect.signature` of ``list`` (a builtin with a text signature)
    leaves a reference cycle behind that holds a copy of ``sys.modules``, about 50 KB
    in a bot.  The bot imports and builds with the cyclic collector paused and then
    freezes what exists (:mod:`agentik.bot.gcpause`), so each such field kept its copy
    for the life of the process: 13 in a started bot, 0.6 MB (issue 31).
    """
    return []


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


def knobs_dataclass(cls: type[_T]) -> type[_T]:
    """:func:`settings_dataclass` without slots: a knobs class (see the module's doc)
    whose subclass is not a dataclass to type checkers either.

    Spell the decorator out instead (``@dataclass(frozen=True, kw_only=True,
    config=SETTINGS)``) where the classes using the knobs are spelled out too.
    """
    decorate = cast(
        "Callable[[type[_T]], type[_T]]",
        _pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS),
    )
    return decorate(cls)


def _blank_is_none(value: Any) -> Any:
    return None if value == "" else value


#: A string setting where ``""`` means unset (``${VAR:-}`` in a file gives ``""``).
Blank = Annotated[str | None, BeforeValidator(_blank_is_none)]
#: A secret where ``""`` means unset.
BlankSecret = Annotated[SecretStr | None, BeforeValidator(_blank_is_none)]
#: A whole number where ``""`` means unset.
BlankInt = Annotated[int | None, BeforeValidator(_blank_is_none)]


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


def overlay(
    cls: type[_T],
    *,
    keys: Iterable[str] | None = None,
    docs: Mapping[str, str] | None = None,
) -> type[_T]:
    """Make the settings dataclass ``cls`` an overlay of the classes it inherits.

    Each inherited field named in ``keys`` (default: every inherited field)
    becomes optional: its type and limits stay those of the class that
    declares it, its default is ``None`` (unset: what is overlaid keeps its
    value).  ``cls`` declares none of them again, so a type, a limit or a
    default lives in one place.  ``docs``: a description per key (the
    overlay's own wording: the configuration reference and ``!set``'s help
    show it).  The fields come in pydantic's order: the bases' (last base
    first), then ``cls``'s own.

    ``cls`` must be a pydantic dataclass (``@dataclass(frozen=True, kw_only=True,
    slots=True, config=OVERLAY_SETTINGS)``: with :data:`SETTINGS` its schema would be
    built twice); it is changed in place and returned.
    """
    docs = docs or {}
    own = set(getattr(cls, "__annotations__", {}))
    fields: dict[str, dataclasses.Field[Any]] = getattr(cls, "__dataclass_fields__")  # noqa: B009
    infos = setting_fields(cls)
    chosen = set(fields) - own if keys is None else set(keys)
    for name in chosen | set(docs):
        info = infos[name]
        annotation = info.rebuild_annotation()
        if name in chosen:
            annotation = annotation | None
        attributes: dict[str, Any] = {"default": None if name in chosen else info.default}
        if info.default_factory is not None and name not in chosen:
            attributes = {"default_factory": info.default_factory}
        if name in docs:
            attributes["description"] = docs[name]
        elif info.description:
            attributes["description"] = info.description
        field = copy.copy(fields[name])
        field.type = annotation
        field.default = Field(**attributes)
        field.default_factory = dataclasses.MISSING
        fields[name] = field
    rebuild_dataclass(cast("Any", cls), force=True)
    return cls


_M = TypeVar("_M", bound=BaseModel)


def model_with_knobs(model: type[_M], *sources: type, order: Sequence[str] = ()) -> type[_M]:
    """Give the pydantic model ``model`` the fields of the knobs dataclasses among
    its bases as they are declared.

    A model can inherit a pydantic dataclass's fields (one declaration for both),
    but pydantic copies them without the limits written in their annotations
    (``Annotated[int, Field(ge=1)]``); this puts the declared fields in place
    and rebuilds the model.  ``sources``: settings dataclasses to take the
    fields from, first found first (default: the dataclass bases); ``order``:
    the order of the fields (the rest follow).
    """
    fields = model.__pydantic_fields__
    if not sources:
        sources = tuple(
            base
            for base in model.__mro__[1:]
            if dataclasses.is_dataclass(base) and not issubclass(base, BaseModel)
        )
    own = getattr(model, "__annotations__", {})
    for name in [n for n in fields if n not in own]:
        info = next((setting_fields(s)[name] for s in sources if name in setting_fields(s)), None)
        if info is not None:
            field = copy.copy(info)
            field.init = field.kw_only = None  # dataclass-only attributes
            fields[name] = field
    ranked = {k: i for i, k in enumerate(order)}
    reordered = sorted(fields, key=lambda k: ranked.get(k, len(ranked)))
    model.__pydantic_fields__ = {k: fields[k] for k in reordered}
    model.model_rebuild(force=True)
    return model


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
    import difflib  # only a configuration with a mistake needs it (start-up: issue 31)

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
