"""A real MCP server (the SDK's ``MCPServer``) for the MCP tool tests.

Run as ``python tests/mcp_server.py --transport stdio`` or
``python tests/mcp_server.py --transport http --port N`` (streamable HTTP on
127.0.0.1, endpoint ``/mcp``).
"""

from __future__ import annotations

import argparse
import base64
import os

import anyio
import mcp_types as mt
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("agentik-test", log_level="WARNING")


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Always fails.")
def fail() -> str:
    raise ToolError("this tool always fails")


@server.tool(description="Sleep for a while, then answer.")
async def slow(seconds: float, started: str = "") -> str:
    if started:  # a file the test waits for: the call is in flight
        await anyio.Path(started).write_text("started")
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description="Kill the server process during the call.")
def crash() -> str:
    os._exit(1)


@server.tool(description="Return a small PNG image.")
def image() -> Image:
    return Image(data=PNG, format="png")


@server.tool(description="Return an embedded text resource.")
def resource() -> mt.EmbeddedResource:
    return mt.EmbeddedResource(
        type="resource",
        resource=mt.TextResourceContents(uri="file:///x", mime_type="text/plain", text="hello"),
    )


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="A tool that must never be offered.")
def secret_tool() -> str:
    return "the secret"


@server.tool(description="Register a new tool at run time and announce it.")
async def add_tool(name: str, ctx: Context) -> str:
    def made() -> str:
        return f"I am {name}"

    server.add_tool(made, name=name, description=f"Runtime tool {name}")
    # 2025 handshake sessions get notifications/tools/list_changed; 2026 ones
    # listen through subscriptions.
    session = ctx.request_context.session
    send = getattr(session, "send_tool_list_changed", None)
    if send is not None:
        await send()
    await ctx.notify_tools_changed()
    return f"added {name}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
