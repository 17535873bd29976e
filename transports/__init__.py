"""agentik.transports — one module or package per chat protocol."""
