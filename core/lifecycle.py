"""The data lifecycle of conversations: retention, and checkpoint/resume snapshots.

**Retention** (:class:`RetentionSettings`, ``[retention]`` in the configuration):
rules by channel-key pattern keep a conversation's audit-log messages
``keep_days`` days, then ``delete`` them or ``summarise`` them (the model
summarises the old span; one summary message replaces it in the audit log
and in working memory).  A cut falls only where a turn starts (a user
message), so a tool call is never separated from its result, and a turn
still waiting for its answer is never pruned.  This is the one path that
deletes audit-log rows of a living conversation; it runs with SQLite's
``secure_delete`` so the pruned text is overwritten in the file.  Working
memory entries covering the pruned rows are replaced by one ``system`` entry
(the summary, or a notice in ``delete`` mode) that keeps the highest pruned
id, exactly like a compaction summary, so resume and compaction keep working.
Long-term memory notes are not touched.

:func:`plan_retention` lists what would go (``agentik db prune --dry-run``);
:func:`apply_retention` does it.  :class:`RetentionWorker` runs it in a bot:
at start-up, then after every ``every_turns`` finished turns (driven by the
agent's ``turn_ended`` events), and at the latest ``interval_hours`` after
the last run, so a quiet bot still prunes.

**Snapshots**: :func:`export_conversation` produces a versioned,
self-contained JSON document (``format: "agentik.conversation"``,
``version: 1``): the conversation record, the audit log, working memory,
channel bindings, turn ends, approvals, questions, (when the store has a
``run`` table) the run tree and the checklist (``todo``: the ``todo`` tool's
last list, or ``null``; optional, so a snapshot without it still imports).
:func:`import_conversation` validates one (errors name the field) and
restores it into a store, under the same id or a new one; audit-log ids
are renumbered on the way in (they are global to a database) and working
memory is relinked to the new ids.  A snapshot is untrusted input, whoever
imports it: nothing in it grants anything (authors become the label
``data.imported_author_id``, approvals history in the ``imported:`` scope that
never counts as a use, every open turn is ended ``imported`` so no restart
resumes it, pending questions expire, open runs end, run-tree links become the
label ``meta.imported_links``, and ``meta.channel_key`` names only a restored
binding).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import Field

from .attachments import check, drop_unreferenced, sha256_of
from .cluster.jobs import next_interval, own_slot, run_once, startup_slot
from .compaction import SUMMARY_PREFIX, ask
from .errors import AttachmentRejected
from .questions import MAX_TODO_ITEMS, MAX_TODO_TEXT, TODO_STATUSES
from .settings import empty_list, settings_dataclass
from .store.records import A2ATaskRecord
from .store.snapshot import (
    DELETED_NOTICE,
    IMPORTED,
    IMPORTED_SCOPE,
    RETENTION_AUTHOR,
    ImportResult,
    SnapshotError,
    SnapshotParts,
)
from .store.sqlite_lifecycle import Reader

__all__ = [
    "DELETED_NOTICE",
    "IMPORTED",
    "IMPORTED_SCOPE",
    "MAX_A2A_TASK_BYTES",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CHECKPOINT_LABEL",
    "MAX_SNAPSHOT_A2A_TASKS",
    "MAX_SNAPSHOT_CHECKPOINTS",
    "RETENTION_AUTHOR",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION",
    "ImportResult",
    "PruneItem",
    "RetentionRule",
    "RetentionSettings",
    "RetentionWorker",
    "SnapshotError",
    "apply_retention",
    "export_conversation",
    "import_conversation",
    "plan_retention",
    "validate_snapshot",
]

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "agentik.conversation"
SNAPSHOT_VERSION = 1
#: The longest checkpoint label (characters, one line).
MAX_CHECKPOINT_LABEL = 200
#: The most checkpoints one snapshot may bring, and the largest document of one
#: (bytes of UTF-8 JSON): a snapshot is not trusted like the database.
MAX_SNAPSHOT_CHECKPOINTS = 1000
MAX_CHECKPOINT_BYTES = 16 * 2**20
#: The most A2A task records one snapshot may bring, and the largest body of one.
MAX_SNAPSHOT_A2A_TASKS = 10_000
MAX_A2A_TASK_BYTES = 2**20
#: Characters an A2A task's owner, id or state from a snapshot may not hold.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: The state an imported task that was not over is closed with (it never resumes).
IMPORTED_TASK_STATE = "TASK_STATE_FAILED"
DAY = 86400.0

RETENTION_PROMPT = (
    "You keep the long-term record of a chat channel. The transcript you are given is "
    "about to be deleted under the channel's retention policy. Summarise it so the "
    "assistant can continue without it: people and what they wanted, decisions and why, "
    "facts, numbers and identifiers that may matter later, open questions. At most "
    "{words} words."
)

Read = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]


# -- settings -------------------------------------------------------------------------------
@settings_dataclass
class RetentionRule:
    """``[[retention.rules]]``: how long the audit log of matching channels is kept.

    ``channels``: channel-key glob patterns (``irc:libera:*``, ``slack:T1:C123``;
    ``*`` also matches conversations bound to no channel).  Of every rule, the
    one with the most specific matching pattern applies (as for
    ``[channels."<pattern>"]``).  ``keep_days``: age after which messages go.
    ``action``: ``delete`` them, or ``summarise`` them into one summary
    message first.  ``notes``: also purge the channel's memory notes that
    old (user and global notes are never touched).
    """

    channels: list[str] = Field(min_length=1)
    keep_days: float = Field(gt=0)
    action: Literal["delete", "summarise"] = "delete"
    #: Also remove, for good, the long-term memory notes of these channels
    #: (scope ``channel:<key>``) not changed for ``keep_days``.  Off: notes stay.
    notes: bool = False


@settings_dataclass
class RetentionSettings:
    """``[retention]``: the retention job (see :mod:`agentik.core.lifecycle`).

    ``rules``: the :class:`RetentionRule` list (none: nothing is ever pruned).
    ``every_turns``: run after this many finished turns.  ``interval_hours``:
    and at the latest this long after the last run.  ``summary_tokens``: the
    length limit of a ``summarise`` summary.
    """

    rules: list[RetentionRule] = Field(default_factory=empty_list)
    every_turns: int = Field(200, ge=1)
    interval_hours: float = Field(24.0, gt=0)
    summary_tokens: int = Field(512, ge=32)


def _specificity(pattern: str) -> int:
    literal = sum(1 for c in pattern if c not in "*?")
    return literal + (1_000_000 if not any(c in pattern for c in "*?[") else 0)


def rule_for(
    rules: Sequence[RetentionRule], keys: Sequence[str]
) -> tuple[RetentionRule, str] | None:
    """The rule whose most specific pattern matches one of ``keys``, and that pattern."""
    best: tuple[int, int, RetentionRule, str] | None = None
    for i, rule in enumerate(rules):
        for pattern in rule.channels:
            if any(fnmatchcase(k, pattern) for k in keys):
                score = (_specificity(pattern), -i)
                if best is None or score > best[:2]:
                    best = (score[0], score[1], rule, pattern)
    return None if best is None else (best[2], best[3])


# -- planning -------------------------------------------------------------------------------
@dataclass(slots=True)
class PruneItem:
    """What retention does (or would do) to one conversation."""

    conversation_id: str
    channel_keys: list[str]
    pattern: str
    action: str
    keep_days: float
    #: Audit-log rows that go (ids ``<= upto``).
    messages: int
    upto: int
    done: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "channel_keys": self.channel_keys,
            "pattern": self.pattern,
            "action": self.action,
            "keep_days": self.keep_days,
            "messages": self.messages,
            "done": self.done,
            "error": self.error,
        }


def _source(store: Any) -> Any:
    """The store, or (``read(sql, params)``: a read-only SQLite connection for a dry
    run) the SQLite engine's queries over it."""
    return Reader(store) if callable(store) else store


