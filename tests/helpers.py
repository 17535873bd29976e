"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio


async def collect_turn(sub, *, run_id: str | None = None, wait: float = 10.0) -> list:
    """Events from ``sub`` until the turn (``run_id`` or the first one) ends."""
    events = []

    async def consume() -> None:
        async for event in sub:
            events.append(event)
            if event.kind == "turn_ended" and (run_id is None or event.run_id == run_id):
                return

    await asyncio.wait_for(consume(), wait)
    return events
