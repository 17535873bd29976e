"""The in-memory store's run events (:class:`~.repositories.RunEventRepository`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MemoryRunEvents"]


class MemoryRunEvents:
    """Run events in a dict: conversation id -> {seq: (at, data)}."""

    _run_events: dict[str, dict[int, tuple[float, str]]]

    def _events_of(self, conversation_id: str) -> dict[int, tuple[float, str]]:
        table = self.__dict__.setdefault("_run_events", {})
        return table.setdefault(conversation_id, {})

    async def run_events_add(
        self, rows: Sequence[tuple[str, int, float, str]], *, replace: bool = False
    ) -> None:
        for cid, seq, at, data in rows:
            table = self._events_of(cid)
            if replace and int(seq) in table:
                table[int(seq)] = (table[int(seq)][0], data)
            else:
                table.setdefault(int(seq), (float(at), data))

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]:
        rows = self.__dict__.get("_run_events", {}).get(conversation_id, {})
        found = sorted((s, d) for s, (_, d) in rows.items() if s > after)
        return found[: max(1, limit)]

    async def run_events_last(self, conversation_id: str) -> int:
        rows = self.__dict__.get("_run_events", {}).get(conversation_id, {})
        return max(rows, default=0)

    async def run_events_prune(self, *, keep: int, before: float) -> int:
        n = 0
        table = self.__dict__.get("_run_events", {})
        for cid in list(table):
            rows = table[cid]
            newest = set(sorted(rows, reverse=True)[: max(0, keep)])
            for seq in [s for s, (at, _) in rows.items() if at < before or s not in newest]:
                del rows[seq]
                n += 1
            if not rows:
                del table[cid]
        return n