async def plan_retention(
    store: Any, rules: Sequence[RetentionRule], *, now: float | None = None
) -> list[PruneItem]:
    """Per conversation with something to prune: how many audit rows go.

    ``store``: a :class:`~agentik.core.store.base.Store` (its
    ``retention_conversations``, ``log_outline`` and ``turn_ended``), or
    ``read(sql, params)`` running a read-only query on a SQLite database (a
    read-only connection for a dry run).  Nothing is written.
    """
    if not rules:
        return []
    store = _source(store)
    now = time.time() if now is None else now
    items: list[PruneItem] = []
    for cid, bound, mk in await store.retention_conversations():
        ck = list(bound)
        if mk is not None and mk not in ck:
            ck.append(mk)
        found = rule_for(rules, ck or [""])
        if found is None:
            continue
        rule, pattern = found
        upto, count = await _cut(store, cid, now - rule.keep_days * DAY, rule.action)
        if count:
            items.append(
                PruneItem(
                    conversation_id=cid, channel_keys=ck, pattern=pattern, action=rule.action,
                    keep_days=rule.keep_days, messages=count, upto=upto,
                )
            )  # fmt: skip
    return items


async def _cut(store: Any, cid: str, cutoff: float, action: str) -> tuple[int, int]:
    """``(upto, count)``: the old prefix of the audit log that may go, ending where a
    turn starts (the next row is a user message) or at the end of the log."""
    rows = await store.log_outline(cid)
    old = 0
    while old < len(rows) and rows[old][2] < cutoff:
        old += 1
    k = old
    while k > 0 and k < len(rows) and rows[k][1] != "user":
        k -= 1
    if k == len(rows) and k > 0:
        # The whole log is old: keep a last turn still waiting for its answer.
        last_user = max((i for i, r in enumerate(rows) if r[1] == "user"), default=None)
        if last_user is not None and rows[last_user][4] is not None:
            if not await store.turn_ended(cid, rows[last_user][4]):
                k = last_user
    if action == "summarise" and k == 1 and rows[0][3] == RETENTION_AUTHOR:
        return 0, 0  # only an earlier summary is old: nothing new to summarise
    if k == 0:
        return 0, 0
    return int(rows[k - 1][0]), k


