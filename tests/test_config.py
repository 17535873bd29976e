"""The TOML configuration: the example file, errors naming keys, ``${VAR}``, overrides, secrets."""

from __future__ import annotations

import inspect
import os
import re
import sys
import tomllib
import typing
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr
from pydantic.dataclasses import is_pydantic_dataclass

from agentik.bot.app import load_registry, make_transport
from agentik.bot.builder import backend_choice, ignored_settings, resolve_backend
from agentik.bot.cli import main as cli_main
from agentik.bot.config import (
    ENV_OVERRIDES,
    Config,
    LLMSection,
    TransportSection,
    builtin_llm_settings,
    load_config,
    parse_config,
    reveal,
)
from agentik.core import Agent, ConfigError, TurnPolicy
from agentik.core.agent import AgentSettings
from agentik.core.background import MemoryWorker
from agentik.core.compaction import CompactionPolicy
from agentik.core.hookspecs import hookimpl
from agentik.core.memory import BackgroundPolicy, MemoryBackend, MemorySettings
from agentik.core.memory.markdown import MarkdownMemory
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.plugins import LazyFactory, load_plugins
from agentik.core.settings import FilePath, config_key, setting_fields
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.base import Transport
from agentik.transports.stdio import StdioSettings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.toml"
SECRET = "sk-very-secret-123"


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch):
    """No OPENAI_* / AGENTIK_* variable from the outside leaks into a test."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENTIK_")):
            monkeypatch.delenv(name)


@pytest.fixture
def real_stdin(monkeypatch):
    """A real file as stdin (pytest's capture stdin has no file descriptor)."""
    with open(os.devnull, encoding="utf-8") as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


def write(tmp_path: Path, text: str, name: str = "bot.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    return message


# -- the example file ---------------------------------------------------------------------


def test_example_config_loads_validates_and_builds_its_transports(real_stdin):
    config = load_config(EXAMPLE, env={})
    assert config.source == str(EXAMPLE)
    # With no model configured the bot answers with the local model.
    assert config.llm.backend == "auto"
    assert config.llm.model is None and config.llm.base_url is None
    assert config.llm.api_key is None and config.llm.model_path is None
    assert backend_choice(config) == "llamacpp"
    assert config.transports, "the example configures at least one transport"
    registry = load_registry(config)
    for name, section in config.transports.items():
        transport = make_transport(registry, name, section, config.source)
        assert isinstance(transport, Transport)
        assert transport.name == name
        assert transport.type == section.type
    terminal = make_transport(registry, "terminal", config.transports["terminal"], config.source)
    assert terminal.channel_key == "stdio:local"


def test_example_config_picks_up_the_openai_variables():
    env = {
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_MODEL": "m",
        "OPENAI_API_KEY": SECRET,
    }
    config = load_config(EXAMPLE, env=env)
    assert config.llm.base_url == "http://127.0.0.1:9/v1"
    assert config.llm.model == "m"
    assert reveal(config.llm.api_key) == SECRET
    assert backend_choice(config) == "openai"


# ``[table]``, ``[[array.of.tables]]``, and such headers commented out (``# [[mcp.servers]]``).
# A table header; a part of its name may be quoted ([channels."irc:libera:#ops"]).
_HEADER = re.compile(
    r'^(?:# ?)?\[\[?((?:[A-Za-z0-9_\-]+|"[^".]*")(?:\.(?:[A-Za-z0-9_\-]+|"[^".]*"))*)\]\]?'
    r"\s*(#.*)?$"
)
_LIVE_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=")
_COMMENTED_KEY = re.compile(r"^# ?([A-Za-z_][A-Za-z0-9_]*) = \S")


class _Key(typing.NamedTuple):
    table: str
    key: str
    lineno: int
    commented: bool

    @property
    def path(self) -> str:
        return f"{self.table}.{self.key}" if self.table else self.key


def _scan_example() -> tuple[list[str], dict[str, int], list[_Key]]:
    """The example's lines, its table headers (name -> line index) and its keys."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    tables: dict[str, int] = {}
    keys: list[_Key] = []
    table = ""
    for i, line in enumerate(lines):
        if m := _HEADER.match(line.strip()):
            table = m.group(1).replace('"', "")
            tables[table] = i
        elif m := _LIVE_KEY.match(line):
            keys.append(_Key(table, m.group(1), i, commented=False))
        elif m := _COMMENTED_KEY.match(line):
            keys.append(_Key(table, m.group(1), i, commented=True))
    return lines, tables, keys


def _is_section(ann: object) -> bool:
    return isinstance(ann, type) and (issubclass(ann, BaseModel) or is_pydantic_dataclass(ann))


def _model_keys(model: type, prefix: str = "") -> set[str]:
    """Every key path of ``model``, recursively; ``*`` stands for a table name of a dict.

    Sections may be pydantic models or pydantic dataclasses (the core's policies); a
    field's key is its alias when it has one.  ``[llm]`` holds, besides its own keys,
    the keys of every built-in backend's settings model.
    """
    paths: set[str] = set()
    if isinstance(model, type) and issubclass(model, LLMSection):
        for backend in builtin_llm_settings().values():
            paths |= _model_keys(backend, prefix)
    for name, field in setting_fields(model).items():
        if field.exclude:  # Config.source: where the file came from, not a key
            continue
        path = prefix + config_key(name, field)
        ann = field.annotation
        args = typing.get_args(ann)
        if _is_section(ann):
            paths |= _model_keys(ann, path + ".")  # type: ignore[arg-type]
        elif typing.get_origin(ann) is dict and _is_section(args[1]):
            paths |= _model_keys(args[1], path + ".*.")
        elif typing.get_origin(ann) is list and args and _is_section(args[0]):
            paths |= _model_keys(args[0], path + ".")  # an array of tables
        else:
            paths.add(path)
    return paths


def _profile_as_llm(path: str) -> str:
    """A ``[llm.profiles.<name>]`` key as the ``[llm]`` key it is (a profile takes
    ``[llm]``'s keys); the table itself as ``llm.profiles``."""
    if re.fullmatch(r"llm\.profiles\.[^.]+", path):
        return "llm.profiles"
    return re.sub(r"^llm\.profiles\.[^.]+\.", "llm.", path)


def _matches(pattern: str, path: str) -> bool:
    regex = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split("."))
    return re.fullmatch(regex, path) is not None


def _transport_settings_model(type_name: str) -> type[BaseModel] | None:
    registry = load_registry(Config())
    factory = registry.transports[type_name]
    return getattr(factory, "settings_model", None)


def test_example_config_mentions_every_key():
    """Every key of the configuration appears in ``config.example.toml``.

    A key counts as present as a live ``key = value`` line or as a commented-out
    ``# key = value`` line inside its table; a table such as ``[llm.options]`` counts for
    its key.  Keys come from walking the pydantic models (``Config``, its sections,
    ``TransportSection`` including ``type``), plus the transport's own settings model
    (``StdioSettings``) for every ``type = "stdio"`` table.  Conversely, every key the
    example writes (commented out or not) must be a real key, so stale examples fail too.
    """
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    _, tables, keys = _scan_example()
    present = {k.path for k in keys} | {_profile_as_llm(t) for t in tables}

    expected = _model_keys(Config)
    transport_tables = {name: t["type"] for name, t in data.get("transports", {}).items()}
    assert "stdio" in transport_tables.values(), "the example has a stdio transport table"
    for name, type_name in transport_tables.items():
        settings = _transport_settings_model(type_name)
        if type_name == "stdio":
            assert settings is StdioSettings
        if settings is not None:
            expected |= {f"transports.{name}.{key}" for key in settings.model_fields}
            for key, field in settings.model_fields.items():
                # A sub-table of the transport's (the http transport's [….a2a]).
                if _is_section(field.annotation):
                    expected |= _model_keys(field.annotation, f"transports.{name}.{key}.")

    for pattern in sorted(expected):
        assert any(_matches(pattern, path) for path in present), (
            f"{pattern} is not in config.example.toml (not even as '# key = ...')"
        )

    for key in keys:
        assert any(_matches(pattern, _profile_as_llm(key.path)) for pattern in expected), (
            f"config.example.toml line {key.lineno + 1}: {key.path} is not a configuration key"
        )
    for table in map(_profile_as_llm, tables):
        depth = table.count(".") + 1
        prefixes = {".".join(p.split(".")[:depth]) for p in expected}
        assert any(_matches(prefix, table) for prefix in prefixes), (
            f"[{table}] is not a configuration table"
        )


def test_every_key_in_the_example_has_a_comment_right_above_it():
    """Each key in a table is documented by a comment line directly above it.

    The rule: the line just above every ``key = value`` or ``# key = value`` line inside a
    table is a prose comment (a ``#`` line that is not itself a commented-out key).  The
    first key of a table may instead rely on the prose comment directly above the table
    header, provided that comment names the key (``[transports.<name>]`` tables explain
    their ``type`` that way).
    """
    lines, tables, keys = _scan_example()

    def prose(index: int) -> str | None:
        if index < 0:
            return None
        line = lines[index]
        if line.startswith("#") and not _COMMENTED_KEY.match(line):
            return line
        return None

    undocumented = []
    for key in keys:
        if not key.table:
            continue
        if prose(key.lineno - 1) is not None:
            continue
        header = tables[key.table]
        above_header = prose(header - 1)
        if key.lineno - 1 == header and above_header and key.key in above_header:
            continue
        undocumented.append(f"line {key.lineno + 1}: {key.path}")
    assert not undocumented, "keys without a comment right above them: " + ", ".join(undocumented)


# -- errors name the file and the key -----------------------------------------------------


def test_unknown_key_is_named(tmp_path):
    message = load_error(tmp_path, '[llm]\nmodle = "x"\n')
    assert "llm.modle" in message and "unknown key" in message


def test_unknown_section_is_named(tmp_path):
    message = load_error(tmp_path, '[lmm]\nmodel = "x"\n')
    assert "lmm" in message and "unknown key" in message


def test_source_is_not_a_key(tmp_path):
    message = load_error(tmp_path, 'source = "elsewhere.toml"\n')
    assert "source" in message and "unknown key" in message


def test_wrong_type_is_named(tmp_path):
    message = load_error(tmp_path, '[llm]\ntimeout = "soon"\n')
    assert "llm.timeout" in message
    assert "soon" in message


def test_out_of_range_value_is_named(tmp_path):
    message = load_error(tmp_path, "[llm]\ntemperature = 3\n")
    assert "llm.temperature" in message


def test_value_outside_a_choice_is_named(tmp_path):
    message = load_error(tmp_path, '[storage]\nsynchronous = "sometimes"\n')
    assert "storage.synchronous" in message and "sometimes" in message
    message = load_error(tmp_path, '[storage]\nwriter = "fork"\n')
    assert "storage.writer" in message and "fork" in message


def test_missing_transport_type_is_named(tmp_path):
    message = load_error(tmp_path, "[transports.t]\nenabled = true\n")
    assert "transports.t.type" in message and "missing" in message


def test_several_problems_report_the_first_and_count_the_rest(tmp_path):
    message = load_error(tmp_path, '[llm]\nmodle = "x"\ntimeout = "soon"\n')
    assert "1 more problem" in message


def test_bad_transport_setting_is_named_when_the_transport_is_made(tmp_path, real_stdin):
    path = write(tmp_path, '[transports.t]\ntype = "stdio"\nbogus = 1\n')
    config = load_config(path, env={})
    assert config.transports["t"].settings == {"bogus": 1}
    registry = load_registry(config)
    with pytest.raises(ConfigError) as info:
        make_transport(registry, "t", config.transports["t"], config.source)
    message = str(info.value)
    assert str(path) in message
    assert "transports.t.bogus" in message and "unknown key" in message


def test_badly_typed_transport_setting_is_named(tmp_path, real_stdin):
    path = write(tmp_path, '[transports.t]\ntype = "stdio"\nmax_line_bytes = "lots"\n')
    config = load_config(path, env={})
    with pytest.raises(ConfigError) as info:
        make_transport(load_registry(config), "t", config.transports["t"], config.source)
    assert "transports.t.max_line_bytes" in str(info.value) and "lots" in str(info.value)


def test_unknown_transport_type_is_named(tmp_path):
    path = write(tmp_path, '[transports.t]\ntype = "carrier-pigeon"\n')
    config = load_config(path, env={})
    with pytest.raises(ConfigError) as info:
        make_transport(load_registry(config), "t", config.transports["t"], config.source)
    message = str(info.value)
    assert "transports.t.type" in message and "carrier-pigeon" in message
    assert "stdio" in message  # lists what is installed


def test_invalid_toml_names_the_file_and_the_line(tmp_path):
    message = load_error(tmp_path, '[llm\nmodel = "x"\n')
    assert "not valid TOML" in message and "line 1" in message


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)
    assert "no such configuration file" in str(info.value)


# -- ${VAR} interpolation ---------------------------------------------------------------------


def test_variables_are_read_from_the_environment(tmp_path):
    path = write(
        tmp_path,
        '[agent]\nname = "${BOT_NAME}"\nsystem_prompt = "Be ${MOOD:-kind}, ${WHO:-friend}."\n'
        '[storage]\npath = "${DATA}/bot.db"\n'
        '[tools]\nallowed = ["${TOOL_A}", "b_*"]\n',
    )
    config = load_config(
        path, env={"BOT_NAME": "ada", "MOOD": "terse", "DATA": "/srv", "TOOL_A": "a_*"}
    )
    assert config.agent.name == "ada"
    assert config.agent.system_prompt == "Be terse, friend."
    assert config.storage.path == "/srv/bot.db"
    assert config.tools.allowed == ["a_*", "b_*"]


def test_interpolated_numbers_are_validated_as_numbers(tmp_path):
    path = write(tmp_path, '[llm]\ntimeout = "${LLM_TIMEOUT:-30}"\n')
    assert load_config(path, env={}).llm.timeout == 30.0
    assert load_config(path, env={"LLM_TIMEOUT": "5.5"}).llm.timeout == 5.5


def test_double_dollar_is_a_literal_dollar(tmp_path):
    path = write(tmp_path, '[agent]\nsystem_prompt = "costs $$5, write $${HOME} literally"\n')
    config = load_config(path, env={"HOME": "/root"})
    assert config.agent.system_prompt == "costs $5, write ${HOME} literally"


def test_unset_variable_without_default_names_the_key_and_the_variable(tmp_path):
    message = load_error(tmp_path, '[agent]\nsystem_prompt = "hi ${NOT_SET_ANYWHERE}"\n')
    assert "agent.system_prompt" in message
    assert "NOT_SET_ANYWHERE" in message
    assert ":-default" in message  # says how to make it optional


def test_unset_variable_in_a_list_names_the_element(tmp_path):
    message = load_error(tmp_path, '[tools]\nallowed = ["a", "${NOPE}"]\n')
    assert "tools.allowed[1]" in message and "NOPE" in message


def test_unset_variable_in_a_transport_table_names_the_key(tmp_path):
    message = load_error(tmp_path, '[transports.t]\ntype = "stdio"\nuser = "${WHO_AM_I}"\n')
    assert "transports.t.user" in message and "WHO_AM_I" in message


# -- environment overrides -------------------------------------------------------------------

FULL = """
[agent]
system_prompt = "from the file"
[llm]
backend = "openai"
model = "file-model"
base_url = "http://file.invalid/v1"
api_key = "sk-from-the-file"
[storage]
path = "file.db"
"""


@pytest.mark.parametrize(
    ("var", "value", "get"),
    [
        ("AGENTIK_DB_PATH", "/tmp/env.db", lambda c: c.storage.path),
        ("AGENTIK_LLM_BACKEND", "scripted", lambda c: c.llm.backend),
        ("AGENTIK_SYSTEM_PROMPT", "from the environment", lambda c: c.agent.system_prompt),
        ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1", lambda c: c.llm.base_url),
        ("OPENAI_API_KEY", SECRET, lambda c: reveal(c.llm.api_key)),
        ("OPENAI_MODEL", "env-model", lambda c: c.llm.model),
        ("AGENTIK_GOOGLE_MODEL_PATH", "/models/g.litertlm", lambda c: c.llm.model_path),
        ("AGENTIK_GOOGLE_CACHE_DIR", "/tmp/litert-cache", lambda c: c.llm.cache_dir),
        ("AGENTIK_GOOGLE_THREADS", "3", lambda c: str(c.llm.threads)),
        (
            "AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER",
            "False",
            lambda c: str(c.llm.fold_system_prompt),
        ),
    ],
)
def test_environment_overrides_the_file(tmp_path, var, value, get):
    path = write(tmp_path, FULL)
    before = load_config(path, env={})
    assert get(before) != value
    assert get(load_config(path, env={var: value})) == value


def test_overrides_apply_when_the_file_has_no_such_table(tmp_path):
    path = write(tmp_path, "")
    config = load_config(path, env={"OPENAI_MODEL": "m", "AGENTIK_DB_PATH": "x.db"})
    assert config.llm.model == "m" and config.storage.path == "x.db"


def test_every_override_is_tested():
    assert set(ENV_OVERRIDES) == {
        "AGENTIK_DB_PATH",
        "AGENTIK_LLM_BACKEND",
        "AGENTIK_SYSTEM_PROMPT",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPENAI_MODEL",
        "AGENTIK_GOOGLE_MODEL_PATH",
        "AGENTIK_GOOGLE_CACHE_DIR",
        "AGENTIK_GOOGLE_THREADS",
        "AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER",
    }


def test_empty_environment_variable_does_not_override(tmp_path):
    path = write(tmp_path, FULL)
    assert load_config(path, env={"OPENAI_MODEL": ""}).llm.model == "file-model"


def test_overrides_read_the_process_environment_by_default(tmp_path, monkeypatch):
    path = write(tmp_path, FULL)
    monkeypatch.setenv("OPENAI_MODEL", "process-model")
    assert load_config(path).llm.model == "process-model"


# -- secrets ------------------------------------------------------------------------------


def test_api_key_is_secret_everywhere_but_reveal(tmp_path):
    path = write(tmp_path, '[llm]\napi_key = "${KEY}"\nmodel = "m"\n')
    config = load_config(path, env={"KEY": SECRET})
    assert isinstance(config.llm.api_key, SecretStr)
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    assert SECRET not in str(config.model_dump())
    assert SECRET not in config.model_dump_json()
    assert reveal(config.llm.api_key) == SECRET
    assert config.secrets() == [SECRET]


def test_blank_api_key_is_no_key():
    config = parse_config({"llm": {"api_key": ""}}, env={})
    assert config.llm.api_key is None
    assert config.secrets() == []
    assert reveal(None) is None
    assert reveal("plain") == "plain"


def test_transport_section_keeps_its_own_settings_apart():
    section = TransportSection(type="stdio", channel="ops", answer="all")
    assert section.answer == "all"
    assert section.settings == {"channel": "ops"}


def test_errors_never_quote_values_from_the_environment_or_secret_keys():
    secret = "sk-do-not-print-me"
    with pytest.raises(ConfigError) as info:
        parse_config({"llm": {"temperature": "${OPENAI_API_KEY}"}}, env={"OPENAI_API_KEY": secret})
    assert "llm.temperature" in str(info.value) and secret not in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"llm": {"timeout": "soon"}}, env={})
    assert "'soon'" in str(info.value)  # a literal typo is still quoted, to help fix it


