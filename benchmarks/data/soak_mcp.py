"""A real MCP server over stdio for ``benchmarks/bench_soak.py``: one tool, ``report``,
whose output is as long as asked (20,000 characters in the soak), as a search, a log
tail or a file read gives a model in practice.

Run as ``python benchmarks/data/soak_mcp.py`` (the bot starts it as an
``[[mcp.servers]]`` entry).  The text is made of numbered lines naming the topic, so
each output is different and does not compress to nothing.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("agentik-soak", log_level="WARNING")


@server.tool(description="A report on a topic, `size` characters long.")
def report(topic: str, size: int = 20000) -> str:
    lines: list[str] = []
    total, n = 0, 0
    while total <= size:  # the joined text (one newline fewer) is longer than size
        line = f"{n:05d} {topic}: measurement {n * 7919 % 100003} within bounds, status nominal"
        lines.append(line)
        total += len(line) + 1
        n += 1
    text = "\n".join(lines)[:size]
    return text[:-1] + "." if text[-1:].isspace() else text  # clients strip the end


if __name__ == "__main__":
    server.run("stdio")