async def channel_keys(store: Any) -> list[str]:
    """Every channel key a conversation is or was bound to (``store``: as for
    :func:`plan_retention`)."""
    keys: set[str] = set()
    for _, bound, mk in await _source(store).retention_conversations():
        keys.update(bound)
        if mk is not None:
            keys.add(mk)
    return sorted(keys)


async def note_scopes(
    store: Any, rules: Sequence[RetentionRule], *, now: float | None = None
) -> dict[str, float]:
    """The ``channel:<key>`` memory scopes whose rule has ``notes`` on, and the cut-off
    time (notes changed before it go)."""
    now = time.time() if now is None else now
    out: dict[str, float] = {}
    if not any(r.notes for r in rules):
        return out
    for key in await channel_keys(store):
        found = rule_for(rules, [key])
        if found is not None and found[0].notes:
            out[f"channel:{key}"] = now - found[0].keep_days * DAY
    return out


async def count_old_notes(read: Read, scopes: Mapping[str, float]) -> dict[str, int]:
    """How many notes of each scope are older than its cut-off (SQLite memory only:
    ``{}`` when the database has no notes table); ``read`` as for :func:`plan_retention`."""
    if not scopes:
        return {}
    return await Reader(read).count_old_notes(scopes)


async def purge_old_notes(memory: Any, scopes: Mapping[str, float]) -> dict[str, int]:
    """Purge (for good) the notes of each scope changed before its cut-off, through the
    memory backend (so its indexes follow); how many per scope."""
    out: dict[str, int] = {}
    for scope, cutoff in scopes.items():
        old: list[int] = []
        offset = 0
        while True:
            page = await memory.list([scope], limit=500, offset=offset, include_deleted=True)
            old += [n.id for n in page if n.updated_at < cutoff]
            if len(page) < 500:
                break
            offset += len(page)
        for note_id in old:
            await memory.purge(note_id)
        if old:
            out[scope] = len(old)
            log.info("retention: purged %d memory notes of %s", len(old), scope)
    return out


# -- applying -------------------------------------------------------------------------------
def _transcript(rows: Sequence[Sequence[Any]]) -> str:
    lines = []
    for kind, content, author, tool_name in rows:
        if author == RETENTION_AUTHOR:
            lines.append(f"[earlier summary]\n{str(content).removeprefix(SUMMARY_PREFIX)}")
        elif kind == "user":
            lines.append(f"{author or 'user'}: {content}")
        elif kind == "assistant":
            lines.append(f"assistant: {content}")
        elif kind == "tool_call":
            lines.append(f"[tool call {tool_name}]")
        else:
            lines.append(f"[tool result {tool_name}]: {str(content)[:600]}")
    return "\n".join(lines)


async def _rows_upto(store: Any, cid: str, upto: int) -> list[tuple[Any, ...]]:
    """``(kind, content, author, tool_name)`` of the audit rows with ids ``<= upto``."""
    rows: list[tuple[Any, ...]] = []
    after = 0
    while True:
        page = await store.messages(cid, after=after, limit=1000)
        rows += [(m.kind, m.content, m.author, m.tool_name) for m in page if m.id <= upto]
        if not page or page[-1].id >= upto:
            return rows
        after = page[-1].id


