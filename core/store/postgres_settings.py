"""The PostgreSQL store's settings, apart from the store: the configuration reads them
for every bot (``[storage]``), and a bot on SQLite should not import the twenty
modules of the PostgreSQL store to do so (:mod:`.postgres` re-exports them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..settings import knobs_dataclass

__all__ = ["PostgresSettings"]


@knobs_dataclass
class PostgresSettings:
    """The PostgreSQL store's settings (the configuration's ``[storage]`` with
    ``backend = "postgres"``)."""

    #: The environment variable holding the DSN (``postgresql://user:pass@host/db``):
    #: never the secret itself in the file.
    dsn_env: str = "AGENTIK_POSTGRES_DSN"
    #: Connections the pool keeps open (one is the writer's).
    pool_min: Annotated[int, Field(ge=2)] = 2
    #: Connections the pool opens at most (reads run in parallel on them).
    pool_max: Annotated[int, Field(ge=2)] = 10