def test_transport_secrets_are_masked_too():
    config = parse_config(
        {"transports": {"irc": {"type": "irc", "sasl_password": "hunter22", "nick": "bot"}}},
        env={},
    )
    assert "hunter22" in config.secrets() and "bot" not in config.secrets()


def test_relative_paths_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "bot.toml"
    path.write_text('[storage]\npath = "data/bot.db"\n[agent]\nsoul = "soul.md"\n')
    config = load_config(path, env={})
    assert config.database == str(tmp_path / "sub" / "data" / "bot.db")
    assert config.resolve_path("soul.md") == str(tmp_path / "sub" / "soul.md")
    assert parse_config({"storage": {"path": ":memory:"}}, env={}).database == ":memory:"


def test_mcp_servers_are_validated_and_their_secrets_masked():
    config = parse_config(
        {
            "mcp": {
                "servers": [
                    {"name": "time", "command": "mcp-server-time",
                     "env": {"API_KEY": "k-123456", "TZ": "UTC"}},
                    {"name": "web", "url": "http://127.0.0.1:9/mcp", "bearer_token": "tok-98765",
                     "headers": {"Authorization": "Bearer hdr-55555"}},
                ]
            }
        },
        env={},
    )  # fmt: skip
    assert [s.name for s in config.mcp.servers] == ["time", "web"]
    secrets = config.secrets()
    assert {"k-123456", "tok-98765", "Bearer hdr-55555"} <= set(secrets)
    assert "UTC" not in secrets
    for bad, message in [
        ({"name": "x"}, "either command"),
        ({"name": "x", "command": "a", "url": "http://b"}, "either command"),
        ({"name": "bad name!", "command": "a"}, "mcp.servers.0.name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"mcp": {"servers": [bad]}}, env={})
    with pytest.raises(ConfigError, match="two MCP servers are named 'a'"):
        parse_config(
            {"mcp": {"servers": [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]}},
            env={},
        )


# -- one schema per setting ----------------------------------------------------------------


def test_config_sections_are_the_core_settings_classes():
    """No twin: the sections ARE the classes the core uses, so a default cannot drift."""
    fields = Config.model_fields
    assert fields["tools"].annotation is TurnPolicy
    assert fields["compaction"].annotation is CompactionPolicy
    assert fields["memory"].annotation is MemorySettings
    assert issubclass(fields["agent"].annotation, AgentSettings)
    assert issubclass(MemorySettings, BackgroundPolicy)
    # [llm] declares only the choice (and its named profiles); every other key is a
    # backend's own.
    assert set(LLMSection.model_fields) == {"backend", "options", "profiles"}
    config = parse_config(
        {"tools": {"allowed": ["a_*"]}, "compaction": {"keep_turns": 2}, "memory": {"timeout": 9}},
        env={},
    )
    assert config.tools == TurnPolicy(allowed_tools=("a_*",))
    assert config.compaction == CompactionPolicy(keep_turns=2)
    assert config.memory == MemorySettings(timeout=9)
    assert parse_config({}, env={}).agent.event_buffer == AgentSettings().event_buffer


def _default(param: inspect.Parameter) -> object:
    return param.default


def test_constructor_defaults_are_the_settings_defaults():
    """Library users building parts by hand get the same defaults as the file."""
    assert _default(inspect.signature(Agent).parameters["event_buffer"]) == (
        AgentSettings().event_buffer
    )
    for cls in (MemoryBackend, SQLiteMemory, MarkdownMemory):
        param = inspect.signature(cls).parameters["allow_global_writes"]
        assert param.default == MemorySettings().allow_global_writes, cls
    assert MemoryWorker().policy == BackgroundPolicy()
    backends = load_plugins(env={"AGENTIK_PLUGINS": ""}).llm_backends
    assert set(builtin_llm_settings()) == {"openai", "llamacpp", "litert", "scripted"}
    for name, model in builtin_llm_settings().items():
        assert backends[name].settings_model is model
        factory = backends[name]
        if isinstance(factory, LazyFactory):  # the local backends: by name, their class
            factory = factory.load()
        params = inspect.signature(factory).parameters
        for key, field in model.model_fields.items():
            assert key in params, f"{name}: the constructor takes no {key}"
            default = params[key].default
            expected = field.get_default(call_default_factory=True)
            if default is None and expected == {}:
                continue  # a mapping parameter: None stands for "empty"
            assert default == expected, f"{name}.{key}: {default!r} != {expected!r}"


def test_the_chosen_backend_validates_its_own_keys():
    # top_k: llamacpp allows 0 (off), litert needs at least 1.
    assert parse_config({"llm": {"backend": "llamacpp", "top_k": 0}}, env={}).llm.top_k == 0
    with pytest.raises(ConfigError, match=r"llm\.top_k: Input should be greater than 0"):
        parse_config({"llm": {"backend": "litert", "top_k": 0}}, env={})
    # Each backend's defaults show for its own keys.
    assert parse_config({"llm": {"backend": "llamacpp"}}, env={}).llm.top_p == 0.9
    assert parse_config({"llm": {"backend": "litert"}}, env={}).llm.top_p is None


def test_keys_of_another_backend_are_checked_and_ignored(real_stdin):
    config = parse_config(
        {"llm": {"backend": "scripted", "model": "m", "n_ctx": 512, "timeout": 5}}, env={}
    )
    registry = load_registry(config)
    backend = resolve_backend(config, registry)
    assert isinstance(backend, ScriptedModel) and backend.model == "m"
    assert ignored_settings(config, registry, "scripted") == ["n_ctx", "timeout"]
    with pytest.raises(ConfigError, match=r"llm\.n_ctx: Input should be a valid integer"):
        parse_config({"llm": {"backend": "scripted", "n_ctx": "big"}}, env={})


def test_llm_options_are_read_as_keys_of_the_table(tmp_path):
    config = parse_config(
        {"llm": {"backend": "llamacpp", "options": {"top_p": 0.5, "n_batch": 64}}}, env={}
    )
    assert config.llm.top_p == 0.5 and config.llm.n_batch == 64
    message = load_error(tmp_path, '[llm]\nbackend = "llamacpp"\n[llm.options]\nbogus = 1\n')
    assert "llm.options.bogus: unknown key" in message


class _EchoSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    greeting: str = "hello"
    loud: bool = False
    token: SecretStr | None = None
    notes: Annotated[str | None, FilePath()] = None


class _EchoBackend(ScriptedModel):
    name = "echo"
    settings_model = _EchoSettings

    def __init__(self, *, greeting: str, loud: bool, token: str | None, notes: str | None):
        super().__init__(model=greeting.upper() if loud else greeting)
        self.token, self.notes = token, notes


class _EchoPlugin:
    @hookimpl
    def register_llm_backends(self, register):
        register("echo", _EchoBackend)


def test_a_plugin_backend_gets_first_class_keys(tmp_path, capsys):
    """A third-party backend's keys are flat in [llm], validated by its model, errors
    name the file and the key, secrets stay secret, paths are relative to the file."""
    path = write(
        tmp_path,
        '[llm]\nbackend = "echo"\ngreeting = "hi"\nloud = true\ntoken = "${TOK}"\n'
        'notes = "notes.txt"\ntimeout = 5\n',
    )
    config = load_config(path, env={"TOK": SECRET})
    assert SECRET in config.secrets()
    registry = load_registry(config, (_EchoPlugin(),))
    backend = resolve_backend(config, registry)
    assert isinstance(backend, _EchoBackend) and backend.model == "HI"
    assert backend.token == SECRET
    assert backend.notes == str(tmp_path / "notes.txt")
    assert ignored_settings(config, registry, "echo") == ["timeout"]

    for text, key, what in [
        ('loud = "very"', "llm.loud", "valid boolean"),
        ("volume = 11", "llm.volume", "unknown key"),
    ]:
        path = write(tmp_path, f'[llm]\nbackend = "echo"\n{text}\n')
        config = load_config(path, env={})
        with pytest.raises(ConfigError) as info:
            resolve_backend(config, load_registry(config, (_EchoPlugin(),)))
        assert str(info.value).startswith(f"{path}: {key}: ") and what in str(info.value)


def test_check_shows_the_backend_settings_and_the_ignored_keys(tmp_path, capsys):
    path = write(
        tmp_path,
        '[llm]\nbackend = "scripted"\ncontext_window = 4096\nn_ctx = 512\n'
        '[storage]\npath = ":memory:"\n',
    )
    assert cli_main(["check", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "llm.scripted settings: supports_tools=True, context_window=4096" in out
    assert "llm: ignored (not keys of 'scripted'): n_ctx" in out


def test_transport_mcp_and_storage_sections_are_the_classes_they_configure():
    """[transports.*] bridge keys, [[mcp.servers]] and [storage] are declared once, by the
    part that uses them (the bridge's ChannelOptions, the core's MCPServerConfig and
    SQLiteSettings): a section that re-declares one of their keys fails here."""
    from agentik.bot.bridge import ChannelOptions
    from agentik.bot.config import (
        BRIDGE_NOT_KEYS,
        MCPSection,
        MCPServerSection,
        StorageSection,
    )
    from agentik.core import SQLiteStore
    from agentik.core.store.postgres import PostgresSettings, PostgresStore
    from agentik.core.store.sqlite import SQLiteSettings
    from agentik.core.tools.mcp import MCPServerConfig

    # [transports.<name>]: type and enabled, then exactly ChannelOptions's fields, each
    # with its type, default and limits (only command_prefix may be unset: the
    # transport's default).
    bridge = setting_fields(ChannelOptions)
    keys = dict(TransportSection.model_fields)
    assert list(keys)[:2] == ["type", "enabled"]
    assert set(keys) - {"type", "enabled"} == set(bridge) - BRIDGE_NOT_KEYS
    for name, info in bridge.items():
        if name in BRIDGE_NOT_KEYS:
            continue
        mine = keys[name]
        if name == "command_prefix":
            assert mine.annotation == info.annotation | None and mine.default is None
            continue
        assert (mine.annotation, mine.default, mine.metadata) == (
            info.annotation,
            info.default,
            info.metadata,
        ), name
    # [[mcp.servers]] is the core's class itself.
    assert MCPServerSection is MCPServerConfig
    assert MCPSection.model_fields["servers"].annotation == list[MCPServerConfig]
    # [storage] adds path and backend to the stores' own settings.
    assert issubclass(StorageSection, SQLiteSettings)
    assert issubclass(StorageSection, PostgresSettings)
    assert set(setting_fields(StorageSection)) == {
        "path",
        "backend",
        *setting_fields(SQLiteSettings),
        *setting_fields(PostgresSettings),
    }
    store = inspect.signature(SQLiteStore).parameters
    assert StorageSection().synchronous == store["synchronous"].default
    assert StorageSection().writer == store["writer"].default == "process"
    pg = inspect.signature(PostgresStore).parameters
    assert (StorageSection().pool_min, StorageSection().pool_max) == (
        pg["pool_min"].default,
        pg["pool_max"].default,
    )


def test_a_server_without_startup_takes_the_mcp_default():
    from agentik.bot.builder import mcp_toolset

    def states(table: dict) -> list[str]:
        toolset = mcp_toolset(parse_config({"mcp": table}, env={}))
        return [s["state"] for s in toolset.status()]  # not started: nothing connects

    servers = [
        {"name": "a", "command": "x"},
        {"name": "b", "command": "y", "startup": "eager"},
        {"name": "c", "command": "z", "startup": "lazy"},
    ]
    assert states({"startup": "lazy", "servers": servers}) == ["lazy", "starting", "lazy"]
    assert states({"servers": servers}) == ["starting", "starting", "lazy"]
