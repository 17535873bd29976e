"""Read-only workspace tools (issue 35): ``read_file``, ``list_dir``, ``glob``, ``grep``
over the folders of ``[workspace] folders``, in a sandbox.

The model names a file as ``<folder>/<path>``, ``<folder>`` being the last part of a
configured folder's path (``list_dir`` with no path lists them).  What it gives is
hostile until checked:

* the path is text: no NUL, not absolute, no ``..`` component, bounded length;
* it is resolved (:func:`os.path.realpath`) and must stay inside its folder
  (:func:`os.path.commonpath`): a symbolic link inside the folder may point elsewhere
  inside it, never out;
* then it is *opened* component by component from the folder's own descriptor with
  ``O_NOFOLLOW`` (``openat``-style, ``dir_fd``), so a link swapped in between the
  check and the open (a TOCTOU race) fails instead of being followed;
* only regular files and folders are used: a device, FIFO or socket is refused
  before it is opened (``fstatat`` without following) and checked again on the open
  descriptor (``fstat``); opens are ``O_NONBLOCK`` (a FIFO never blocks the tool);
* walks (``glob``, ``grep``, ``list_dir``) never follow a symbolic link (no loops) and
  stop at ``max_depth``; every answer is capped (``max_results``, ``max_read_chars``);
  a file over ``max_file_bytes`` is refused (``grep`` skips it and says so); a file
  with a NUL byte or invalid UTF-8 is binary and refused (skipped by ``grep``);
* a folder inside ``/proc``, ``/sys`` or ``/dev`` (or ``/`` itself) is refused when
  the configuration is read.

Disk work runs in a worker thread: the event loop never waits on the disk.
There is no write or shell tool: see ``docs/workspace.md`` for why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from ..errors import ConfigError, ToolError
from ..settings import empty_list, settings_dataclass
from .base import ToolContext, ToolResult

__all__ = ["WORKSPACE_TOOLS", "Workspace", "WorkspaceSettings", "workspace_tools"]

#: The tools' names (``[tools] allowed`` and a channel's ``tools`` select among them).
WORKSPACE_TOOLS = ("read_file", "list_dir", "glob", "grep")
#: Folders no workspace may be in (kernel views: files that are not files).
_FORBIDDEN_TREES = ("/proc", "/sys", "/dev")
_MAX_PATH = 4096
_MAX_PATTERN = 300
#: Bytes read to decide whether a file is text.
_SNIFF = 8192
#: A grep line longer than this is cut before matching (bounds the regex's work).
_MAX_LINE = 2000


@settings_dataclass
class WorkspaceSettings:
    """``[workspace]``: folders the model may read with ``read_file``, ``list_dir``,
    ``glob`` and ``grep`` (none: the tools are not offered)."""

    #: Folders to read (relative to the configuration file); each is named to the
    #: model by its last path component (``/srv/repo`` → ``repo/…``).
    folders: list[str] = Field(default_factory=empty_list)
    #: A file larger than this many bytes is refused (``grep`` skips it).
    max_file_bytes: Annotated[int, Field(ge=1, le=1_000_000_000)] = 1_000_000
    #: Characters of one ``read_file`` answer at most (the rest: ask with ``offset``).
    max_read_chars: Annotated[int, Field(ge=100, le=1_000_000)] = 50_000
    #: Entries, paths or matching lines in one answer at most.
    max_results: Annotated[int, Field(ge=1, le=100_000)] = 500
    #: Folder levels a walk (``glob``, ``grep``) goes down at most.
    max_depth: Annotated[int, Field(ge=1, le=256)] = 20
    #: Bytes one ``grep`` reads at most, over all the files it searches.
    max_grep_bytes: Annotated[int, Field(ge=1, le=10_000_000_000)] = 50_000_000


@dataclass(frozen=True, slots=True)
class _Root:
    name: str
    #: The folder's real path (symbolic links resolved when configured).
    real: str


class Workspace:
    """The sandbox: configured folders and the checked ways to read them."""

    def __init__(self, settings: WorkspaceSettings, *, resolve: Any = None) -> None:
        self.settings = settings
        self.roots: dict[str, _Root] = {}
        for i, folder in enumerate(settings.folders):
            where = f"workspace.folders[{i}]"
            if "\x00" in folder or not folder:
                raise ConfigError(f"{where}: not a folder path")
            path = resolve(folder) if resolve is not None else folder
            real = os.path.realpath(path)
            if real == "/" or any(real == t or real.startswith(t + "/") for t in _FORBIDDEN_TREES):
                raise ConfigError(f"{where}: {real} cannot be a workspace (/, /proc, /sys, /dev)")
            if not os.path.isdir(real):
                raise ConfigError(f"{where}: {path}: no such folder")
            name = os.path.basename(real)
            if name in self.roots:
                raise ConfigError(
                    f"{where}: two folders are named {name!r} (the model tells them apart"
                    " by their last path component)"
                )
            self.roots[name] = _Root(name, real)

    # -- paths ----------------------------------------------------------------------------
    def _split(self, path: str, *, allow_empty: bool = False) -> tuple[_Root | None, list[str]]:
        """The root and the components of the model's ``path``, checked as text."""
        if not isinstance(path, str):
            raise ToolError("path must be a string")
        if "\x00" in path:
            raise ToolError("refused: the path contains a NUL character")
        if len(path) > _MAX_PATH:
            raise ToolError(f"refused: the path is longer than {_MAX_PATH} characters")
        if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
            raise ToolError(
                f"refused: {path!r} is absolute; paths are <folder>/<path> within the"
                f" workspace ({self._names()})"
            )
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolError(f"refused: {path!r} goes up ('..'); stay inside the workspace")
        if not parts:
            if allow_empty:
                return None, []
            raise ToolError(f"give a path: <folder>/<path> ({self._names()})")
        root = self.roots.get(parts[0])
        if root is None:
            raise ToolError(f"no workspace folder {parts[0]!r} (folders: {self._names()})")
        return root, parts[1:]

    def _names(self) -> str:
        return ", ".join(sorted(self.roots)) or "none"

    def _confined(self, root: _Root, parts: list[str], shown: str) -> list[str]:
        """The components, below ``root``, of the real path ``parts`` names; refused if
        it resolves outside the root (a symbolic link pointing out)."""
        real = os.path.realpath(os.path.join(root.real, *parts))
        if os.path.commonpath([real, root.real]) != root.real:
            raise ToolError(f"refused: {shown!r} leads outside the workspace (a symbolic link)")
        rel = os.path.relpath(real, root.real)
        return [] if rel == "." else rel.split(os.sep)

    @contextlib.contextmanager
    def _open(self, path: str, *, want: str) -> Iterator[tuple[int, os.stat_result, str]]:
        """Open the model's ``path`` (``want``: ``file`` or ``dir``) without following a
        link at any step; yields ``(fd, stat, shown path)``."""
        root, parts = self._split(path, allow_empty=False)
        assert root is not None
        real_parts = self._confined(root, parts, path)
        shown = "/".join([root.name, *parts])
        fd = os.open(root.real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(real_parts):
                last = i == len(real_parts) - 1
                try:
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise ToolError(f"{shown}: no such file or folder") from None
                except OSError as exc:
                    raise ToolError(f"{shown}: cannot read it ({exc.strerror})") from None
                _check_kind(st, shown)
                if not last and not stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{shown}: not found (a part of it is not a folder)")
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                if not last or stat.S_ISDIR(st.st_mode):
                    flags |= os.O_DIRECTORY
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    # ELOOP: a symbolic link was swapped in since the check.
                    raise ToolError(f"{shown}: refused ({exc.strerror})") from None
                os.close(fd)
                fd = nxt
            st = os.fstat(fd)
            _check_kind(st, shown)
            if want == "file" and not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{shown}: a folder, not a file (list_dir lists it)")
            if want == "dir" and not stat.S_ISDIR(st.st_mode):
                raise ToolError(f"{shown}: a file, not a folder (read_file reads it)")
            yield fd, st, shown
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the tools' work (in a worker thread) ---------------------------------------------
    def read_file(self, path: str, offset: int = 1, limit: int | None = None) -> str:
        s = self.settings
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise ToolError("offset: the first line to read, a whole number from 1")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ToolError("limit: how many lines to read, a whole number from 1")
        with self._open(path, want="file") as (fd, st, shown):
            if st.st_size > s.max_file_bytes:
                raise ToolError(
                    f"{shown}: refused: {st.st_size:,} bytes, over the limit of"
                    f" {s.max_file_bytes:,} ([workspace] max_file_bytes)"
                )
            data = _read_all(fd, s.max_file_bytes + 1)
        if len(data) > s.max_file_bytes:  # it grew since fstat
            raise ToolError(f"{shown}: refused: over the limit of {s.max_file_bytes:,} bytes")
        text = _text(data)
        if text is None:
            raise ToolError(f"{shown}: refused: a binary file (not UTF-8 text)")
        lines = text.splitlines(keepends=True)
        start = max(1, offset)
        end = len(lines) if limit is None else min(len(lines), start - 1 + max(0, limit))
        out: list[str] = []
        size = 0
        for n in range(start, end + 1):
            line = lines[n - 1]
            if size + len(line) > s.max_read_chars:
                out.append(f"[… cut at {s.max_read_chars:,} characters: read on with offset={n}]\n")
                break
            out.append(line)
            size += len(line)
        header = f"{shown} (lines {start}-{end} of {len(lines)})\n"
        return header + "".join(out)

    def list_dir(self, path: str = "") -> str:
        root, _ = self._split(path, allow_empty=True)
        if root is None:
            return "workspace folders:\n" + "".join(f"{n}/\n" for n in sorted(self.roots))
        with self._open(path, want="dir") as (fd, _st, shown):
            entries = sorted(_entries(fd), key=lambda e: e[0])
        cap = self.settings.max_results
        lines = [f"{name}{_suffix(kind)}" for name, kind, _size in entries[:cap]]
        more = f"\n[… {len(entries) - cap} more entries not shown]" if len(entries) > cap else ""
        return f"{shown}/ ({len(entries)} entries)\n" + "\n".join(lines) + more

    def glob(self, pattern: str) -> str:
        if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_PATTERN:
            raise ToolError(f"give a pattern of 1 to {_MAX_PATTERN} characters")
        root, parts = self._split(pattern)
        assert root is not None
        if not parts:
            raise ToolError("give a pattern below a folder: <folder>/**/*.py")
        regex = _glob_regex("/".join(parts))
        cap = self.settings.max_results
        found: list[str] = []
        more = False
        for rel, kind, _fd in self._walk(root):
            if regex.match(rel):
                if len(found) >= cap:
                    more = True
                    break
                found.append(f"{root.name}/{rel}{_suffix(kind)}")
        if not found:
            return f"no path matches {pattern!r}"
        tail = f"\n[… more matches not shown (limit {cap})]" if more else ""
        return "\n".join(found) + tail

    def grep(
        self, pattern: str, path: str = "", include: str | None = None, ignore_case: bool = False
    ) -> str:
        if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_PATTERN:
            raise ToolError(f"give a regular expression of 1 to {_MAX_PATTERN} characters")
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ToolError(f"not a regular expression (Python syntax): {exc}") from None
        name_filter = _glob_regex(include) if include else None
        root, parts = self._split(path, allow_empty=True)
        roots = [root] if root is not None else [self.roots[n] for n in sorted(self.roots)]
        s = self.settings
        if root is not None and parts:
            with self._open(path, want="any") as (fd, st, shown):
                if stat.S_ISREG(st.st_mode):
                    return self._grep_one(fd, st, shown, regex)
        hits: list[str] = []
        skipped_big = skipped_binary = 0
        budget = s.max_grep_bytes
        more = False
        for r in roots:
            below = self._confined(r, parts, path) if root is not None else []
            for rel, kind, fd_info in self._walk(r, below):
                if kind != "file":
                    continue
                if name_filter is not None and not name_filter.match(rel.rsplit("/", 1)[-1]):
                    continue
                dir_fd, entry_name, size = fd_info
                if size > s.max_file_bytes:
                    skipped_big += 1
                    continue
                if size > budget:
                    more = True
                    break
                data = _read_at(dir_fd, entry_name, s.max_file_bytes)
                if data is None:
                    continue
                budget -= len(data)
                text = _text(data)
                if text is None:
                    skipped_binary += 1
                    continue
                for n, line in enumerate(text.splitlines(), 1):
                    if regex.search(line[:_MAX_LINE]):
                        if len(hits) >= s.max_results:
                            more = True
                            break
                        shown = line if len(line) <= 300 else line[:300] + "…"
                        hits.append(f"{r.name}/{rel}:{n}: {shown}")
                if more:
                    break
            if more:
                break
        notes = []
        if more:
            notes.append(
                f"[… stopped: limit of {s.max_results} lines or {s.max_grep_bytes:,} bytes]"
            )
        if skipped_big:
            notes.append(f"[{skipped_big} file(s) over {s.max_file_bytes:,} bytes skipped]")
        if skipped_binary:
            notes.append(f"[{skipped_binary} binary file(s) skipped]")
        body = "\n".join(hits) if hits else f"no line matches {pattern!r}"
        return "\n".join([body, *notes])

    def _grep_one(self, fd: int, st: os.stat_result, shown: str, regex: re.Pattern[str]) -> str:
        s = self.settings
        if st.st_size > s.max_file_bytes:
            raise ToolError(f"{shown}: refused: {st.st_size:,} bytes, over the limit of"
                            f" {s.max_file_bytes:,} ([workspace] max_file_bytes)")  # fmt: skip
        text = _text(_read_all(fd, s.max_file_bytes))
        if text is None:
            raise ToolError(f"{shown}: refused: a binary file (not UTF-8 text)")
        hits: list[str] = []
        for n, line in enumerate(text.splitlines(), 1):
            if regex.search(line[:_MAX_LINE]):
                if len(hits) >= s.max_results:
                    hits.append(f"[… stopped: limit of {s.max_results} lines]")
                    break
                hits.append(f"{shown}:{n}: {line if len(line) <= 300 else line[:300] + '…'}")
        return "\n".join(hits) if hits else f"no line matches {regex.pattern!r}"

    def _walk(
        self, root: _Root, below: list[str] | None = None
    ) -> Iterator[tuple[str, str, tuple[int, str, int]]]:
        """``(path below root, kind, (dir fd, name, size))`` of every entry under
        ``below``, depth first, sorted, never through a symbolic link."""
        start = "/".join(below or [])
        if start:
            with self._open(f"{root.name}/{start}", want="dir") as (fd, _st, _shown):
                yield from self._walk_fd(os.dup(fd), start, 0)
        else:
            fd = os.open(root.real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            yield from self._walk_fd(fd, "", 0)

    def _walk_fd(
        self, fd: int, prefix: str, depth: int
    ) -> Iterator[tuple[str, str, tuple[int, str, int]]]:
        try:
            for name, kind, size in sorted(_entries(fd)):
                rel = f"{prefix}/{name}" if prefix else name
                yield rel, kind, (fd, name, size)
                if kind == "dir" and depth + 1 < self.settings.max_depth:
                    try:
                        sub = os.open(
                            name,
                            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=fd,
                        )
                    except OSError:
                        continue  # gone, swapped for a link, or unreadable
                    yield from self._walk_fd(sub, rel, depth + 1)
        finally:
            os.close(fd)


def _check_kind(st: os.stat_result, shown: str) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise ToolError(
            f"{shown}: refused: a symbolic link that leads nowhere inside the workspace"
            " (a loop, or changed while it was opened)"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"
        )  # fmt: skip
        raise ToolError(f"{shown}: refused: {kind} (only regular files and folders are read)")


def _entries(fd: int) -> list[tuple[str, str, int]]:
    """``(name, kind, size)`` of a folder's entries (kind: file, dir, link, other),
    without following links."""
    out = []
    with os.scandir(fd) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            kind = (
                "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode)
                else "file" if stat.S_ISREG(mode) else "other"
            )  # fmt: skip
            out.append((e.name, kind, st.st_size))
    return out


def _suffix(kind: str) -> str:
    return {"dir": "/", "link": " (symbolic link)", "other": " (special file)"}.get(kind, "")


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _read_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's bytes (at most ``limit``), opened without following a link;
    ``None`` if it is not a regular file any more."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _read_all(fd, limit)
    finally:
        os.close(fd)


def _text(data: bytes) -> str | None:
    """``data`` as text, or ``None`` if it is binary (a NUL byte, or not UTF-8)."""
    if b"\x00" in data[:_SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob (``*``, ``?``, ``[…]``, ``**`` for any number of folders) as a regex over
    ``/``-separated paths."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error:
        raise ToolError(f"not a glob pattern: {pattern!r}") from None


# -- the tools ------------------------------------------------------------------------------
class _WorkspaceTool:
    """One of the four tools: its work runs in a worker thread."""

    def __init__(self, workspace: Workspace, name: str, description: str,
                 parameters: dict[str, Any]) -> None:  # fmt: skip
        self.workspace = workspace
        self.name = name
        self.description = description
        self.parameters = parameters

    def __repr__(self) -> str:
        return f"<workspace tool {self.name}>"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        fn = getattr(self.workspace, self.name)
        try:
            return str(await asyncio.to_thread(fn, **arguments))
        except TypeError:
            raise ToolError(f"{self.name}: unexpected arguments {sorted(arguments)}") from None
        except OSError as exc:
            raise ToolError(f"{self.name}: cannot read it ({exc.strerror or 'error'})") from None


def workspace_tools(workspace: Workspace) -> list[Any]:
    """``read_file``, ``list_dir``, ``glob`` and ``grep`` over ``workspace``."""
    names = workspace._names()
    path = {"type": "string", "description": f"<folder>/<path>; folders: {names}"}
    return [
        _WorkspaceTool(
            workspace, "read_file",
            "Read a text file of the workspace (read-only), with line numbers range.",
            {"type": "object", "properties": {
                "path": path,
                "offset": {"type": "integer", "minimum": 1, "description": "first line (1)"},
                "limit": {"type": "integer", "minimum": 1, "description": "lines at most"},
            }, "required": ["path"], "additionalProperties": False},
        ),
        _WorkspaceTool(
            workspace, "list_dir",
            "List a folder of the workspace (read-only); no path: the workspace folders.",
            {"type": "object", "properties": {"path": path}, "additionalProperties": False},
        ),
        _WorkspaceTool(
            workspace, "glob",
            "Find workspace paths matching a glob: <folder>/**/*.py (* ? [..] **).",
            {"type": "object", "properties": {"pattern": {"type": "string"}},
             "required": ["pattern"], "additionalProperties": False},
        ),
        _WorkspaceTool(
            workspace, "grep",
            "Search workspace text files for a regular expression (Python syntax); lines"
            " as <path>:<line>: <text>.",
            {"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {**path, "description": "a folder or file to search (default: all)"},
                "include": {"type": "string", "description": "file name glob, e.g. *.py"},
                "ignore_case": {"type": "boolean"},
            }, "required": ["pattern"], "additionalProperties": False},
        ),
    ]  # fmt: skip
