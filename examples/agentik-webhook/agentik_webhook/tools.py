"""An example tool a plugin brings along: the current time.

Prefix your tools' names with your plugin's name (``webhook_...``): names are
global, and two plugins registering the same name is an error naming both.
"""

from __future__ import annotations

import datetime as dt

from agentik.core import ToolError, tool

__all__ = ["webhook_time"]


@tool(
    name="webhook_time",
    parameters={
        "type": "object",
        "properties": {
            "utc_offset_minutes": {
                "type": "integer",
                "description": "Offset from UTC in minutes (e.g. 120 for UTC+2); default 0.",
            }
        },
    },
)
async def webhook_time(utc_offset_minutes: int = 0) -> str:
    """The current date and time in ISO 8601, in UTC or at the given offset."""
    if not isinstance(utc_offset_minutes, int) or abs(utc_offset_minutes) >= 24 * 60:
        raise ToolError("utc_offset_minutes must be a whole number of minutes within ±24 hours")
    zone = dt.timezone(dt.timedelta(minutes=utc_offset_minutes))
    return dt.datetime.now(zone).isoformat(timespec="seconds")
