"""The in-memory store's run events (:class:`~.repositories.RunEventRepository`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MemoryRunEvents"]


class MemoryRunEvents:
    """Run events in a dict: conversation id -> {seq: (at, data, pos)} (``pos``:
    ``None`` for an event that is not on the agent-wide stream)."""

    _run_events: dict[str, dict[int, tuple[float, str, int | None]]]

    def _events_of(self, conversation_id: str) -> dict[int, tuple[float, str, int | None]]:
        table = self.__dict__.setdefault("_run_events", {})
        return table.setdefault(conversation_id, {})

    async def run_events_add(
        self,
        rows: Sequence[tuple[str, int, float, str]],
        *,
        replace: bool = False,
        wide: Sequence[bool] | None = None,
    ) -> None:
        flags = [True] * len(rows) if wide is None else [bool(w) for w in wide]
        if len(flags) != len(rows):
            raise ValueError("wide must have one flag per row")
        last = self.__dict__.get("_run_pos_last", 0)
        for (cid, seq, at, data), flag in zip(rows, flags, strict=True):
            pos = None
            if flag:
                last += 1
                pos = last
            table = self._events_of(cid)
            if replace and int(seq) in table:
                at0, _, pos0 = table[int(seq)]
                table[int(seq)] = (at0, data, pos0)
            else:
                table.setdefault(int(seq), (float(at), data, pos))
        self.__dict__["_run_pos_last"] = last

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]:
        rows = self.__dict__.get("_run_events", {}).get(conversation_id, {})
        found = sorted((s, d) for s, (_, d, _) in rows.items() if s > after)
        return found[: max(1, limit)]

    async def run_events_since(self, after: int, *, limit: int = 500) -> list[tuple[int, str]]:
        table = self.__dict__.get("_run_events", {})
        found = sorted(
            (p, d)
            for rows in table.values()
            for _, d, p in rows.values()
            if p is not None and p > after
        )
        return found[: max(1, limit)]

    async def run_events_position(self) -> tuple[int, int]:
        table = self.__dict__.get("_run_events", {})
        last = max(
            (p for rows in table.values() for _, _, p in rows.values() if p is not None),
            default=0,
        )
        return last, self.__dict__.get("_run_pos_pruned", 0)

    async def run_events_last(self, conversation_id: str) -> int:
        rows = self.__dict__.get("_run_events", {}).get(conversation_id, {})
        return max(rows, default=0)

    async def run_events_prune(self, *, keep: int, before: float) -> int:
        n = 0
        top = self.__dict__.get("_run_pos_pruned", 0)
        table = self.__dict__.get("_run_events", {})
        for cid in list(table):
            rows = table[cid]
            newest = set(sorted(rows, reverse=True)[: max(0, keep)])
            for seq in [s for s, (at, _, _) in rows.items() if at < before or s not in newest]:
                pos = rows.pop(seq)[2]
                if pos is not None and pos > top:
                    top = pos
                n += 1
            if not rows:
                del table[cid]
        self.__dict__["_run_pos_pruned"] = top
        return n