async def apply_retention(
    store: Any,
    settings: RetentionSettings,
    *,
    llm: Any = None,
    now: float | None = None,
    exclusive: Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]] | None = None,
) -> list[PruneItem]:
    """Prune what :func:`plan_retention` finds in ``store`` (a ``SQLiteStore``).

    ``summarise`` rules need ``llm``; if the summary fails, that
    conversation is left as it is (nothing is lost) and the item carries the
    error.  ``exclusive(conversation_id, job)`` runs ``job`` when the
    conversation is not in a turn (the agent passes one that also drops the
    conversation's cached working memory).
    """
    items = await plan_retention(store, settings.rules, now=now)
    for item in items:

        async def job(item: PruneItem = item) -> None:
            summary: str | None = None
            if item.action == "summarise":
                if llm is None:
                    raise RuntimeError("summarise needs a model")
                rows = await _rows_upto(store, item.conversation_id, item.upto)
                words = max(50, int(settings.summary_tokens * 0.7))
                text = await ask(
                    llm, RETENTION_PROMPT.format(words=words), _transcript(rows),
                    settings.summary_tokens,
                )  # fmt: skip
                if not text:
                    raise RuntimeError("the summary came back empty")
                summary = SUMMARY_PREFIX + text
            await store.prune_log(
                item.conversation_id, item.upto, summary=summary, count=item.messages
            )
            # The images and files of the pruned messages go with them.
            cutoff = (time.time() if now is None else now) - item.keep_days * DAY
            await drop_unreferenced(store, item.conversation_id, before=cutoff)
            item.done = True

        try:
            if exclusive is not None:
                await exclusive(item.conversation_id, job)
            else:
                await job()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            item.error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "retention: conversation %s left as it was: %s", item.conversation_id, item.error
            )
        else:
            log.info(
                "retention: conversation %s: %s %d messages older than %g days",
                item.conversation_id,
                "summarised" if item.action == "summarise" else "deleted",
                item.messages,
                item.keep_days,
            )
    return items


class RetentionWorker:
    """An agent ``background`` coroutine running retention at start-up, after every
    ``every_turns`` ``turn_ended`` events, and ``interval_hours`` after the last run.

    Workers sharing a database run each firing once (:mod:`agentik.core.cluster.jobs`):
    the start-up run once per start-up window (workers started together), the
    interval runs at the interval's boundaries (``floor(time / interval)``: every
    worker wakes for the same slot, one claims it).  A :meth:`trigger` and a worker's
    own ``every_turns`` count are firings of that worker alone: they always run.
    """

    def __init__(self, settings: RetentionSettings) -> None:
        self.settings = settings
        #: Every run's items, for status and tests.
        self.runs: list[list[PruneItem]] = []
        #: Memory notes purged by each run that had ``notes`` rules: count per scope.
        self.notes: list[dict[str, int]] = []
        #: Firings another worker claimed (it ran them).
        self.skipped = 0
        self.changed = asyncio.Condition()
        self._kick = asyncio.Event()

    def trigger(self) -> None:
        """Run again now (tests, an operator command)."""
        self._kick.set()

    async def wait_runs(self, count: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.runs) >= count)

    async def __call__(self, agent: Any) -> None:
        if not self.settings.rules or "retention" not in agent.store.capabilities:
            return
        counter = asyncio.create_task(self._count_turns(agent), name="agentik-retention-turns")
        try:
            slot = startup_slot()
            while True:
                await self._run(agent, slot)
                self._kick.clear()
                delay, slot = next_interval(self.settings.interval_hours * 3600)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._kick.wait()
                        slot = own_slot("kick")
        finally:
            counter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counter

    async def _count_turns(self, agent: Any) -> None:
        n = 0
        async with contextlib.aclosing(agent.events(kinds={"turn_ended"})) as events:
            async for _ in events:
                n += 1
                if n >= self.settings.every_turns:
                    n = 0
                    self._kick.set()

    async def _run(self, agent: Any, slot: str) -> None:
        async def exclusive(cid: str, job: Callable[[], Awaitable[None]]) -> None:
            conv = agent.services.find(cid)
            if conv is None:
                await job()
                return
            await conv.run_exclusive(job)
            conv.parts.memory.invalidate()

        items: list[PruneItem] = []

        async def job() -> str:
            nonlocal items
            items = await apply_retention(
                agent.store, self.settings, llm=agent.llm, exclusive=exclusive
            )
            scopes = await note_scopes(agent.store, self.settings.rules)
            if scopes:
                self.notes.append(await purge_old_notes(agent.memory, scopes))
            cluster = getattr(agent, "cluster_events", None)
            if cluster is not None:  # workers: the run events SSE clients replay
                await cluster.prune()
            return f"{sum(1 for i in items if i.done)} conversation(s) pruned"

        try:
            if not await run_once(agent.store, "retention", slot, job):
                log.info("retention %s: run by another worker", slot)
                async with self.changed:
                    self.skipped += 1
                    self.changed.notify_all()
                return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retention run failed")
            items = []
        async with self.changed:
            self.runs.append(items)
            self.changed.notify_all()


