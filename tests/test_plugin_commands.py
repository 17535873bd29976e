"""Chat commands from plugins (issue 30): a plugin adds a command through the
``register_commands`` hook exactly as the built-ins are added; ``!help`` lists
it; its role requirement and the access rules apply to it as to a built-in.

The plugin is the example distribution ``examples/agentik-webhook`` (its
``!webhook`` is for admins), run through a real IRC server.
"""

from __future__ import annotations

import pytest

from agentik.bot.bridge import COMMANDS, ChannelOptions
from agentik.bot.commands import Command, CommandContext, builtin_commands, load_commands
from agentik.core.access import AccessPolicy, AccessRule, AccessSettings
from agentik.core.errors import PluginError
from agentik.core.hooks import Hooks
from agentik.core.hookspecs import hookimpl
from agentik.transports.irc.wire import casefold

from ircservers import IRCTestClient
from rigs import irc_bot, joined, said_by_bot

webhook_plugin = pytest.importorskip("agentik_webhook.plugin")

pytest_plugins = ["ircservers"]


def irc_admins(*masks: str, rules: tuple[AccessRule, ...] = ()) -> AccessPolicy:
    return AccessPolicy(
        AccessSettings(admins=masks, rules=list(rules)), {"testnet": "irc"}, irc_casefold=casefold
    )


async def test_a_plugin_command_is_listed_and_needs_its_role(miniircd, tmp_path):
    access = irc_admins("testnet:mask:dave!*@*")
    async with irc_bot(miniircd.port, tmp_path, bridge_kw={"access": access},
                       agent_kw={"hooks": [webhook_plugin]}, unverified_identity="hostmask",
                       channels=["#ops"]) as (bot, _, _, bridge):  # fmt: skip
        assert "webhook" in bridge.commands and "webhook" not in COMMANDS
        await joined(bot, "#ops")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        dave = await IRCTestClient.connect(miniircd.port, "dave")
        for c in (alice, dave):
            await c.join("#ops")
        # The short help of a shared room: an admin's command is listed to admins only.
        alice.privmsg("#ops", "!help")
        line = await alice.wait_for(lambda m: said_by_bot(m) and m.text.startswith("commands:"))
        assert "!new" in line.text and "!webhook" not in line.text
        dave.privmsg("#ops", "!help")
        # (dave saw alice's list first: his own is the one with the admins' commands.)
        line = await dave.wait_for(lambda m: said_by_bot(m) and "!role " in m.text)
        assert line.text.startswith("commands: !new") and "!webhook" in line.text
        # !help <command> says what it does, as for a built-in.
        alice.privmsg("#ops", "!help webhook")
        line = await alice.wait_for(lambda m: said_by_bot(m) and m.text.startswith("!webhook"))
        assert line.text == f"!webhook — {webhook_plugin.webhook_command.help}"
        # A user is refused; an admin runs it.
        alice.privmsg("#ops", "!webhook")
        refused = await alice.wait_for(
            lambda m: said_by_bot(m) and m.text.startswith("!webhook is")
        )
        assert refused.text == "!webhook is for admins"
        dave.privmsg("#ops", "!webhook 120")
        ran = await dave.wait_for(lambda m: said_by_bot(m) and m.text.startswith("agentik-webhook"))
        assert "here through testnet (irc)" in ran.text and ran.text.endswith("+02:00")
        # In private, the full help lists every command with what it does, the plugin's too.
        alice.privmsg("agentik", "!help")
        # (Split to the line length: its pieces, up to the last command, the plugin's.)
        pieces = []
        while not pieces or "!webhook" not in pieces[-1]:
            line = await alice.wait_for(lambda m: said_by_bot(m) and m.target == "alice")
            pieces.append(line.text)
        full = " ".join(pieces)
        assert full.startswith("commands: !new — start a fresh conversation")
        assert "!redact — " in full and "!webhook — show the webhook plugin's" in full
        for c in (alice, dave):
            await c.close()


class Greeter:
    """A plugin with a command for everyone, which an access rule can still forbid."""

    @hookimpl
    def register_commands(self, register):
        async def hello(ctx: CommandContext) -> None:
            await ctx.say(f"hello {ctx.message.author_name} ({ctx.decision.role})")

        register(Command(name="hello", help="say hello", handler=hello))


async def test_access_rules_apply_to_a_plugin_command(miniircd, tmp_path):
    rules = (AccessRule(channels=("irc:testnet:#quiet",), commands=("*", "-hello")),)
    access = irc_admins(rules=rules)
    async with irc_bot(miniircd.port, tmp_path, bridge_kw={"access": access},
                       agent_kw={"hooks": [Greeter()]}, unverified_identity="hostmask",
                       channels=["#open", "#quiet"]) as (bot, _, _, _):  # fmt: skip
        await joined(bot, "#open")
        await joined(bot, "#quiet")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#open")
        await alice.join("#quiet")
        alice.privmsg("#open", "!hello")
        line = await alice.wait_for(lambda m: said_by_bot(m) and m.target == "#open")
        assert line.text == "hello alice (user)"
        alice.privmsg("#quiet", "!hello")
        line = await alice.wait_for(lambda m: said_by_bot(m) and m.target == "#quiet")
        assert line.text == "!hello is not for users here"
        await alice.close()


class Clash:
    @hookimpl
    def register_commands(self, register):
        register(Command(name="new", help="mine", handler=Greeter.register_commands))


def test_a_command_name_taken_twice_names_both_plugins():
    with pytest.raises(PluginError, match="'new' is registered by both 'agentik' and 'Clash'"):
        load_commands(Hooks.of([Clash()]).pm)


def test_the_builtin_commands_register_through_the_hook_in_help_order():
    registry = builtin_commands()
    assert list(registry.help()) == list(COMMANDS)
    assert [c.name for c in registry if c.needs_role == "admin"] == [
        "role", "ignore", "unignore", "roles", "link", "unlink", "links",
    ]  # fmt: skip


def test_names_moved_out_of_the_bridge_still_import_with_a_warning():
    import agentik.bot.bridge as bridge

    with pytest.warns(DeprecationWarning, match="import it from agentik.core.agents"):
        assert bridge.AGENT_TOOL_PREFIX == "agent__"
    # Still the bridge's own: the channel options and the built-in commands' help.
    assert bridge.ChannelOptions is ChannelOptions and COMMANDS["new"].startswith("start a fresh")
