"""Compatibility aliases of modules that moved out of ``agentik.core`` (deprecated).

The channel contract (``agentik.core.transport``, ``agentik.core.text``,
``agentik.core.testing.transport``) moved next to the transports, which are
what uses it.  The old modules stay for at least one release as aliases: each
name still resolves to the very same object, and using one warns with a
:class:`DeprecationWarning` that names the new path.

This is the one place core names ``agentik.transports``, and only as a string
resolved when a deprecated name is used: importing ``agentik.core`` (or any of
its modules) loads no transport code.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["moved_attribute"]


def moved_attribute(old: str, new: str, name: str) -> Any:
    """``name`` of module ``new``, asked for through the deprecated module ``old``.

    For the old module's ``__getattr__``: warns, pointing at the line that
    used the old name (the caller of that ``__getattr__``).
    """
    if name.startswith("__"):
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(new), name)
    except AttributeError:
        raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
    warnings.warn(
        f"{old} is deprecated and will be removed: import {name} from {new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return value