# -- snapshots --------------------------------------------------------------------------------
async def export_conversation(
    store: Any, conversation_id: str, *, checkpoints: bool = True
) -> dict[str, Any] | None:
    """The snapshot of one conversation (``None``: there is no such conversation).

    ``checkpoints``: with the conversation's checkpoints (``checkpoints``: oldest
    first, each ``{created_at, label, automatic, document}``); a checkpoint's own
    document is exported without them (no snapshot nests in another twice)."""
    record = await store.get_conversation(conversation_id)
    if record is None:
        return None
    messages: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await store.messages(conversation_id, after=after, limit=1000)
        if not page:
            break
        messages.extend(m.to_dict() for m in page)
        after = page[-1].id
    memory = [
        {"pos": e.pos, "message": e.message.to_dict()}
        for e in await store.load_memory(conversation_id)
    ]
    doc: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "exported_at": time.time(),
        "conversation": {
            "id": record.id,
            "title": record.title,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "meta": record.meta,
        },
        "messages": messages,
        "working_memory": memory,
        "bindings": [],
        "turn_ends": [],
        "todo": None,
    }
    with contextlib.suppress(NotImplementedError):
        checklist = await store.todo_get(conversation_id)
        if checklist is not None:
            doc["todo"] = checklist.to_dict()
    # Bindings, turn ends, approvals, questions, runs: the engine's rows (Store.export_rows).
    with contextlib.suppress(NotImplementedError):  # an engine without them: no more to add
        doc.update(await store.export_rows(conversation_id))
    with contextlib.suppress(NotImplementedError):
        held = await store.attachments(conversation_id)
        if held:
            doc["attachments"] = [await _export_attachment(store, a) for a in held]
    with contextlib.suppress(NotImplementedError):
        tasks = await store.a2a_conversation_tasks(conversation_id)
        if tasks:
            doc["a2a_tasks"] = [
                {
                    "owner": t.owner, "task_id": t.task_id, "run_id": t.run_id,
                    "state": t.state, "final": t.final, "updated_at": t.updated_at,
                    "body": json.loads(t.body),
                }
                for t in tasks
            ]  # fmt: skip
    if checkpoints:
        with contextlib.suppress(NotImplementedError):
            taken = await _export_checkpoints(store, conversation_id)
            if taken:
                doc["checkpoints"] = taken
    return doc


async def _export_checkpoints(store: Any, conversation_id: str) -> list[dict[str, Any]]:
    out = []
    for c in reversed(await store.checkpoints(conversation_id)):
        text = await store.checkpoint_get(conversation_id, c.id)
        if text is None:
            continue  # deleted meanwhile
        out.append(
            {
                "created_at": c.created_at,
                "label": c.label,
                "automatic": c.automatic,
                "document": json.loads(text),
            }
        )
    return out


