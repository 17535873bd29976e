"""The ``litert`` backend's plugin and its ``[llm]`` keys (:class:`LiteRTSettings`).

The backend itself, :class:`~agentik.core.llm.litert_backend.LiteRTBackend`, is
imported when a configuration uses it: every bot reads these keys to validate
``[llm]`` (a file can hold several backends' keys), but only a bot that runs the
on-device model needs the rest (0.2 MB; issue 31, fifteenth pass).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ..hookspecs import hookimpl
from ..plugins import LazyFactory
from ..settings import SETTINGS, Blank, BlankInt, PathSetting

__all__ = ["AuthorMode", "LiteRTSettings", "register_llm_backends"]

AuthorMode = Literal["prefix", "none"]


def _name_is_prefix(value: Any) -> Any:
    # Chat templates have no name field: "name" acts as "prefix".
    return "prefix" if value == "name" else value


class LiteRTSettings(BaseModel):
    """The ``litert`` backend's keys in ``[llm]`` (see
    :class:`~agentik.core.llm.litert_backend.LiteRTBackend`)."""

    model_config = SETTINGS | ConfigDict(frozen=True)

    #: The ``.litertlm`` file; unset: ``$AGENTIK_GOOGLE_MODEL_PATH``.
    model_path: PathSetting = None
    #: Compiled artifacts; unset: ``$AGENTIK_GOOGLE_CACHE_DIR``, else
    #: :func:`~agentik.core.llm.litert_backend.default_cache_dir`.
    cache_dir: PathSetting = None
    #: CPU threads of the engine; unset: ``$AGENTIK_GOOGLE_THREADS``, else the engine's choice.
    threads: BlankInt = Field(None, ge=1)
    max_tokens: int | None = Field(None, gt=0)
    #: The KV cache size; unset: the model's.
    context_tokens: int | None = Field(None, gt=0)
    top_k: int | None = Field(None, gt=0)
    top_p: float | None = Field(None, ge=0, le=1)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: int | None = None
    fold_system_prompt: bool = True
    idle_release_seconds: float = Field(600.0, gt=0)
    max_conversations: int = Field(4, ge=1)
    author_mode: Annotated[AuthorMode, BeforeValidator(_name_is_prefix)] = "prefix"
    #: Only a label (default: the model file's name).
    model: Blank = None


@hookimpl
def register_llm_backends(register: Any) -> None:
    register(
        "litert",
        LazyFactory("agentik.core.llm.litert_backend:LiteRTBackend", settings_model=LiteRTSettings),
    )
