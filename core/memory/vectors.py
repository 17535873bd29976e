"""An in-memory matrix of note vectors, searched by brute force with numpy.

The vectors live in the database (``memory_vector``); this is the copy a
process searches.  One row per note: its unit vector and its scope (as a
small integer), so a search is one matrix-vector product over the rows of
the visible scopes — a few milliseconds for 100,000 notes of 256
dimensions — with no approximation: what it returns is exactly the top
cosine similarities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["VectorIndex"]


#: Rows a scope's matrix starts with (then doubled as it fills).
FIRST_ROWS = 4


class _Block:
    """The vectors of one scope: rows ``0..n-1`` of a growing matrix.

    It starts at :data:`FIRST_ROWS` rows and doubles: most scopes (one per
    channel and user) hold a handful of notes, and a bot sees thousands of
    them, so a first block of 64 rows (64 KB at 256 dimensions) cost each
    channel with a note 64 KB of memory for good.
    """

    __slots__ = ("ids", "n", "row", "vectors")

    def __init__(self, dim: int) -> None:
        self.vectors = np.zeros((0, dim), dtype=np.float32)
        self.ids = np.zeros(0, dtype=np.int64)
        self.n = 0
        self.row: dict[int, int] = {}

    def put(self, note_id: int, vector: np.ndarray) -> None:
        row = self.row.get(note_id)
        if row is None:
            if self.n == self.vectors.shape[0]:
                new = max(FIRST_ROWS, self.n * 2)
                vectors = np.zeros((new, self.vectors.shape[1]), dtype=np.float32)
                vectors[: self.n] = self.vectors[: self.n]
                ids = np.zeros(new, dtype=np.int64)
                ids[: self.n] = self.ids[: self.n]
                self.vectors, self.ids = vectors, ids
            row = self.n
            self.n += 1
            self.row[note_id] = row
            self.ids[row] = note_id
        self.vectors[row] = vector

    def remove(self, note_id: int) -> None:
        row = self.row.pop(note_id)
        last = self.n - 1
        if row != last:
            moved = int(self.ids[last])
            self.vectors[row] = self.vectors[last]
            self.ids[row] = moved
            self.row[moved] = row
        self.n = last


class VectorIndex:
    """Unit vectors of ``dim`` dimensions keyed by note id, each in a scope.

    Each scope's vectors are one contiguous matrix, so a search costs what the
    visible scopes hold, however many notes other channels have.
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._blocks: dict[str, _Block] = {}
        self._scope_of: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._scope_of)

    def __contains__(self, note_id: object) -> bool:
        return note_id in self._scope_of

    def put(self, note_id: int, scope: str, vector: np.ndarray) -> None:
        """Add or replace ``note_id``'s vector (moving it if its scope changed)."""
        old = self._scope_of.get(note_id)
        if old is not None and old != scope:
            self.remove(note_id)
        block = self._blocks.get(scope)
        if block is None:
            block = self._blocks[scope] = _Block(self.dim)
        block.put(note_id, vector)
        self._scope_of[note_id] = scope

    def put_many(self, ids: Sequence[int], scopes: Sequence[str], vectors: np.ndarray) -> None:
        for nid, scope, vec in zip(ids, scopes, vectors, strict=True):
            self.put(int(nid), scope, vec)

    def remove(self, note_id: int) -> None:
        """Forget ``note_id`` (nothing if absent)."""
        scope = self._scope_of.pop(note_id, None)
        if scope is not None:
            block = self._blocks[scope]
            block.remove(note_id)
            if not block.n:  # a scope whose notes are all gone keeps no matrix
                del self._blocks[scope]

    def count(self, scopes: Sequence[str] | None = None) -> int:
        """How many vectors ``scopes`` hold (all scopes when ``None``)."""
        if scopes is None:
            return len(self._scope_of)
        return sum(b.n for s in dict.fromkeys(scopes) if (b := self._blocks.get(s)) is not None)

    def vector(self, note_id: int) -> np.ndarray | None:
        scope = self._scope_of.get(note_id)
        if scope is None:
            return None
        block = self._blocks[scope]
        return block.vectors[block.row[note_id]]

    def search(
        self, query: np.ndarray, scopes: Sequence[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """The ``limit`` notes most similar to ``query`` (a unit vector), in
        ``scopes`` (all when ``None``): ``(note id, cosine)``, best first."""
        if limit <= 0:
            return []
        names = self._blocks if scopes is None else dict.fromkeys(scopes)
        found_ids: list[np.ndarray] = []
        found_scores: list[np.ndarray] = []
        for name in names:
            block = self._blocks.get(name)
            if block is None or block.n == 0:
                continue
            scores = block.vectors[: block.n] @ query
            if scores.shape[0] > limit:
                top = np.argpartition(-scores, limit - 1)[:limit]
                found_ids.append(block.ids[top])
                found_scores.append(scores[top])
            else:
                found_ids.append(block.ids[: block.n])
                found_scores.append(scores)
        if not found_ids:
            return []
        ids = np.concatenate(found_ids)
        scores = np.concatenate(found_scores)
        order = np.argsort(-scores, kind="stable")[:limit]
        return [(int(ids[i]), float(scores[i])) for i in order]
