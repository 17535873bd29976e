"""Keys of a ``type = "slack"`` transport table (one Slack app per table)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from agentik.core.settings import PathSetting, empty_list

__all__ = ["SlackSettings", "SuggestedPrompt"]


class SuggestedPrompt(BaseModel):
    """One suggested prompt of an assistant thread: a button ``title`` that sends ``message``."""

    model_config = ConfigDict(extra="forbid")

    #: The button's label.
    title: str = Field(min_length=1, max_length=75)
    #: What the button sends, as if the user had written it.
    message: str = Field(min_length=1, max_length=2000)


def _prompts(value: Any) -> Any:
    """A plain string is a prompt whose label is its message."""
    if isinstance(value, list):
        return [{"title": v, "message": v} if isinstance(v, str) else v for v in value]
    return value


class SlackSettings(BaseModel):
    """Settings of one Slack app.  Every key is documented in ``config.example.toml``."""

    model_config = ConfigDict(extra="forbid")

    #: ``socket`` (Socket Mode: an outgoing WebSocket, no public URL) or ``http``
    #: (Events API: Slack POSTs to us; signatures always verified).
    mode: Literal["socket", "http"] = "socket"
    #: ``xoxb-`` bot token.
    bot_token: SecretStr
    #: ``xapp-`` app-level token (Socket Mode).
    app_token: SecretStr | None = None
    #: Signing secret (HTTP mode).
    signing_secret: SecretStr | None = None
    #: Where HTTP mode listens.
    http_host: str = "127.0.0.1"
    http_port: int = Field(3000, ge=0, le=65535)
    http_path: str = "/slack/events"
    #: Web API base URL (default: Slack's).  For tests and proxies.
    api_url: str | None = None
    #: ``thread``: each thread is a conversation and the bot answers in the thread;
    #: ``channel``: each channel is one conversation.
    conversation_per: Literal["thread", "channel"] = "thread"
    #: ``native`` (chat.startStream/appendStream/stopStream), ``edit`` (post, then
    #: chat.update), or ``auto`` (native where the workspace supports it).
    streaming: Literal["auto", "native", "edit"] = "auto"
    #: Seconds between two updates of a message being written: chat.update (edit
    #: mode; Slack allows about one a second) or chat.appendStream (native: what was
    #: written meanwhile goes in one append).  Native: an answer written within this
    #: long of its first words is posted whole (one chat.postMessage).  0: at once.
    edit_interval: float = Field(1.0, ge=0)
    #: Native streaming: characters an answer has before its stream starts.  A shorter
    #: answer, complete before that, is posted whole (one chat.postMessage).
    stream_buffer: int = Field(256, ge=1)
    #: Longest message before an answer continues in a new message.
    max_message_chars: int = Field(3900, ge=100, le=40000)
    #: Shown while the model works (assistant threads); empty: none.
    status_text: str = "is thinking…"
    #: Seconds a message waits for its answer to show before ``status_text`` is set
    #: (0: set at once).  An answer that shows sooner needs no status.
    status_delay: float = Field(1.0, ge=0)
    #: A reaction with this name on the bot's message stops the answer.
    stop_reaction: str = "octagonal_sign"
    #: Retries of a rate-limited (429) call, honouring Retry-After.
    rate_limit_retries: int = Field(5, ge=0)
    #: File remembering handled events, so retries and restarts never answer twice
    #: (default: ``slack-<name>-seen.sqlite3`` next to the database; in memory
    #: when the database is).  A relative path is relative to the configuration file.
    state_file: PathSetting = None
    #: How many handled event ids to remember.
    dedupe_keep: int = Field(20_000, ge=100)
    #: Mentions the model may write that really notify: ``users`` lets its
    #: ``<@U…>`` through.  Default none: everything the model writes is shown
    #: as text; ``<!here>``, ``<!channel>``, ``<!everyone>`` and group
    #: mentions never go out.
    allow_mentions: list[Literal["users"]] = Field(default_factory=empty_list)
    #: Posted when a user opens a new assistant thread (Slack's AI app view);
    #: empty: none.  Markdown.
    assistant_greeting: str = "Hi! How can I help?"
    #: Suggested prompts offered in a new assistant thread (at most 4): each a
    #: table ``{ title = "…", message = "…" }``, or a string (its own title).
    assistant_prompts: Annotated[list[SuggestedPrompt], BeforeValidator(_prompts)] = Field(
        default_factory=empty_list, max_length=4
    )

    # Slack's token kinds by prefix: xoxb- bot, xapp- app-level, xoxp- user.  The two
    # swapped (Socket Mode asks for both) fail at start-up with not_allowed_token_type;
    # the error names the key that holds the wrong kind, never the value.
    @field_validator("bot_token")
    @classmethod
    def _bot_token_kind(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if token.startswith("xapp-"):
            raise PydanticCustomError(
                "slack_token_kind",
                "holds an app-level token (xapp-…); the bot token starts with xoxb-"
                " (OAuth & Permissions → Bot User OAuth Token): bot_token and app_token"
                " swapped?",
            )
        if token.startswith("xoxp-"):
            raise PydanticCustomError(
                "slack_token_kind",
                "holds a user token (xoxp-…); the bot token starts with xoxb-"
                " (OAuth & Permissions → Bot User OAuth Token)",
            )
        return value

    @field_validator("app_token")
    @classmethod
    def _app_token_kind(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().startswith(("xoxb-", "xoxp-")):
            raise PydanticCustomError(
                "slack_token_kind",
                "holds a bot or user token (xox…); the app-level token starts with xapp-"
                " (Basic Information → App-Level Tokens, scope connections:write):"
                " bot_token and app_token swapped?",
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> SlackSettings:
        if self.mode == "socket" and self.app_token is None:
            raise ValueError("Socket Mode needs app_token (an xapp- token)")
        if self.mode == "http" and self.signing_secret is None:
            raise ValueError("HTTP mode needs signing_secret")
        return self
