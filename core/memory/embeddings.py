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
    faster at some cost in quality.  The weights are memory-mapped, not read:
    their pages are shared by every process on the machine and only those of
    the tokens actually seen are touched; the vector of a text is the average
    of its tokens' rows, exactly as ``wordllama``'s own ``embed`` computes it.
:class:`OpenAIEmbedder` (``embeddings = "openai"``)
    any OpenAI-compatible ``/v1/embeddings`` endpoint, through the ``openai``
    SDK (``embedding_model``, ``embedding_base_url``, ``embedding_api_key_env``).

The vectors stored for a note record the embedder's :attr:`Embedder.model`
(name and dimension): vectors of another model are not comparable, so a
change of model is detected at start and ``agentik memory reembed`` rebuilds
them.

numpy and the tokenizer are imported on first use: a bot whose memory never
computes a vector does not load them.
"""

from __future__ import annotations

import abc
import asyncio
import importlib.util
import json
import os
import struct
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AgentikError

if TYPE_CHECKING:
    import numpy as np

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
    import numpy as np

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
    """The weights and tokenizer files inside the installed wordllama package
    (found without importing it: its ``__init__`` pulls in more than we use)."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise EmbeddingError("the builtin embedding model needs the wordllama package")
    root = Path(next(iter(spec.submodule_search_locations)))
    return (
        root / "weights" / f"{BUILTIN_CONFIG}_256.safetensors",
        root / "tokenizers" / f"{BUILTIN_CONFIG}_tokenizer_config.json",
    )


def _map_weights(path: Path) -> np.ndarray:
    """The token-embedding matrix of the safetensors file ``path``, memory-mapped
    read-only (``float16``, one row per token id).

    The format is an 8-byte little-endian header length, a JSON header giving
    each tensor's dtype, shape and byte range, then the data.  Read-only pages
    of a file are shared by every process that maps it, cost nothing until
    touched, and the kernel can drop them under pressure (they are the file).
    """
    import numpy as np

    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    info = header["embedding.weight"]
    if info["dtype"] != "F16" or len(info["shape"]) != 2:
        raise EmbeddingError(f"unexpected tensor in {path}: {info['dtype']} {info['shape']}")
    rows, cols = (int(n) for n in info["shape"])
    begin, end = (int(n) for n in info["data_offsets"])
    if end - begin != rows * cols * 2:
        raise EmbeddingError(f"{path} is truncated or corrupt")
    return np.memmap(path, dtype="<f2", mode="r", offset=8 + size + begin, shape=(rows, cols))


class _WordLlama:
    """WordLlama's inference on memory-mapped weights: tokenize, gather the
    tokens' rows, average them over the attention mask.

    The same operations, in the same order and precision, as
    ``wordllama.inference.WordLlamaInference.embed`` (64 texts per batch,
    padded; ``avg_pool``), so the vectors equal its vectors to ``float32``
    precision, without its ``float32`` copy of the whole matrix (32 MB).
    """

    batch = 64

    def __init__(self, weights: np.ndarray, tokenizer: Any, dim: int) -> None:
        self.weights = weights
        self.dim = dim
        self.tokenizer = tokenizer
        tokenizer.enable_padding()
        tokenizer.no_truncation()

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unnormalised average token vectors, ``float32`` ``(len(texts), dim)``."""
        import numpy as np

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        last = self.weights.shape[0] - 1
        for start in range(0, len(texts), self.batch):
            encoded = self.tokenizer.encode_batch(
                texts[start : start + self.batch], is_pretokenized=False, add_special_tokens=False
            )
            ids = np.array([e.ids for e in encoded], dtype=np.int32)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
            np.clip(ids, 0, last, out=ids)
            x = np.asarray(self.weights[ids])[..., : self.dim].astype(np.float32)
            mask_sum = np.maximum(mask.sum(axis=1, keepdims=True), 1.0).astype(np.float32)
            pooled = np.sum(x * mask[..., np.newaxis], axis=1, dtype=np.float32) / mask_sum
            out[start : start + pooled.shape[0]] = pooled
        return out


def _load_wordllama(dim: int) -> _WordLlama:
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
        from tokenizers import Tokenizer

        return _WordLlama(_map_weights(weights), Tokenizer.from_file(str(tokenizer_file)), dim)
    except EmbeddingError:
        raise
    except Exception as exc:
        raise EmbeddingError(f"cannot load the builtin embedding model: {exc}") from exc


class BuiltinEmbedder(Embedder):
    """WordLlama with the weights shipped in its wheel (no network, ever).

    The model loads on first use (a few milliseconds: the weights are
    memory-mapped; ``load()`` to do it now), with downloads disabled: a
    missing weights file is an :class:`EmbeddingError`, never a fetch.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim not in BUILTIN_DIMS:
            raise EmbeddingError(
                f"the builtin embedding model has {', '.join(map(str, BUILTIN_DIMS))} "
                f"dimensions, not {dim}"
            )
        self.dim = dim
        self.model = f"wordllama:{BUILTIN_CONFIG}:{dim}"
        self._wl: _WordLlama | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (by a first embedding or :meth:`load`)."""
        return self._wl is not None

    def load(self) -> _WordLlama:
        """The loaded model (loading it now if needed)."""
        with self._lock:
            if self._wl is None:
                self._wl = _load_wordllama(self.dim)
            return self._wl

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            import numpy as np

            return np.zeros((0, self.dim), dtype=np.float32)
        wl = self.load()
        return normalize(wl.embed(list(texts)))

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
            import numpy as np

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