def _snapshot_a2a_tasks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The A2A task records of a snapshot, checked (sizes, fields, a body that is a
    JSON object), as history that grants nothing: the owner becomes
    ``imported:<owner>`` (no token has that name, so no caller reads them through
    A2A) and a task not over is closed (:data:`IMPORTED_TASK_STATE`)."""
    items = doc.get("a2a_tasks")
    if items is None:
        return []
    if not isinstance(items, list):
        raise SnapshotError(f"a2a_tasks: expected array, got {type(items).__name__}")
    if len(items) > MAX_SNAPSHOT_A2A_TASKS:
        raise SnapshotError(f"a2a_tasks: at most {MAX_SNAPSHOT_A2A_TASKS} tasks")
    out = []
    for i, t in enumerate(items):
        where = f"a2a_tasks[{i}]"
        if not isinstance(t, dict):
            raise SnapshotError(f"{where}: expected an object")
        fields = {}
        for key, most in (("owner", 200), ("task_id", 200), ("state", 64)):
            value = _need(t, key, where, str)
            if not 1 <= len(value) <= most or _CONTROL.search(value):
                raise SnapshotError(f"{where}.{key}: 1 to {most} characters, no control ones")
            fields[key] = value
        run_id = _need(t, "run_id", where, str, optional=True) or None
        if run_id is not None and len(run_id) > 200:
            raise SnapshotError(f"{where}.run_id: at most 200 characters")
        final = bool(_need(t, "final", where, bool, optional=True))
        at = _need(t, "updated_at", where, (int, float))
        task = _need(t, "body", where, dict)
        body = json.dumps(task, separators=(",", ":"))
        if len(body.encode("utf-8")) > MAX_A2A_TASK_BYTES:
            raise SnapshotError(f"{where}.body: larger than {MAX_A2A_TASK_BYTES:,} bytes")
        owner = fields["owner"]
        if not owner.startswith(IMPORTED_SCOPE):
            owner = IMPORTED_SCOPE + owner
        state = fields["state"]
        if not final:
            state = IMPORTED_TASK_STATE
            if isinstance(task.get("status"), dict):
                task["status"]["state"] = state
                body = json.dumps(task, separators=(",", ":"))
        out.append(
            {"owner": owner, "task_id": fields["task_id"], "run_id": run_id, "state": state,
             "updated_at": float(at), "body": body}
        )  # fmt: skip
    return out


def _snapshot_checkpoints(doc: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """The checkpoints of a snapshot, each checked as a snapshot of its own, at most
    :data:`MAX_SNAPSHOT_CHECKPOINTS` of at most :data:`MAX_CHECKPOINT_BYTES` each.
    ``(document as JSON text, created_at, label, automatic)``."""
    items = doc.get("checkpoints")
    if items is None:
        return []
    if not isinstance(items, list):
        raise SnapshotError(f"checkpoints: expected array, got {type(items).__name__}")
    if len(items) > MAX_SNAPSHOT_CHECKPOINTS:
        raise SnapshotError(f"checkpoints: at most {MAX_SNAPSHOT_CHECKPOINTS} checkpoints")
    out = []
    for i, c in enumerate(items):
        where = f"checkpoints[{i}]"
        if not isinstance(c, dict):
            raise SnapshotError(f"{where}: expected an object")
        at = _need(c, "created_at", where, (int, float))
        label = _need(c, "label", where, str, optional=True) or ""
        if len(label) > MAX_CHECKPOINT_LABEL:
            raise SnapshotError(f"{where}.label: at most {MAX_CHECKPOINT_LABEL} characters")
        label = " ".join(label.split())  # one line, as a label taken here
        automatic = bool(_need(c, "automatic", where, bool, optional=True))
        document = _need(c, "document", where, dict)
        if "checkpoints" in document:
            raise SnapshotError(f"{where}.document: a checkpoint holds no checkpoints")
        try:
            validate_snapshot(document)
        except SnapshotError as exc:
            raise SnapshotError(f"{where}.document: {exc}") from None
        text = json.dumps(document, ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
        if size > MAX_CHECKPOINT_BYTES:
            raise SnapshotError(
                f"{where}.document: {size:,} bytes, larger than {MAX_CHECKPOINT_BYTES:,}"
            )
        out.append((text, float(at), label, automatic))
    return out


async def _export_attachment(store: Any, held: Any) -> dict[str, Any]:
    data = await store.attachment_data(held.sha256)
    return {
        "sha256": held.sha256,
        "media_type": held.media_type,
        "created_at": held.created_at,
        # (None: bytes a crash lost; the import skips them)
        "data": None if data is None else base64.b64encode(data).decode("ascii"),
    }


def _snapshot_attachments(
    doc: dict[str, Any], max_bytes: int | None
) -> list[tuple[bytes, str, float]]:
    """The attachments of a snapshot, checked as any sent: the bytes must match their
    hash, their type is sniffed again (the snapshot's word is not taken), ``max_bytes``
    caps each.  ``(data, media_type, created_at)``."""
    items = doc.get("attachments")
    if items is None:
        return []
    if not isinstance(items, list):
        raise SnapshotError(f"attachments: expected array, got {type(items).__name__}")
    out: list[tuple[bytes, str, float]] = []
    for i, a in enumerate(items):
        where = f"attachments[{i}]"
        if not isinstance(a, dict):
            raise SnapshotError(f"{where}: expected an object")
        sha = _need(a, "sha256", where, str)
        encoded = _need(a, "data", where, str, optional=True)
        at = _need(a, "created_at", where, (int, float), optional=True)
        if encoded is None:
            continue
        try:
            data = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise SnapshotError(f"{where}.data: not base64") from None
        if sha256_of(data) != sha:
            raise SnapshotError(f"{where}.sha256: does not match its data")
        try:
            media_type = check(data, max_bytes if max_bytes is not None else len(data))
        except AttachmentRejected as exc:
            raise SnapshotError(f"{where}: {exc}") from None
        out.append((data, media_type, float(at or 0.0)))
    return out


_KINDS = ("user", "assistant", "tool_call", "tool_result")
_STATUSES = ("complete", "interrupted", "error")


def _need(d: Mapping[str, Any], key: str, where: str, types: Any, *, optional: bool = False) -> Any:
    if key not in d:
        if optional:
            return None
        raise SnapshotError(f"{where}.{key}: missing")
    value = d[key]
    if optional and value is None:
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise SnapshotError(f"{where}.{key}: expected {_names(types)}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SnapshotError(f"{where}.{key}: not a finite number")
    return value


def _tuple(types: Any) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: Any) -> str:
    names = {str: "string", int: "integer", float: "number", dict: "object", list: "array",
             bool: "boolean"}  # fmt: skip
    return " or ".join(names.get(t, t.__name__) for t in _tuple(types))


#: Integers a snapshot may hold (SQLite's 64-bit range, with room to renumber).
MAX_INT = 2**62


def _int(d: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    value = d.get(key)
    if isinstance(value, float) and value.is_integer():
        d[key] = value = int(value)  # JSON has one number type: 3.0 is the integer 3
    value = _need(d, key, where, int, optional=optional)
    if value is not None and not -MAX_INT <= value <= MAX_INT:
        raise SnapshotError(f"{where}.{key}: out of range")
    return value


def _unicode(value: Any) -> Any:
    """``value`` with lone surrogates (from ``\\ud800`` escapes) replaced by U+FFFD:
    they are not text, and SQLite stores only valid UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, list):
        return [_unicode(v) for v in value]
    if isinstance(value, dict):
        return {_unicode(k): _unicode(v) for k, v in value.items()}
    return value


