"""agentik.core.client — drive another agentik over its HTTP+SSE API.

:class:`RemoteAgent` and :class:`RemoteConversation` have the library's
:class:`~agentik.core.agent.Agent` / :class:`~agentik.core.conversation.Conversation`
shape (create, get, list and delete conversations; ``send``, ``interrupt``,
live events with replay from a sequence number, history pages), so code
written against the library runs unchanged against a bot started with
``agentik run`` elsewhere::

    from agentik.core.client import RemoteAgent

    async with RemoteAgent("http://127.0.0.1:8080", token=os.environ["BOT_TOKEN"]) as agent:
        conv = await agent.create_conversation(title="from afar")
        events = conv.events(profile="chat")
        await conv.send("hello")
        async for event in events:
            ...

:class:`RemoteAgentTool` makes such an agent the tool ``agent__<name>`` of a
local one (``[agents.<name>] url = "…"``; :mod:`agentik.core.agents`).
"""

from .remote import RemoteAgent, RemoteConversation, RemoteSubscription
from .tool import RemoteAgentTool

__all__ = ["RemoteAgent", "RemoteAgentTool", "RemoteConversation", "RemoteSubscription"]
