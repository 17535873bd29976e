"""The shipped Slack app manifest (``slack-app-manifest.yaml``) enables exactly what
the Slack transport uses: the scopes of the Web API methods it calls and of the events
it subscribes to, those events, and interactivity for the approval buttons.

The transport's source is read (its ``self.client.<method>(`` calls, its
``self.app.event(...)`` and ``self.app.action(...)`` registrations, the assistant
middleware): a new call or event without its scope in the manifest fails here, and
so does a scope the manifest asks for that nothing uses.  Scopes are Slack's, from
api.slack.com/methods and api.slack.com/events.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import yaml

from agentik.transports.slack.transport import SlackTransport

ROOT = Path(__file__).resolve().parent.parent
TRANSPORT = ROOT / "transports" / "slack" / "transport.py"

#: Web API method (slack-sdk's name) -> the bot scope it needs ("" none).
METHOD_SCOPES = {
    "auth_test": "",
    # apps.connections.open takes the app-level token (xapp-, its own
    # connections:write scope, given when the token is made), not a bot scope.
    "apps_connections_open": "",
    "chat_postMessage": "chat:write",
    "chat_update": "chat:write",
    "chat_delete": "chat:write",  # a linked channel's copy of a deleted message
    # A post whose reply was lost (a handover), a relayed copy, a thread's first
    # message: looked up in the channel's history (the *:history scopes, one per kind
    # of conversation; channels:history stands for them here).
    "conversations_history": "channels:history",
    "conversations_replies": "channels:history",
    "chat_stream": "chat:write",  # chat.startStream / appendStream / stopStream
    "users_info": "users:read",
    "assistant_threads_setStatus": "assistant:write",
    "assistant_threads_setTitle": "assistant:write",
    "assistant_threads_setSuggestedPrompts": "assistant:write",
}
#: An ``app.event(...)`` name -> the manifest's bot events it stands for.
EVENT_SUBSCRIPTIONS = {
    "app_mention": ["app_mention"],
    "message": ["message.channels", "message.groups", "message.im", "message.mpim"],
    "reaction_added": ["reaction_added"],
}
#: Bot event -> the scope Slack requires to subscribe to it.
EVENT_SCOPES = {
    "app_mention": "app_mentions:read",
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.im": "im:history",
    "message.mpim": "mpim:history",
    "reaction_added": "reactions:read",
    "assistant_thread_started": "assistant:write",
    "assistant_thread_context_changed": "assistant:write",
}
#: Bolt's AsyncAssistant middleware: the events it listens to and what its
#: ``say`` / ``set_suggested_prompts`` / ``set_status`` utilities call.
ASSISTANT_EVENTS = ["assistant_thread_started", "assistant_thread_context_changed"]
ASSISTANT_METHODS = ["chat_postMessage", "assistant_threads_setSuggestedPrompts"]


def _uses() -> tuple[set[str], set[str], bool]:
    """Methods called, events subscribed to, and whether block actions are handled."""
    tree = ast.parse(TRANSPORT.read_text(encoding="utf-8"))
    methods: set[str] = set()
    events: set[str] = set()
    actions = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else None
        if owner_name == "client":
            methods.add(node.func.attr)
        elif owner_name == "app" and node.func.attr == "event":
            (name,) = [a.value for a in node.args if isinstance(a, ast.Constant)]
            events.update(EVENT_SUBSCRIPTIONS[name])
        elif owner_name == "app" and node.func.attr == "action":
            actions = True
        elif owner_name == "app" and node.func.attr == "assistant":
            events.update(ASSISTANT_EVENTS)
            methods.update(ASSISTANT_METHODS)
    return methods, events, actions


def _manifest() -> dict:
    return yaml.safe_load((ROOT / "slack-app-manifest.yaml").read_text(encoding="utf-8"))


def test_the_scan_finds_what_the_transport_is_known_to_use():
    methods, events, actions = _uses()
    assert {"chat_postMessage", "chat_update", "users_info", "chat_stream"} <= methods
    assert {"app_mention", "message.im", "reaction_added", "assistant_thread_started"} <= events
    assert actions  # the approval buttons


def test_the_manifest_asks_for_exactly_the_scopes_the_transport_needs():
    methods, events, _ = _uses()
    unknown = sorted(m for m in methods if m not in METHOD_SCOPES)
    assert not unknown, f"new Slack methods {unknown}: add their scopes here and to the manifest"
    needed = {METHOD_SCOPES[m] for m in methods} | {EVENT_SCOPES[e] for e in events}
    needed.discard("")
    # Not a Web API method: the files of file shares, fetched from their url_private.
    assert "_download" in SlackTransport.__dict__
    needed.add("files:read")
    # Not a method either: relayed copies (linked channels) are posted under the
    # person's name (chat.postMessage's ``username``), which Slack only honours with
    # chat:write.customize (without it the copy would show the app's name, no author).
    assert "username=author" in inspect.getsource(SlackTransport._relay)
    needed.add("chat:write.customize")
    scopes = set(_manifest()["oauth_config"]["scopes"]["bot"])
    assert needed - scopes == set(), "the manifest lacks these scopes"
    assert scopes - needed == set(), "the manifest asks for scopes nothing uses"


def test_the_manifest_subscribes_to_exactly_the_events_the_transport_handles():
    _, events, _ = _uses()
    subscribed = set(_manifest()["settings"]["event_subscriptions"]["bot_events"])
    assert subscribed == events


def test_interactivity_is_on_for_the_approval_buttons_and_socket_mode_is_the_default():
    _, _, actions = _uses()
    settings = _manifest()["settings"]
    assert actions
    assert settings["interactivity"]["is_enabled"] is True
    assert settings["socket_mode_enabled"] is True
    # Socket Mode delivers button clicks over the socket: no request URL to set.
    assert "request_url" not in settings["interactivity"]
