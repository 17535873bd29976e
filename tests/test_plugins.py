"""The plugin seam: entry points, restriction, tracing, clear errors."""

from __future__ import annotations

import inspect
import logging
import types

import pytest

from agentik.core import hookspecs
from agentik.core.errors import PluginError
from agentik.core.hookspecs import hookimpl
from agentik.core.llm.openai_backend import OpenAIBackend
from agentik.core.plugins import LazyFactory, load_plugins
from agentik.core.testing.scripted import ScriptedModel


def plugin(name, **hooks):
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, hookimpl(fn))
    return module


def test_builtin_backends_register_through_entry_points():
    registry = load_plugins(env={})
    assert {"openai", "scripted"} <= set(registry.llm_backends)
    assert registry.llm_backends["openai"] is OpenAIBackend
    builtins = {p.name: p for p in registry.plugins if p.builtin}
    # They came from the installed distribution's entry points, like any plugin.
    assert builtins["openai"].distribution == "agentik"
    assert builtins["openai"].version


def test_third_party_plugin_registers_backend_tool_and_transport():
    class EchoTool:
        name = "echo"
        description = "Echo."
        parameters = {"type": "object", "properties": {}}

        async def call(self, arguments, context):
            return "echo"

    def register_llm_backends(register):
        register("mine", ScriptedModel)

    def register_tools(register):
        register(EchoTool())

    def register_transports(register):
        register("pigeon", dict)

    registry = load_plugins(
        [
            plugin(
                "thirdparty",
                register_llm_backends=register_llm_backends,
                register_tools=register_tools,
                register_transports=register_transports,
            )
        ],
        env={"AGENTIK_PLUGINS": ""},  # only built-ins besides this one
    )
    assert isinstance(registry.create_backend("mine", model="x"), ScriptedModel)
    assert [t.name for t in registry.tools] == ["echo"]
    assert registry.transports["pigeon"] is dict


def test_duplicate_name_names_both_plugins():
    def register_llm_backends(register):
        register("openai", ScriptedModel)

    with pytest.raises(PluginError, match=r"'openai'.*'openai'.*'impostor'"):
        load_plugins([plugin("impostor", register_llm_backends=register_llm_backends)], env={})


def test_misspelt_hook_fails_loudly():
    def register_llm_backend(register):  # missing "s"
        pass

    with pytest.raises(PluginError, match="register_llm_backend"):
        load_plugins([plugin("typo", register_llm_backend=register_llm_backend)], env={})


def test_crashing_plugin_is_named():
    def register_tools(register):
        raise RuntimeError("kaboom")

    with pytest.raises(PluginError, match=r"'crashy'.*kaboom"):
        load_plugins([plugin("crashy", register_tools=register_tools)], env={})


def test_unknown_backend_lists_known_ones():
    registry = load_plugins(env={})
    with pytest.raises(PluginError, match=r"unknown LLM backend 'nope'.*openai"):
        registry.create_backend("nope")


def test_agentik_plugins_env_restricts_third_party_only(monkeypatch):
    registry = load_plugins(env={"AGENTIK_PLUGINS": ""})
    # Built-ins always load; no third-party entry point does.
    assert all(p.builtin for p in registry.plugins)
    assert "openai" in registry.llm_backends


def test_trace_switch_logs_hook_calls(caplog):
    caplog.set_level(logging.DEBUG, logger="agentik.hooks")
    registry = load_plugins(env={"AGENTIK_TRACE_HOOKS": "1"})
    registry.pm.hook.register_tools(register=lambda t: None)
    assert "register_tools" in caplog.text


def test_every_hook_is_documented_and_typed():
    specs = [
        getattr(hookspecs, n)
        for n in dir(hookspecs)
        if n.startswith("register_") or hasattr(getattr(hookspecs, n), "agentik_spec")
    ]
    assert specs
    for fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert len(doc) > 80, f"hook {fn.__name__} needs a docstring that states its contract"
        assert "return" in doc.lower(), f"hook {fn.__name__} must say what its result means"
        sig = inspect.signature(fn)
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())


def test_the_irc_slack_and_http_transports_are_registered_by_name_and_load_when_used():
    """They are :class:`LazyFactory` objects: calling one, or reading an attribute
    (``settings_model``), imports the transport's module (docs/plugins.md)."""
    from agentik.transports.http.transport import HttpTransport
    from agentik.transports.irc.transport import IRCTransport
    from agentik.transports.slack.transport import SlackTransport

    registry = load_plugins(env={"AGENTIK_PLUGINS": ""})
    for name, cls in (("irc", IRCTransport), ("slack", SlackTransport), ("http", HttpTransport)):
        factory = registry.transports[name]
        assert isinstance(factory, LazyFactory)
        assert factory.load() is cls
        assert factory.settings_model is cls.settings_model
    with pytest.raises(ValueError, match=r"package\.module:Name"):
        LazyFactory("agentik.transports.irc.transport")