def _chat_message(body: dict[str, Any], where: str) -> None:
    role = _need(body, "role", where, str)
    if role not in ("system", "user", "assistant", "tool"):
        raise SnapshotError(f"{where}.role: unknown role {role!r}")
    _need(body, "content", where, str, optional=True)
    for key in ("author", "tool_call_id", "name"):
        _need(body, key, where, str, optional=True)
    _need(body, "is_error", where, bool, optional=True)
    _int(body, "message_id", where, optional=True)
    for i, call in enumerate(_need(body, "tool_calls", where, list, optional=True) or []):
        cw = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict):
            raise SnapshotError(f"{cw}: expected an object")
        _need(call, "id", cw, str)
        _need(call, "name", cw, str)
        _need(call, "arguments", cw, str, optional=True)


def validate_snapshot(doc: Any) -> dict[str, Any]:
    """Check a snapshot's shape; raises :class:`SnapshotError` naming the bad field."""
    if not isinstance(doc, dict):
        raise SnapshotError(f"snapshot: expected a JSON object, got {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != SNAPSHOT_FORMAT:
        raise SnapshotError(f"format: expected {SNAPSHOT_FORMAT!r}, got {fmt!r}")
    version = doc.get("version")
    if version != SNAPSHOT_VERSION or isinstance(version, bool):
        raise SnapshotError(
            f"version: unsupported snapshot version {version!r}"
            f" (this agentik reads {SNAPSHOT_VERSION})"
        )
    num = (int, float)
    conv = _need(doc, "conversation", "snapshot", dict)
    cid = _need(conv, "id", "conversation", str)
    if not cid or len(cid) > 200:
        raise SnapshotError("conversation.id: must be 1 to 200 characters")
    _need(conv, "title", "conversation", str)
    _need(conv, "created_at", "conversation", num)
    _need(conv, "updated_at", "conversation", num)
    _need(conv, "meta", "conversation", dict)
    for i, m in enumerate(_need(doc, "messages", "snapshot", list)):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise SnapshotError(f"{where}: expected an object")
        if _int(m, "id", where) < 1:
            raise SnapshotError(f"{where}.id: must be at least 1")
        kind = _need(m, "kind", where, str)
        if kind not in _KINDS:
            raise SnapshotError(f"{where}.kind: must be one of {', '.join(_KINDS)}, not {kind!r}")
        _need(m, "content", where, str)
        _need(m, "created_at", where, num)
        for key in ("author", "channel", "run_id", "tool_call_id", "tool_name", "arguments"):
            _need(m, key, where, str, optional=True)
        _need(m, "is_error", where, bool, optional=True)
        status = _need(m, "status", where, str, optional=True)
        if status is not None and status not in _STATUSES:
            raise SnapshotError(
                f"{where}.status: must be one of {', '.join(_STATUSES)}, not {status!r}"
            )
        _need(m, "duration", where, num, optional=True)
    for i, e in enumerate(_need(doc, "working_memory", "snapshot", list)):
        where = f"working_memory[{i}]"
        if not isinstance(e, dict):
            raise SnapshotError(f"{where}: expected an object")
        _int(e, "pos", where)
        _chat_message(_need(e, "message", where, dict), f"{where}.message")
    for key in ("bindings", "turn_ends", "approvals", "questions", "runs"):
        if key in doc and not isinstance(doc[key], list):
            raise SnapshotError(f"{key}: expected array, got {type(doc[key]).__name__}")
        for i, r in enumerate(doc.get(key) or []):
            if not isinstance(r, dict):
                raise SnapshotError(f"{key}[{i}]: expected an object")
    for i, b in enumerate(doc.get("bindings") or []):
        key = _need(b, "channel_key", f"bindings[{i}]", str)
        if not key:
            raise SnapshotError(f"bindings[{i}].channel_key: empty")
    for i, t in enumerate(doc.get("turn_ends") or []):
        _need(t, "run_id", f"turn_ends[{i}]", str)
        _need(t, "outcome", f"turn_ends[{i}]", str)
        _need(t, "created_at", f"turn_ends[{i}]", num, optional=True)
    _checklist(doc)
    try:
        json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        cleaned = _unicode(doc)
        doc.clear()
        doc.update(cleaned)
    except ValueError as exc:  # NaN or infinity (not JSON)
        raise SnapshotError(f"snapshot: {exc}") from None
    return doc


def _checklist(doc: dict[str, Any]) -> None:
    """Check the optional ``todo`` (the conversation's checklist): ``null`` or
    ``{items: [{text, status}], run_id?, updated_at?}``; the items are
    restored as written."""
    todo = _need(doc, "todo", "snapshot", dict, optional=True)
    if todo is None:
        return
    items = _need(todo, "items", "todo", list)
    if len(items) > MAX_TODO_ITEMS:
        raise SnapshotError(f"todo.items: at most {MAX_TODO_ITEMS} items")
    for i, item in enumerate(items):
        where = f"todo.items[{i}]"
        if not isinstance(item, dict):
            raise SnapshotError(f"{where}: expected an object")
        text = _need(item, "text", where, str)
        if not 1 <= len(text) <= MAX_TODO_TEXT:
            raise SnapshotError(f"{where}.text: must be 1 to {MAX_TODO_TEXT} characters")
        status = _need(item, "status", where, str)
        if status not in TODO_STATUSES:
            raise SnapshotError(
                f"{where}.status: must be one of {', '.join(TODO_STATUSES)}, not {status!r}"
            )
    _need(todo, "run_id", "todo", str, optional=True)
    _need(todo, "updated_at", "todo", (int, float), optional=True)
    for key in ("done", "total"):  # derived from the items: checked, not restored
        if key not in todo:
            continue
        count = todo[key]
        if isinstance(count, float) and count.is_integer():
            count = int(count)  # JSON has one number type: 3.0 is the integer 3
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise SnapshotError(f"todo.{key}: expected an integer of at least 0")


async def import_conversation(
    store: Any,
    doc: Any,
    *,
    new_ids: bool = False,
    bind: str | None = None,
    max_bytes: int | None = None,
) -> ImportResult:
    """Restore a snapshot into ``store`` in one transaction, its attachments,
    checkpoints and A2A task records included: a part the database refuses raises
    :class:`SnapshotError` naming it (``checkpoints[3]: cannot be restored: …``)
    and nothing of the snapshot is written.  Everything is checked first.

    ``new_ids``: under a fresh conversation id (otherwise the snapshot's; an
    id already present is refused).  ``bind``: bind this channel key to it
    (taking it over); without it, the snapshot's bindings are restored where
    the channel is not bound to another conversation here.  ``max_bytes``: the
    largest attachment taken (``None``: any size).
    """
    doc = validate_snapshot(doc)
    attached = _snapshot_attachments(doc, max_bytes)
    kept = _snapshot_checkpoints(doc)  # (all checked before anything is written)
    tasks = _snapshot_a2a_tasks(doc)
    cid = uuid.uuid4().hex if new_ids else doc["conversation"]["id"]
    if bind is not None and not bind.strip():
        raise SnapshotError("bind: empty channel key")
    now = time.time()
    caps = getattr(store, "capabilities", ())
    if kept and "checkpoints" not in caps:
        log.warning("import: this store keeps no checkpoints; %d left out", len(kept))
        kept = []
    if tasks and "a2a_tasks" not in caps:
        log.warning("import: this store keeps no A2A tasks; %d left out", len(tasks))
        tasks = []
    if attached and "attachments" not in caps:
        log.warning("import: this store keeps no attachments; %d left out", len(attached))
        attached = []
    parts = SnapshotParts(
        attachments=[(data, media_type, at or now) for data, media_type, at in attached],
        # As taken here; none trimmed (keep_automatic applies to the next ones).
        checkpoints=kept,
        a2a_tasks=[A2ATaskRecord(conversation_id=cid, final=True, **t) for t in tasks],
    )
    # One transaction: the rows, then the parts; a part the database refuses leaves
    # nothing of the snapshot.  The engine raises the snapshot's own SnapshotError
    # (naming the field), not its writer's wrapper; the contract suite checks it.
    result: ImportResult = await store.import_rows(doc, cid, bind=bind, now=now, parts=parts)
    if result.skipped_tasks:
        log.warning(
            "import: %d A2A tasks already in this database kept their records",
            result.skipped_tasks,
        )
    return result
