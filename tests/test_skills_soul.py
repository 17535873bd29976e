"""Soul (persona from a file or URL) and skills (loaded by the model on demand)."""

from __future__ import annotations

import pytest
from aiohttp import web

from agentik.bot.builder import AgentBuilder
from agentik.bot.config import parse_config
from agentik.core import ConfigError, SQLiteStore
from agentik.core.memory import NoMemory
from agentik.core.plugins import load_plugins
from agentik.core.skills import load_skills
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import ToolContext

from rigs import free_port

CTX = ToolContext(conversation_id="c", run_id="r", call_id="x")


def write_skills(root):
    (root / "release-notes").mkdir(parents=True)
    (root / "release-notes" / "SKILL.md").write_text(
        "---\nname: release-notes\ndescription: 'How to write release notes.'\n---\n"
        "Start with user-visible changes. Use template.md.\n"
    )
    (root / "release-notes" / "template.md").write_text("## Changes\n- ...\n")
    (root / "haiku.md").write_text(
        '---\nname: haiku\ndescription: "Answer in a haiku when asked."\n---\nFive, seven, five.\n'
    )
    (root / "README.md").write_text("not a skill\n")


async def test_skills_are_listed_and_loaded_on_demand(tmp_path):
    write_skills(tmp_path / "skills")
    skills = load_skills(tmp_path / "skills")
    assert sorted(skills.skills) == ["haiku", "release-notes"]
    prompt = skills.prompt()
    assert "- release-notes: How to write release notes." in prompt
    assert "- haiku: Answer in a haiku when asked." in prompt
    assert "Start with user-visible" not in prompt  # bodies stay out of the prompt
    (load,) = skills.tools()
    assert load.parameters["properties"]["name"]["enum"] == ["haiku", "release-notes"]
    body = await load.call({"name": "release-notes"}, CTX)
    assert body.startswith("Start with user-visible changes.")
    assert "[files in this skill: template.md]" in body
    assert (await load.call({"name": "release-notes", "file": "template.md"}, CTX)).startswith(
        "## Changes"
    )
    escape = await load.call({"name": "release-notes", "file": "../haiku.md"}, CTX)
    assert escape.is_error and "no file" in escape.text
    unknown = await load.call({"name": "nope"}, CTX)
    assert unknown.is_error and "haiku, release-notes" in unknown.text


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("no front matter\n", "no front matter"),
        ("---\nname: x\n", "not closed"),
        ("---\nname: x\n---\nbody", "key 'description' is missing"),
        ("---\nname: bad name!\ndescription: d\n---\n", "name 'bad name!'"),
        ("---\njust words\n---\n", "line 2: expected 'key: value'"),
    ],
)
def test_bad_skill_files_name_the_file_and_the_problem(tmp_path, content, error):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "SKILL.md").write_text(content)
    with pytest.raises(ConfigError, match=error) as info:
        load_skills(tmp_path)
    assert "SKILL.md" in str(info.value)


def test_duplicate_skill_names_and_missing_folder(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "SKILL.md").write_text("---\nname: same\ndescription: d\n---\n")
    with pytest.raises(ConfigError, match="'same' is also used by"):
        load_skills(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_skills(tmp_path / "missing")


async def test_config_soul_file_and_skills_reach_the_model(tmp_path):
    write_skills(tmp_path / "skills")
    (tmp_path / "SOUL.md").write_text("You are Ada, a terse engineer.\n")
    conf = tmp_path / "bot.toml"
    conf.write_text(
        '[agent]\nsystem_prompt = "Be helpful."\nsoul = "SOUL.md"\nskills = "skills"\n'
        '[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n'
    )
    from agentik.bot.config import load_config

    config = load_config(conf)
    agent = AgentBuilder.from_config(config, load_plugins()).build()
    model = agent.llm
    model.enqueue(Reply(tool_calls=[call("skill_load", {"name": "haiku"})]), "Old pond...")
    async with agent:
        conv = await agent.create_conversation()
        await conv.send("a poem please")
        await conv.wait_idle()
    system = model.requests[0].system
    assert system.startswith("Be helpful.\n\nYou are Ada, a terse engineer.\n\nYou have skills")
    assert "skill_load" in {t.name for t in model.requests[0].tools}
    tool_msg = [m for m in model.requests[1].messages if m.role == "tool"]
    assert tool_msg[-1].content == "Five, seven, five."


def test_config_skills_error_names_the_key(tmp_path):
    config = parse_config(
        {"agent": {"skills": str(tmp_path / "none")}, "llm": {"backend": "scripted"}}
    )
    with pytest.raises(ConfigError, match=r"agent\.skills: skills folder .* does not exist"):
        AgentBuilder.from_config(config, load_plugins())


@pytest.fixture
async def soul_server():
    hits = []

    async def soul(request):
        hits.append(request.path)
        return web.Response(text="You are Bo, cheerful.\n")

    app = web.Application()
    app.router.add_get("/soul.md", soul)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]  # the real port of port 0
    yield f"http://127.0.0.1:{port}", hits
    await runner.cleanup()


