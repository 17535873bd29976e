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


class VectorIndex:
    """Unit vectors of ``dim`` dimensions keyed by note id, each in a scope."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._vectors = np.zeros((0, dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._scopes = np.zeros(0, dtype=np.int32)
        self._n = 0
        self._row: dict[int, int] = {}
        self._scope_code: dict[str, int] = {}

    def __len__(self) -> int:
        return self._n

    def __contains__(self, note_id: object) -> bool:
        return note_id in self._row

    def _code(self, scope: str) -> int:
        code = self._scope_code.get(scope)
        if code is None:
            code = self._scope_code[scope] = len(self._scope_code)
        return code

    def _grow(self, need: int) -> None:
        cap = self._vectors.shape[0]
        if need <= cap:
            return
        new = max(need, cap * 2, 64)
        vectors = np.zeros((new, self.dim), dtype=np.float32)
        vectors[: self._n] = self._vectors[: self._n]
        ids = np.zeros(new, dtype=np.int64)
        ids[: self._n] = self._ids[: self._n]
        scopes = np.full(new, -1, dtype=np.int32)
        scopes[: self._n] = self._scopes[: self._n]
        self._vectors, self._ids, self._scopes = vectors, ids, scopes

    def put(self, note_id: int, scope: str, vector: np.ndarray) -> None:
        """Add or replace ``note_id``'s vector."""
        row = self._row.get(note_id)
        if row is None:
            self._grow(self._n + 1)
            row = self._n
            self._n += 1
            self._row[note_id] = row
            self._ids[row] = note_id
        self._vectors[row] = vector
        self._scopes[row] = self._code(scope)

    def put_many(self, ids: Sequence[int], scopes: Sequence[str], vectors: np.ndarray) -> None:
        for nid, scope, vec in zip(ids, scopes, vectors, strict=True):
            self.put(int(nid), scope, vec)

    def remove(self, note_id: int) -> None:
        """Forget ``note_id`` (nothing if absent): the last row moves into its place."""
        row = self._row.pop(note_id, None)
        if row is None:
            return
        last = self._n - 1
        if row != last:
            moved = int(self._ids[last])
            self._vectors[row] = self._vectors[last]
            self._ids[row] = moved
            self._scopes[row] = self._scopes[last]
            self._row[moved] = row
        self._scopes[last] = -1
        self._n = last

    def vector(self, note_id: int) -> np.ndarray | None:
        row = self._row.get(note_id)
        return None if row is None else self._vectors[row]

    def search(
        self, query: np.ndarray, scopes: Sequence[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """The ``limit`` notes most similar to ``query`` (a unit vector), in
        ``scopes`` (all when ``None``): ``(note id, cosine)``, best first."""
        n = self._n
        if n == 0 or limit <= 0:
            return []
        vectors = self._vectors[:n]
        if scopes is None:
            rows = None
            scores = vectors @ query
        else:
            codes = [self._scope_code[s] for s in scopes if s in self._scope_code]
            if not codes:
                return []
            mask = np.isin(self._scopes[:n], np.asarray(codes, dtype=np.int32))
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                return []
            if rows.size == n:
                rows = None
                scores = vectors @ query
            else:
                scores = vectors[rows] @ query
        k = min(limit, scores.shape[0])
        top = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(k)
        top = top[np.argsort(-scores[top], kind="stable")]
        picked = top if rows is None else rows[top]
        return [(int(self._ids[r]), float(s)) for r, s in zip(picked, scores[top], strict=True)]
