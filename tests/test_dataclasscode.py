"""The dataclass method cache (agentik.core.dataclasscode): the next start reuses the
methods compiled at the last one, and the classes behave exactly as without it.

Each case runs fresh interpreters with their own bytecode cache folder
(``PYTHONPYCACHEPREFIX``), the way a started bot does: one without the cache, one that
fills it, one that reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentik.core import dataclasscode

pytestmark = pytest.mark.skipif(
    not dataclasscode.ENABLED, reason="Python 3.13+ compiles a class's methods in one call"
)

# Counts the calls of compile() made while builtins.compile is counting_compile.
_COUNTING = r"""
import builtins

compiled = 0
real_compile = builtins.compile
def counting_compile(*args, **kwargs):
    global compiled
    compiled += 1
    return real_compile(*args, **kwargs)
"""

# Defines dataclasses of every kind agentik uses inside the block, and prints what a
# user of them can observe, with how many methods were compiled inside the block.
_SCRIPT = (
    _COUNTING
    + r"""
import builtins, dataclasses, json, pickle, sys
from typing import Annotated
import pydantic
from agentik.core.dataclasscode import cache_path, dataclass_code_cached

FIELDS = sys.argv[1].split(",")

builtins.compile = counting_compile
with dataclass_code_cached():
    inside = "exec" in vars(dataclasses)

    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Event:
        kind: str
        seq: int = 0
        tags: tuple[str, ...] = ()

    @dataclasses.dataclass(order=True)
    class Point:
        x: int
        y: int = 2
        items: list[int] = dataclasses.field(default_factory=list)

    Dynamic = dataclasses.make_dataclass("Dynamic", [(f, int) for f in FIELDS], frozen=True)

    @pydantic.dataclasses.dataclass(frozen=True, kw_only=True)
    class Settings:
        limit: Annotated[int, pydantic.Field(ge=1)] = 5
builtins.compile = real_compile

out = {"inside": inside, "after": "exec" in vars(dataclasses), "compiled": compiled}
e = Event(kind="text", seq=3, tags=("a",))
same = Event(kind="text", seq=3, tags=("a",))
out["event"] = [repr(e), e == same, hash(e) == hash(same),
                repr(dataclasses.replace(e, seq=4)), pickle.loads(pickle.dumps(e)) == e]
try:
    e.seq = 9
except dataclasses.FrozenInstanceError as exc:
    out["frozen"] = str(exc)
try:
    Event("text")
except TypeError as exc:
    out["kw_only"] = str(exc)
p = Point(1)
p.items.append(1)
out["point"] = [repr(p), Point(1) < Point(2), Point(1).items is not Point(1).items,
                sorted(Point.__init__.__annotations__.items(), key=str).__repr__()]
out["dynamic"] = repr(Dynamic(*range(len(FIELDS))))
out["settings"] = repr(Settings(limit=2))
try:
    Settings(limit=0)
except pydantic.ValidationError as exc:
    out["invalid"] = exc.errors()[0]["type"]
