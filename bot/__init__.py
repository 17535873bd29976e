"""agentik.bot — configuration, wiring (builder), the bridge, and the CLI."""
