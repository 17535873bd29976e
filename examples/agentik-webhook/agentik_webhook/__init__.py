"""agentik-webhook: a webhook transport and an example tool, as a separate plugin.

* :class:`~.transport.WebhookTransport` (``type = "webhook"``): a JSON
  ``POST`` to ``http://host:port/path`` is a message to the bot; its answers
  are ``POST``\\ ed as JSON to ``callback_url``, both ways signed with HMAC-SHA256
  when a ``secret`` is set (:func:`~.signing.sign`, :func:`~.signing.verify`).
* :data:`~.tools.webhook_time`: a tool the model can call.
* :data:`~.commands.webhook_command`: a chat command, ``!webhook`` (admins).
* :mod:`.plugin`: the hook implementations, advertised in the ``agentik``
  entry-point group of this distribution's ``pyproject.toml``.
"""

from typing import TYPE_CHECKING, Any

from .commands import webhook_command
from .signing import sign, verify
from .tools import webhook_time

if TYPE_CHECKING:
    from .transport import WebhookSettings, WebhookTransport


def __getattr__(name: str) -> Any:
    """The transport's names, imported on first use: agentik loads every installed
    plugin at start (this package comes with :mod:`.plugin`), and a bot without a
    ``webhook`` table need not hold the transport's module."""
    if name in ("WebhookSettings", "WebhookTransport"):
        from . import transport

        return getattr(transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "WebhookSettings",
    "WebhookTransport",
    "sign",
    "verify",
    "webhook_command",
    "webhook_time",
]