out["path"] = cache_path()
print(json.dumps(out))
"""
)


def _run(
    folder: Path, fields: str = "a,b", *, write: bool = True, script: str = _SCRIPT
) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script, fields],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _observed(result: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in result.items() if k not in ("compiled",)}


def test_the_next_start_reuses_the_methods_and_the_classes_behave_the_same(tmp_path):
    without = _run(tmp_path / "a", write=False)  # never writes: compiled every time
    cold = _run(tmp_path / "b")
    path = Path(str(cold["path"]))
    assert path.is_file(), "the first start writes the cache"
    assert str(path).startswith(str(tmp_path / "b" / "pycache")), "beside the bytecode"
    written = path.stat().st_mtime_ns
    warm = _run(tmp_path / "b")

    assert without["compiled"] and cold["compiled"], "both compile the methods"
    assert warm["compiled"] == 0, "the next start compiles none of them"
    assert path.stat().st_mtime_ns == written, "nothing new: the file is not rewritten"
    assert not Path(str(without["path"])).exists(), "PYTHONDONTWRITEBYTECODE writes nothing"
    assert _observed(cold) == _observed(warm)
    assert {**_observed(without), "path": None} == {**_observed(warm), "path": None}
    assert warm["inside"] is True and warm["after"] is False, "dataclasses is left as it was"
    assert warm["event"] == [
        "Event(kind='text', seq=3, tags=('a',))",
        True,
        True,
        "Event(kind='text', seq=4, tags=('a',))",
        True,
    ]
    assert warm["frozen"] == "cannot assign to field 'seq'"
    assert "positional" in str(warm["kw_only"])
    # Annotations stay objects: the cache never compiles with this module's future flags.
    assert "<class 'int'>" in str(warm["point"])
    assert warm["invalid"] == "greater_than_equal"


def test_a_class_whose_fields_change_gets_its_new_methods(tmp_path):
    first = _run(tmp_path, "a,b")
    changed = _run(tmp_path, "a,b,c")
    again = _run(tmp_path, "a,b,c")
    assert first["dynamic"] == "Dynamic(a=0, b=1)"
    assert changed["dynamic"] == "Dynamic(a=0, b=1, c=2)"
    assert changed["compiled"], "a new source is compiled"
    assert again["compiled"] == 0 and again["dynamic"] == changed["dynamic"]
    # Two programs with different classes (`agentik check`, `agentik run`) share the
    # file: neither drops what the other compiled.
    back = _run(tmp_path, "a,b")
    assert back["compiled"] == 0 and back["dynamic"] == first["dynamic"]


def test_an_unreadable_or_foreign_cache_file_is_ignored_and_replaced(tmp_path):
    path = Path(str(_run(tmp_path)["path"]))
    for junk in (b"", b"not a cache at all", path.read_bytes()[:-100], b"\x00" * 64):
        path.write_bytes(junk)
        result = _run(tmp_path)
        assert result["compiled"], "nothing usable was read: compiled afresh"
        assert result["event"][0] == "Event(kind='text', seq=3, tags=('a',))"
        assert _run(tmp_path)["compiled"] == 0, "and the file was replaced by a good one"


# Two blocks one after the other, as a bot runs them (its imports, then its build); the
# second defines a class the first start did not have when ``sys.argv[1]`` says so.
_TWO_BLOCKS = (
    _COUNTING
    + r"""
import builtins, dataclasses, json, sys
from agentik.core import dataclasscode
from agentik.core.dataclasscode import dataclass_code_cached

builtins.compile = counting_compile

def held():  # code objects the cache itself holds (the methods hold their own)
    cache = dataclasscode._cache
    return len(cache.used) + len(cache.known or {})

with dataclass_code_cached():
    First = dataclasses.make_dataclass("First", [("a", int), ("b", str)], frozen=True)
between = held()
with dataclass_code_cached():
    fields = [("x", int)] + ([("y", int)] if sys.argv[1] == "new" else [])
    Second = dataclasses.make_dataclass("Second", fields, order=True)
builtins.compile = real_compile
print(json.dumps({"compiled": compiled, "held_between": between, "held_after": held(),
                  "first": repr(First(1, "b")), "second": repr(Second(*range(len(fields)))),
                  "ordered": Second(*[0] * len(fields)) < Second(*[1] * len(fields))}))
"""
)


def _run_two(folder: Path, second: str) -> dict[str, object]:
    return _run(folder, second, script=_TWO_BLOCKS)


def test_the_code_objects_are_let_go_between_blocks_and_the_file_keeps_both(tmp_path):
    cold = _run_two(tmp_path, "old")
    warm = _run_two(tmp_path, "old")
    assert cold["compiled"] and warm["compiled"] == 0, "both blocks read the file"
    for run in (cold, warm):
        # Nothing holds the cache's code objects once a block is over: only the methods.
        assert run["held_between"] == 0 and run["held_after"] == 0, run
        assert run["first"] == "First(a=1, b='b')" and run["ordered"] is True
    # The second block compiles a class the file does not have: the file it writes keeps
    # the first block's methods too (read back, not held), so the next start compiles none.
    grown = _run_two(tmp_path, "new")
    assert grown["compiled"], "the new class's methods are compiled"
    assert grown["second"] == "Second(x=0, y=1)"
    assert _run_two(tmp_path, "new")["compiled"] == 0
    assert _run_two(tmp_path, "old")["compiled"] == 0, "the old second class is kept too"
