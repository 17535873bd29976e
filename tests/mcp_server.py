"""A real MCP server (the SDK's ``MCPServer``) for the MCP tool tests.

Run as ``python tests/mcp_server.py --transport stdio`` or
``python tests/mcp_server.py --transport http --port N`` (streamable HTTP on
127.0.0.1, endpoint ``/mcp``).  ``--banner N`` first prints N lines that are not
JSON-RPC on stdout, as some servers do; ``--progress`` adds the ``build`` tool,
which reports progress (``notifications/progress``) before it answers;
``--big`` adds ``big``, which answers with a text of the size asked for.
Hostile servers: ``--many N`` adds N tools, ``--huge-description N`` one tool
described in N characters, ``--long-names`` two tools named far over 64
characters; ``--hang`` never answers anything (``initialize`` hangs).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys

import anyio
import mcp_types as mt
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("agentik-test", log_level="WARNING")

#: ``--long-docs``: every tool describes itself at the length real servers do (a
#: paragraph of usage notes), so many servers' schemas weigh what they do in practice.
LONG_DOCS = "--long-docs" in sys.argv
USAGE_NOTES = (
    " Usage notes: call this tool only when the user asks for it or when its result is"
    " needed to answer; arguments are validated against the schema and a wrong type is"
    " refused with an error that says which argument was wrong. The result is returned"
    " as text, and as structured content when the tool has an output schema."
)


def doc(text: str) -> str:
    return text + USAGE_NOTES if LONG_DOCS else text


@server.tool(description=doc("Add two integers."))
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description=doc("Echo the text back."))
def echo(text: str) -> str:
    return text


@server.tool(description=doc("Always fails."))
def fail() -> str:
    raise ToolError("this tool always fails")


@server.tool(description=doc("Sleep for a while, then answer."))
async def slow(seconds: float, started: str = "") -> str:
    if started:  # a file the test waits for: the call is in flight
        await anyio.Path(started).write_text("started")
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description=doc("Kill the server process during the call."))
def crash() -> str:
    os._exit(1)


@server.tool(description=doc("Return a small PNG image."))
def image() -> Image:
    return Image(data=PNG, format="png")


@server.tool(description=doc("Return an embedded text resource."))
def resource() -> mt.EmbeddedResource:
    return mt.EmbeddedResource(
        type="resource",
        resource=mt.TextResourceContents(uri="file:///x", mime_type="text/plain", text="hello"),
    )


@server.tool(description=doc("Return an embedded binary resource."))
def blob() -> mt.EmbeddedResource:
    return mt.EmbeddedResource(
        type="resource",
        resource=mt.BlobResourceContents(
            uri="file:///y.png", mime_type="image/png", blob=base64.b64encode(PNG).decode()
        ),
    )


@server.tool(description=doc("A small record (structured content, and its JSON as text)."))
def record(name: str) -> dict[str, object]:
    return {"name": name, "size": 3}


@server.tool(description=doc("Forget every session, as a server restarted in place does (HTTP)."))
def forget_sessions() -> str:
    # The session manager's table of live sessions: emptied, every known session
    # ID now answers 404 "Session not found" (this call's response still goes out).
    server.session_manager._server_instances.clear()
    return "forgotten"


@server.tool(description=doc("The server's process id."))
def pid() -> int:
    return os.getpid()


@server.tool(description=doc("A tool that must never be offered."))
def secret_tool() -> str:
    return "the secret"


@server.tool(description=doc("Register a new tool at run time and announce it."))
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


async def build(steps: int, ctx: Context) -> str:
    """Report progress ``steps`` times (``notifications/progress``), then answer."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i} of {steps}")
    return f"built in {steps} steps"


def big(size: int) -> str:
    """A text of ``size`` characters (one JSON-RPC line of about that many bytes)."""
    return "x" * size


if "--progress" in sys.argv:  # only then: other tests count this server's tools
    server.tool(description=doc("Report progress a few times, then answer."))(build)
if "--big" in sys.argv:
    server.tool(description=doc("Answer with a text of `size` characters."))(big)


def _flag(name: str) -> int:
    """The number after ``name`` on the command line (0 without it)."""
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return 0


# Hostile servers (issue 28): what one server must not do to every conversation.
def _copy_of_pid(name: str, description: str) -> None:
    # A copy of a registered tool: registering 10,000 anew takes seconds.
    tools = server._tool_manager._tools
    tools[name] = tools["pid"].model_copy(update={"name": name, "description": description})


if _flag("--huge-description"):  # one tool described in N characters
    _copy_of_pid("huge", "blah " * (_flag("--huge-description") // 5))
if "--long-names" in sys.argv:  # two names far over 64 characters, sharing a prefix
    for tail in ("one", "two"):
        _copy_of_pid("a_very_long_tool_name_" + "x" * 60 + tail, "Long.")
for i in range(_flag("--many")):  # ``--many N``: N more tools
    _copy_of_pid(f"tool_{i:05d}", f"Tool number {i}: does nothing new.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--banner", type=int, default=0, help="print this many non-JSON lines on stdout first"
    )
    parser.add_argument("--long-docs", action="store_true", help="realistic description lengths")
    parser.add_argument("--progress", action="store_true", help="offer the `build` tool")
    parser.add_argument("--big", action="store_true", help="offer the `big` tool")
    parser.add_argument("--many", type=int, default=0, help="offer N more tools")
    parser.add_argument(
        "--huge-description", type=int, default=0, help="a tool described in N chars"
    )
    parser.add_argument("--long-names", action="store_true", help="tools named over 64 chars")
    parser.add_argument("--hang", action="store_true", help="never answer (initialize hangs)")
    args = parser.parse_args()
    if args.hang:  # reads its stdin (the initialize request), never answers
        for _ in sys.stdin:
            pass
        return
    for i in range(args.banner):  # as servers that greet on stdout do
        print(f"agentik-test server starting ({i + 1}/{args.banner})", flush=True)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