async def test_soul_from_a_url_is_fetched_at_start(tmp_path, soul_server):
    base, hits = soul_server
    model = ScriptedModel()
    agent = (
        AgentBuilder()
        .llm(model)
        .storage(SQLiteStore(str(tmp_path / "a.db")))
        .memory(NoMemory())
        .system_prompt("Base.")
        .soul(url=f"{base}/soul.md")
        .build()
    )
    async with agent:
        conv = await agent.create_conversation()
        await conv.send("hi")
        await conv.wait_idle()
    assert hits == ["/soul.md"]
    assert model.requests[0].system == "Base.\n\nYou are Bo, cheerful."


@pytest.mark.parametrize("path", ["/missing.md", None])
async def test_an_unreachable_soul_stops_start_up_naming_the_url(tmp_path, soul_server, path):
    base, _ = soul_server
    url = f"{base}{path}" if path else f"http://127.0.0.1:{free_port()}/soul.md"
    agent = (
        AgentBuilder()
        .llm(ScriptedModel())
        .storage(SQLiteStore(str(tmp_path / "a.db")))
        .memory(NoMemory())
        .soul(url=url)
        .build()
    )
    with pytest.raises(ConfigError, match=f"agent.soul: .*{url}") as info:
        await agent.start()
    if path:
        assert "HTTP 404" in str(info.value)
    await agent.aclose()


def test_soul_file_errors(tmp_path):
    (tmp_path / "bin.md").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        AgentBuilder().soul(file=tmp_path / "bin.md")
    (tmp_path / "big.md").write_text("x" * 300_000)
    with pytest.raises(ConfigError, match="larger than"):
        AgentBuilder().soul(file=tmp_path / "big.md")


async def test_skill_load_errors_name_what_was_asked_never_a_server_path(agent, scripted, tmp_path):
    # Issue 17 item 7: a symlink loop or a too-long name made skill_load's
    # exception (with the skills folder's absolute path) the model's tool result.
    root = tmp_path / "skills"
    write_skills(root)
    folder = root / "release-notes"
    (folder / "loop-a").symlink_to("loop-b")
    (folder / "loop-b").symlink_to("loop-a")
    (folder / "sub").mkdir()
    for t in load_skills(root).tools():
        agent.add_tool(t)
    asked = [
        {"name": "release-notes", "file": "../../../../etc/passwd"},
        {"name": "release-notes", "file": "/etc/passwd"},
        {"name": "release-notes", "file": "loop-a"},
        {"name": "release-notes", "file": "x" * 5000},
        {"name": "release-notes", "file": "nul\x00byte"},
        {"name": "release-notes", "file": "sub"},
        {"name": "../release-notes"},
        {"name": "haiku", "file": "template.md"},
    ]
    scripted.enqueue(
        Reply(tool_calls=[call("skill_load", args, id=f"c{i}") for i, args in enumerate(asked)]),
        "done",
    )
    conv = await agent.create_conversation()
    await conv.send("load things")
    await conv.wait_idle()
    by_id = {m.tool_call_id: m for m in scripted.requests[1].messages if m.role == "tool"}
    results = [by_id[f"c{i}"] for i in range(len(asked))]  # the calls ran concurrently
    for result in results:
        assert result.is_error, result.content
        assert str(tmp_path) not in result.content and str(root.resolve()) not in result.content
        for leak in ("Errno", "Symlink loop", "embedded null", "Traceback", "internal error"):
            assert leak not in result.content, result.content
        assert len(result.content) < 200
    texts = [r.content for r in results]
    assert texts[0] == "error: no file '../../../../etc/passwd' in skill 'release-notes'"
    assert texts[2] == "error: no file 'loop-a' in skill 'release-notes'"
    assert texts[3].startswith("error: no file 'xxxx") and texts[3].endswith(
        "…' in skill 'release-notes'"
    )
    assert texts[6] == "error: no such skill: '../release-notes' (skills: haiku, release-notes)"
    assert texts[7] == "error: this skill has no folder of files"
