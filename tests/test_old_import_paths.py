"""The channel contract moved from ``agentik.core`` to ``agentik.transports`` (issue 16).

Plugins written against the old paths keep working for at least one release:
every old public name still imports, is the very same object as the new one,
and warns with a ``DeprecationWarning`` that names the new module and points
at the plugin's own line.  Our own code uses the new paths only, and core
still loads no transport code.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings

import pytest

from agentik.core.plugins import load_plugins

#: Every public name the old modules had (their ``__all__`` and documented aliases).
OLD_NAMES = {
    "agentik.core.transport": (
        "agentik.transports.base",
        [
            "ChannelCaps",
            "DeliveryCallback",
            "IncomingMessage",
            "MessageSink",
            "OutgoingKind",
            "OutgoingMessage",
            "Transport",
            "parse_settings",
            "StreamMode",
            "Formatting",
        ],
    ),
    "agentik.core.text": (
        "agentik.transports.text",
        ["fit_prefix", "split_lines", "split_text"],
    ),
    "agentik.core.testing.transport": (
        "agentik.transports.testing.memory",
        ["MemoryTransport"],
    ),
}

CASES = [(old, new, name) for old, (new, names) in OLD_NAMES.items() for name in names]


@pytest.mark.parametrize(("old", "new", "name"), CASES, ids=[f"{o}.{n}" for o, _, n in CASES])
def test_every_old_name_imports_the_same_object_with_a_warning(old, new, name):
    namespace: dict = {}
    with pytest.warns(DeprecationWarning) as caught:
        exec(compile(f"from {old} import {name}", __file__, "exec"), namespace)
    assert namespace[name] is getattr(importlib.import_module(new), name)
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    # It says what to do instead, and points at the line that used the old name.
    assert f"{old} is deprecated" in str(warning.message)
    assert f"import {name} from {new}" in str(warning.message)
    assert warning.filename == __file__


def test_attribute_access_on_an_old_module_warns_too():
    import agentik.core.transport as old
    from agentik.transports.base import Transport

    with pytest.warns(DeprecationWarning, match=re.escape("agentik.transports.base")):
        assert old.Transport is Transport


def test_star_import_of_an_old_module_brings_every_old_name():
    namespace: dict = {}
    with pytest.warns(DeprecationWarning):
        exec("from agentik.core.transport import *", namespace)
    import agentik.transports.base as new

    names = set(OLD_NAMES["agentik.core.transport"][1]) - {"StreamMode", "Formatting"}
    assert names <= set(namespace)
    assert all(namespace[n] is getattr(new, n) for n in names)
    assert sorted(dir(importlib.import_module("agentik.core.transport"))) == sorted(names)


def test_an_unknown_name_of_an_old_module_is_an_import_error_naming_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ImportError, match="nonesuch"):
            exec("from agentik.core.text import nonesuch", {})
        with pytest.raises(AttributeError, match=re.escape("agentik.core.text")):
            _ = importlib.import_module("agentik.core.text").nonesuch


def test_an_old_subclass_is_a_transport_of_the_new_contract():
    """A plugin's transport built on the old base class is what the bot expects."""
    with pytest.warns(DeprecationWarning):
        from agentik.core.testing.transport import MemoryTransport as OldMemory
        from agentik.core.transport import ChannelCaps as OldCaps
        from agentik.core.transport import Transport as OldTransport

    from agentik.transports.base import ChannelCaps, Transport
    from agentik.transports.testing import MemoryTransport

    class Plugin(OldTransport):
        type = "plugin"
        caps = OldCaps(max_chars=100)

        async def start(self, sink):
            pass

        async def send(self, message):
            pass

    assert issubclass(Plugin, Transport) and isinstance(Plugin.caps, ChannelCaps)
    assert OldMemory is MemoryTransport


def test_the_new_paths_and_the_memory_plugin_raise_no_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from agentik.core.testing import openai_server, scripted  # still in core
        from agentik.transports.base import AgentAccess, restrict_tools  # noqa: F401
        from agentik.transports.testing import MemoryTransport
        from agentik.transports.text import split_text  # noqa: F401

        registry = load_plugins(env={})
    assert registry.transports["memory"] is MemoryTransport
    assert scripted.ScriptedModel and openai_server.FakeOpenAIServer


def test_importing_all_of_core_loads_no_transport_or_bot_code():
    """The aliases name the new modules only as strings, resolved on use."""
    script = """
import importlib, pkgutil, sys
import agentik.core
failed = []
for info in pkgutil.walk_packages(agentik.core.__path__, "agentik.core."):
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an optional extra that is not installed
        failed.append(f"{info.name}: {exc}")
loaded = sorted(m for m in sys.modules if m.startswith(("agentik.transports", "agentik.bot")))
print(loaded, failed)
assert "agentik.core.transport" in sys.modules and "agentik.core.text" in sys.modules
assert not loaded, loaded
"""
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
