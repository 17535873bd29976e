"""Skills: instructions the model loads when it needs them.

A skills folder holds one sub-folder per skill with a ``SKILL.md`` file
(``<folder>/<skill>/SKILL.md``; a ``<folder>/SKILL.md`` or loose
``<folder>/<name>.md`` with front matter also works)::

    ---
    name: release-notes
    description: How to write release notes for our projects.
    ---
    Start with the user-visible changes ...

Only the names and descriptions go into the system prompt
(:meth:`SkillSet.prompt`); the model reads a skill's body, or another file
of the skill's folder, with the ``skill_load`` tool.  Front matter is a
small ``key: value`` subset of YAML (quotes optional); ``name`` and
``description`` are required.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .tools.base import ToolContext, ToolResult

__all__ = ["Skill", "SkillSet", "load_skills", "parse_front_matter"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Largest file ``skill_load`` returns (characters).
MAX_SKILL_CHARS = 64_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Skill:
    name: str
    description: str
    path: Path
    body: str

    @property
    def folder(self) -> Path:
        return self.path.parent


def parse_front_matter(text: str, *, where: str) -> tuple[dict[str, str], str]:
    """``(fields, body)`` of a Markdown file starting with ``---`` front matter."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{where}: no front matter (the file must start with a '---' line)")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise ConfigError(f"{where}: front matter is not closed by a '---' line") from None
    fields: dict[str, str] = {}
    for n, line in enumerate(lines[1:end], 2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or key != key.strip():
            raise ConfigError(f"{where}: line {n}: expected 'key: value', got {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        fields[key.strip()] = value
    return fields, "\n".join(lines[end + 1 :]).strip()


def _load_one(path: Path) -> Skill:
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    fields, body = parse_front_matter(text, where=where)
    for key in ("name", "description"):
        if not fields.get(key):
            raise ConfigError(f"{where}: front matter key {key!r} is missing")
    name = fields["name"]
    if not _NAME.match(name):
        raise ConfigError(
            f"{where}: name {name!r}: use letters, digits, '-', '_' or '.' (at most 64)"
        )
    return Skill(
        name=name, description=" ".join(fields["description"].split()), path=path, body=body
    )


def load_skills(folder: str | os.PathLike[str]) -> SkillSet:
    """Load every skill under ``folder``; errors name the file and the key."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"skills folder {str(root)!r} does not exist")
    paths = sorted(root.glob("*/SKILL.md"))
    paths += [p for p in sorted(root.glob("*.md")) if p.name != "README.md"]
    skills: dict[str, Skill] = {}
    for path in paths:
        skill = _load_one(path)
        if skill.name in skills:
            raise ConfigError(
                f"{path}: skill name {skill.name!r} is also used by {skills[skill.name].path}"
            )
        skills[skill.name] = skill
    return SkillSet(list(skills.values()))


class SkillSet:
    """Loaded skills: a system-prompt section and the ``skill_load`` tool."""

    def __init__(self, skills: list[Skill]) -> None:
        self.skills = {s.name: s for s in skills}

    def __len__(self) -> int:
        return len(self.skills)

    def prompt(self) -> str | None:
        """The system-prompt section listing the skills (``None`` if none)."""
        if not self.skills:
            return None
        lines = [
            "You have skills: instructions for particular tasks. When a request matches a "
            "skill's description, call skill_load with its name and follow what it says.",
            "",
        ]
        lines += [f"- {s.name}: {s.description}" for s in self.skills.values()]
        return "\n".join(lines)

    def tools(self) -> list[Any]:
        return [_SkillLoad(self)] if self.skills else []


class _SkillLoad:
    name = "skill_load"
    description = (
        "Load a skill's instructions by name (see the skills listed in the system prompt); "
        "with 'file', read another file of that skill's folder."
    )

    def __init__(self, skills: SkillSet) -> None:
        self.skills = skills
        self.parameters = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": sorted(skills.skills)},
                "file": {
                    "type": "string",
                    "description": "A file in the skill's folder, e.g. 'template.md'.",
                },
            },
            "required": ["name"],
        }

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        # Errors name what the model asked for, never a path on this machine.
        name = str(arguments.get("name") or "")
        skill = self.skills.skills.get(name)
        if skill is None:
            known = ", ".join(sorted(self.skills.skills))
            return ToolResult(
                text=f"error: no such skill: {_shown(name)} (skills: {known})", is_error=True
            )
        file = arguments.get("file")
        if not file:
            others = sorted(
                str(p.relative_to(skill.folder))
                for p in skill.folder.rglob("*")
                if p.is_file() and p != skill.path and skill.path.name == "SKILL.md"
            )
            extra = f"\n\n[files in this skill: {', '.join(others)}]" if others else ""
            return skill.body + extra
        if skill.path.name != "SKILL.md":
            return ToolResult(text="error: this skill has no folder of files", is_error=True)
        missing = ToolResult(
            text=f"error: no file {_shown(str(file))} in skill {name!r}", is_error=True
        )
        try:
            # An impossible name (NUL byte, too long, a symlink loop) is no file either.
            target = (skill.folder / str(file)).resolve()
            if not target.is_relative_to(skill.folder.resolve()) or not target.is_file():
                return missing
        except (OSError, ValueError, RuntimeError) as exc:
            log.info("skill_load %s %r: %s", name, str(file)[:200], exc)
            return missing
        try:
            text = await asyncio.to_thread(target.read_text, encoding="utf-8", errors="replace")
        except OSError as exc:
            log.warning("skill_load %s: cannot read %s: %s", name, target, exc)
            return ToolResult(
                text=f"error: cannot read {_shown(str(file))} of skill {name!r}", is_error=True
            )
        if len(text) > MAX_SKILL_CHARS:
            text = text[:MAX_SKILL_CHARS] + f"\n[… cut: {len(text)} characters in all]"
        return text


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
