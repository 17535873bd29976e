"""The ``agentik`` command line."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentik", description="Run an LLM agent as a chat bot.")
    parser.add_argument("--version", action="version", version=f"agentik {version('agentik')}")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="start the configured bot")
    run.add_argument("-c", "--config", default="config.example.toml")
    args = parser.parse_args(argv)
    if args.command == "run":
        print("agentik: the config-file bot is not there yet (see issue 3).", file=sys.stderr)
        return 1
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
