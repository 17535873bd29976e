"""Text embeddings for semantic memory search and automatic recall.

An :class:`Embedder` turns texts into unit-length ``float32`` vectors; the
cosine similarity of two texts is then the dot product of their vectors.

Two kinds:

:class:`BuiltinEmbedder` (``[memory] embeddings = "builtin"``, the default)
    WordLlama (the ``wordllama`` package, MIT): a static token-embedding model
    whose weights (``l2_supercat``, 256 dimensions, 16 MB) ship inside the
    wheel, so it loads with no network and no download, and embeds thousands
    of notes a second on one CPU core.  Its vectors may be cut to 64 or 128
    dimensions (``embedding_dim``; the model is trained for it), smaller and
    faster at some cost in quality.
:class:`OpenAIEmbedder` (``embeddings = "openai"``)
    any OpenAI-compatible ``/v1/embeddings`` endpoint, through the ``openai``
    SDK (``embedding_model``, ``embedding_base_url``, ``embedding_api_key_env``).

The vectors stored for a note record the embedder's :attr:`Embedder.model`
(name and dimension): vectors of another model are not comparable, so a
change of model is detected at start and ``agentik memory reembed`` rebuilds
them.
"""

from __future__ import annotations

import abc
import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AgentikError

__all__ = [
    "BuiltinEmbedder",
    "Embedder",
    "EmbeddingError",
    "OpenAIEmbedder",
    "embedder_for",
    "normalize",
]

#: The built-in model's configuration name inside the wordllama package.
BUILTIN_CONFIG = "l2_supercat"
BUILTIN_DIMS = (64, 128, 256)
#: Longest single text the builtin model embeds on the event loop (characters).
INLINE_CHARS = 2_000


class EmbeddingError(AgentikError):
    """Texts could not be embedded (model missing, endpoint failed, bad answer)."""


def normalize(vectors: Any) -> np.ndarray:
    """``vectors`` as a 2-D ``float32`` array of unit-length rows (zero rows stay zero)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


class Embedder(abc.ABC):
    """Turns texts into unit vectors of :attr:`dim` dimensions."""

    #: What produced the vectors (stored beside them): ``"<kind>:<model>"``.
    model: str = ""
    #: Dimensions (0: not known until the first call).
    dim: int = 0

    @abc.abstractmethod
    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit-length row per text (``float32``, shape ``(len(texts), dim)``)."""


def builtin_files() -> tuple[Path, Path]:
    """The weights and tokenizer files inside the installed wordllama package."""
    try:
        import wordllama
    except ImportError as exc:  # pragma: no cover - a dependency
        raise EmbeddingError("the builtin embedding model needs the wordllama package") from exc
    root = Path(wordllama.__file__).parent
    return (
        root / "weights" / f"{BUILTIN_CONFIG}_256.safetensors",
        root / "tokenizers" / f"{BUILTIN_CONFIG}_tokenizer_config.json",
    )


def _load_wordllama(dim: int) -> Any:
    """WordLlama from the files in its wheel, by path.

    ``WordLlama.load`` is not used: it looks for the tokenizer in a folder
    the wheel does not have (``tokenizer/``; the wheel's is ``tokenizers/``)
    and would then download it.  Loading by path never touches the network.
    """
    weights, tokenizer_file = builtin_files()
    for f in (weights, tokenizer_file):
        if not f.is_file():
            raise EmbeddingError(f"the builtin embedding model's file {f} is missing")
    try:
        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama.inference import WordLlamaInference

        with safe_open(str(weights), framework="np", device="cpu") as f:
            embedding = f.get_tensor("embedding.weight")[:, :dim]
        return WordLlamaInference(embedding, Tokenizer.from_file(str(tokenizer_file)))
    except Exception as exc:
        raise EmbeddingError(f"cannot load the builtin embedding model: {exc}") from exc


class BuiltinEmbedder(Embedder):
    """WordLlama with the weights shipped in its wheel (no network, ever).

    The model loads on first use (about a second; ``load()`` to do it now),
    with downloads disabled: a missing weights file is an
    :class:`EmbeddingError`, never a fetch.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim not in BUILTIN_DIMS:
            raise EmbeddingError(
                f"the builtin embedding model has {', '.join(map(str, BUILTIN_DIMS))} "
                f"dimensions, not {dim}"
            )
        self.dim = dim
        self.model = f"wordllama:{BUILTIN_CONFIG}:{dim}"
        self._wl: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """The loaded model (loading it now if needed)."""
        with self._lock:
            if self._wl is None:
                self._wl = _load_wordllama(self.dim)
            return self._wl

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        wl = self.load()
        return normalize(wl.embed(list(texts), norm=False))

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._wl is not None and len(texts) == 1 and len(texts[0]) <= INLINE_CHARS:
            # One short text (a query, a note) takes microseconds: a thread hop costs more.
            return self.embed_sync(texts)
        return await asyncio.to_thread(self.embed_sync, texts)


class OpenAIEmbedder(Embedder):
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (through the ``openai`` SDK)."""

    #: Texts per request.
    batch = 256

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        dim: int = 0,
        timeout: float = 60.0,
    ) -> None:
        self.name = model
        self.model = f"openai:{model}"
        self.dim = dim
        self._base_url = base_url
        self._api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self._timeout = timeout
        self._client: Any = None

    def _get_client(self) -> Any:
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(
                base_url=self._base_url,
                api_key=self._api_key or "none",
                timeout=self._timeout,
                max_retries=1,
            )
        return self._client

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows: list[list[float]] = []
        client = self._get_client()
        for start in range(0, len(texts), self.batch):
            chunk = list(texts[start : start + self.batch])
            try:
                resp = await client.embeddings.create(model=self.name, input=chunk)
            except Exception as exc:
                # The SDK's message names the endpoint and status, never the key.
                raise EmbeddingError(
                    f"embedding endpoint failed ({type(exc).__name__}): {str(exc)[:200]}"
                ) from None
            data = sorted(resp.data, key=lambda d: d.index)
            if len(data) != len(chunk):
                raise EmbeddingError(
                    f"embedding endpoint returned {len(data)} vectors for {len(chunk)} texts"
                )
            rows.extend(list(d.embedding) for d in data)
        arr = normalize(rows)
        if self.dim and arr.shape[1] != self.dim:
            raise EmbeddingError(
                f"embedding model {self.name} returned {arr.shape[1]} dimensions, "
                f"configured {self.dim}"
            )
        self.dim = int(arr.shape[1])
        return arr


def embedder_for(settings: Any) -> Embedder | None:
    """The embedder ``[memory]`` (a :class:`~agentik.core.memory.MemorySettings`) asks
    for, or ``None`` (``embeddings = "none"``).  Nothing is loaded or called yet."""
    kind = settings.embeddings
    if kind == "none":
        return None
    if kind == "builtin":
        return BuiltinEmbedder(settings.embedding_dim)
    if not settings.embedding_model:
        raise EmbeddingError('[memory] embeddings = "openai" needs embedding_model')
    key = settings.embedding_api_key
    return OpenAIEmbedder(
        settings.embedding_model,
        base_url=settings.embedding_base_url or os.environ.get("OPENAI_BASE_URL") or None,
        api_key=key.get_secret_value() if key is not None else None,
    )
