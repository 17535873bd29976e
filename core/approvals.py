"""Approvals: a tool call that waits for a person's yes or no.

A rule (:class:`ApprovalRule`, the configuration's ``[[approvals]]``) names
tools by glob (``fs__write_*``, a whole MCP server ``git__*``) and says
whether a call needs approval: ``always``, ``first-use`` (once per
conversation and tool: after one approved call of that tool in a
conversation, later calls of it there run without asking; ``!new`` starts
over) or ``never``.  The first rule that matches a tool (and the channel, when
the rule names ``channels``) decides.

When the model calls such a tool, the turn pauses before running it
(:meth:`Approvals.gate`, called by the turn runner): a pending approval is
persisted (:class:`Approval`: a short id unique among the channel's pending
ones, the tool, its arguments masked and cut, who asked, when it expires),
an ``approval_requested`` event goes out, and the turn waits — its time
budget paused — for :meth:`Approvals.decide` or the timeout (the wait is
:func:`~agentik.core.waiting.wait_for_person`, shared with ``ask_user``).  Then
``approval_resolved`` goes out (``approved``, ``denied``, ``expired`` or
``cancelled``) and the call runs, or the model gets a result saying why not
(``the call was denied by alice: not today``).  ``!stop`` during the wait
cancels the approval; a shutdown leaves it pending for the next start.

Who may decide: a verified identity (``approver_id``) whose role is at
least the rule's ``approvers`` (:func:`at_least`); the asker only when the
rule says ``self_approve``.  The caller (the bridge, the HTTP API) finds the
approver's role; this module only compares.

After a restart: a turn that was waiting is resumed from its last committed
step, and the stored call that waited (:meth:`Approvals.awaiting`) is run
again before the first model request — it takes over the pending approval
(same id, same expiry) and the channel is asked again; approved, the tool
runs and the model continues with its result.  (It used to depend on the
model calling the same tool with the same arguments again, and the approval
usually expired.)  Pending approvals of turns that are not resumed expire
with a notice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .access import BUILTIN_ROLES, at_least
from .errors import AgentikError
from .events import ApprovalRequested, ApprovalResolved
from .settings import settings_dataclass
from .store.records import Approval, ApprovalDecision
from .waiting import wait_for_person

if TYPE_CHECKING:
    from .messages import ToolCall
    from .protocols import PartsLike
    from .store.base import Store

__all__ = [
    "RESTARTED",
    "ROLE_ORDER",
    "WENT_ON_WITHOUT_IT",
    "Approval",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalRule",
    "Approvals",
    "at_least",
    "mask_arguments",
]

log = logging.getLogger(__name__)

#: Why an approval expired: its turn ended without asking for it again.
WENT_ON_WITHOUT_IT = "the turn went on without it"
#: Why an approval expired: a restart cut its turn off and the turn was not answered
#: again (crash recovery noted or dropped it, or left it to no turn).
RESTARTED = "the bot restarted and that turn was not taken up again"

#: Built-in roles, highest first.  A named role ranks as ``user``.
ROLE_ORDER: tuple[str, ...] = BUILTIN_ROLES


@settings_dataclass
class ApprovalRule:
    """One ``[[approvals]]`` entry: which tool calls need a person's approval.

    ``tools``: glob patterns of tool names (MCP tools are ``<server>__<tool>``,
    so ``git__*`` is a whole server).  ``approve``: ``always``, ``first-use``
    (once per conversation and tool) or ``never`` (an exception to a broader
    rule below it).  ``approvers``: the role that may decide (``admin``,
    ``user``, ``owner`` or a named role).  ``timeout``: seconds before an
    unanswered request expires (the call is then not run).
    ``self_approve``: whether the person who asked may approve their own
    call.  ``channels``: glob patterns of channel keys the rule applies to
    (unset: every channel).
    """

    tools: tuple[str, ...] = Field(min_length=1)
    approve: Literal["always", "first-use", "never"] = "always"
    approvers: str = Field("admin", min_length=1)
    timeout: float = Field(600.0, gt=0)
    self_approve: bool = False
    channels: tuple[str, ...] | None = None

    def matches(self, tool: str, channel_key: str | None) -> bool:
        if not any(fnmatchcase(tool, p) for p in self.tools):
            return False
        if self.channels is None:
            return True
        return channel_key is not None and any(fnmatchcase(channel_key, p) for p in self.channels)


class ApprovalError(AgentikError):
    """A decision that cannot be taken; ``code`` says why, the message says it to a person.

    Codes: ``not_found``, ``not_pending``, ``unverified``, ``forbidden``, ``self``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- masking --------------------------------------------------------------------------------

_SECRET_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|apikey|auth|credential|private[_-]?key|"
    r"cookie|session)",
    re.I,
)
_SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_-]{12,}|xox[abposr]-[A-Za-z0-9-]{8,}|xapp-[A-Za-z0-9-]{8,}|"
    r"gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}|AKIA[0-9A-Z]{16}|"
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?"
    r"(-----END [A-Z ]*PRIVATE KEY-----|$))"
)
MASK = "***"


def _mask(value: Any, key: str | None, cut: int) -> Any:
    if key is not None and _SECRET_KEY.search(key) and value not in (None, "", [], {}):
        return MASK
    if isinstance(value, str):
        value = _SECRET_VALUE.sub(MASK, value)
        return value if len(value) <= cut else value[: cut - 1] + "…"
    if isinstance(value, dict):
        return {str(k): _mask(v, str(k), cut) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key, cut) for v in value[:20]] + (["…"] if len(value) > 20 else [])
    return value


def mask_arguments(arguments: str, *, limit: int = 400, value_chars: int = 120) -> str:
    """A tool call's JSON ``arguments`` as shown to people and stored with an approval.

    Values under secret-looking keys (``password``, ``token``, ``api_key`` …)
    become ``***``, so do token-shaped strings anywhere (``sk-…``, ``xoxb-…``,
    ``ghp_…``, bearer tokens, private keys); strings are cut at
    ``value_chars`` and the whole at ``limit`` characters.
    """
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        text = _SECRET_VALUE.sub(MASK, arguments)
    else:
        text = json.dumps(_mask(parsed, None, value_chars), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _digest(tool: str, arguments: str) -> str:
    try:
        canonical = json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except ValueError:
        canonical = arguments
    return hashlib.sha256(f"{tool}\0{canonical}".encode()).hexdigest()


def _minutes(seconds: float) -> str:
    if seconds >= 90 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


# -- the manager ------------------------------------------------------------------------------


class Approvals:
    """The approval rules of an agent and its pending approvals (see the module docstring).

    ``rules`` are tried in order; ``at_least`` compares roles (default:
    :func:`at_least`).  One per agent (:attr:`Agent.approvals`).
    """

    def __init__(
        self,
        rules: Iterable[ApprovalRule] = (),
        *,
        store: Store | None = None,
        at_least: Callable[[str, str], bool] = at_least,
    ) -> None:
        self.rules: list[ApprovalRule] = list(rules)
        self.store: Store | None = store
        #: How roles compare (``at_least(role, needed)``); the bot may set the access
        #: policy's own comparison here (``AccessPolicy.at_least``).
        self.at_least = at_least
        # serial -> the future a waiting turn awaits.
        self._waiting: dict[int, asyncio.Future[Approval]] = {}
        # (conversation, tool) pairs approved once: "first-use" rules skip them.
        self._used: set[tuple[str, str]] = set()
        # Approvals made before this (a restart) may be taken over by a resumed turn.
        self._born = time.time()
        #: Workers sharing a store (:mod:`agentik.core.cluster.events`): whether a turn
        #: of another worker may wait for an approval this process does not wait for
        #: (``None``: one process, none may).
        self.elsewhere: Callable[[Approval], Awaitable[bool]] | None = None
        #: Told ``a:<serial>`` once a decision is recorded that no turn of this
        #: process waited for (the worker whose turn waits re-reads it).
        self.decided: Callable[[str], Awaitable[None]] | None = None

    @property
    def enabled(self) -> bool:
        return any(r.approve != "never" for r in self.rules)

    def rule_for(self, tool: str, channel_key: str | None) -> ApprovalRule | None:
        """The rule deciding ``tool`` in ``channel_key`` (``None``: no rule, no approval)."""
        for rule in self.rules:
            if rule.matches(tool, channel_key):
                return rule
        return None

    def _store(self) -> Store:
        assert self.store is not None, "Approvals.store is set by the agent"
        return self.store

    # -- the gate, in the turn ------------------------------------------------------------------
    async def gate(
        self,
        parts: PartsLike,
        run_id: str,
        call: ToolCall,
        *,
        asker: str | None,
        asker_id: str | None,
        interrupted: Callable[[], bool],
        paused: Callable[[bool], None] | None = None,
    ) -> str | None:
        """Wait for approval of ``call`` if a rule asks for it.

        ``None``: run the call.  Otherwise the error text the model gets
        instead of the call's result.  ``interrupted()`` tells a ``!stop``
        (the approval is cancelled) from a shutdown (it stays pending);
        ``paused(True/False)`` brackets the wait (the turn's time budget stops).
        """
        channel_key = parts.channel_key
        rule = self.rule_for(call.name, channel_key)
        if rule is None or rule.approve == "never":
            return None
        store = self._store()
        cid = parts.id
        if rule.approve == "first-use":
            if (cid, call.name) in self._used or await store.approval_used(cid, call.name):
                self._used.add((cid, call.name))
                return None
        digest = _digest(call.name, call.arguments)
        approval, resumed = await self._open(
            parts, run_id, call, rule, digest, asker=asker, asker_id=asker_id
        )
        loop = asyncio.get_running_loop()
        fut = self._waiting.get(approval.serial)
        if fut is None or fut.done():
            fut = self._waiting[approval.serial] = loop.create_future()
        parts.events.emit(
            ApprovalRequested,
            run_id,
            approval_id=approval.id,
            call_id=call.id,
            name=call.name,
            arguments=approval.arguments,
            asker=approval.asker,
            asker_id=approval.asker_id,
            approvers=approval.approvers,
            expires_at=approval.expires_at,
            timeout=max(0.0, approval.expires_at - approval.created_at),
            resumed=resumed,
        )
        log.info(
            "conversation %s: approval %s requested for %s (run %s)",
            cid, approval.id, call.name, run_id,
        )  # fmt: skip

        async def cancelled() -> None:
            gone, _ = await self._resolve(approval, "cancelled", None, None, "the turn was stopped")
            self._emit_resolved(parts, run_id, gone)

        async def expired() -> Approval:
            done, _ = await self._resolve(
                approval, "expired", None, None, "no one answered in time"
            )
            return done

        try:
            # A shutdown (cancelled, not interrupted): it stays pending for the next start.
            done = await wait_for_person(
                fut,
                approval.expires_at,
                expire=expired,
                cancel=cancelled,
                interrupted=interrupted,
                paused=paused,
            )
        finally:
            self._waiting.pop(approval.serial, None)
        self._emit_resolved(parts, run_id, done)
        if done.decision == "approved":
            self._used.add((cid, call.name))
            return None
        return self.refusal(done, rule)

    @staticmethod
    def refusal(a: Approval, rule: ApprovalRule | None = None) -> str:
        """What the model is told instead of the result of a call not approved."""
        why = f": {a.reason}" if a.reason and a.decision == "denied" else ""
        if a.decision == "denied":
            return f"error: not run: the call was denied by {a.approver or 'someone'}{why}"
        if a.decision == "expired":
            wait = _minutes(max(0.0, a.expires_at - a.created_at))
            return f"error: not run: no one approved the call within {wait}"
        return "error: not run: the approval was cancelled (the turn was stopped)"

    def _emit_resolved(self, parts: PartsLike, run_id: str | None, a: Approval) -> None:
        parts.events.emit(
            ApprovalResolved,
            run_id,
            approval_id=a.id,
            call_id=a.call_id,
            name=a.tool,
            decision=a.decision or "expired",
            approver=a.approver,
            approver_id=a.approver_id,
            reason=a.reason or "",
        )

    async def _open(
        self,
        parts: PartsLike,
        run_id: str,
        call: ToolCall,
        rule: ApprovalRule,
        digest: str,
        *,
        asker: str | None,
        asker_id: str | None,
    ) -> tuple[Approval, bool]:
        """The pending approval for this call: one left by a restart for the same
        call of the same run (taken over), or a new one."""
        store = self._store()
        for old in await store.approvals(conversation_id=parts.id, state="pending"):
            if (
                old.run_id == run_id
                and old.created_at < self._born
                and old.digest == digest
                and old.serial not in self._waiting
                and old.expires_at > time.time()
            ):
                taken = replace(old, call_id=call.id)
                await store.approval_rebind(old.serial, call.id)
                return taken, True
        now = time.time()
        scope = parts.channel_key or parts.id
        base = Approval(
            id="",
            scope=scope,
            conversation_id=parts.id,
            channel_key=parts.channel_key,
            run_id=run_id,
            call_id=call.id,
            tool=call.name,
            arguments=mask_arguments(call.arguments),
            digest=digest,
            asker=asker,
            asker_id=asker_id,
            approvers=rule.approvers,
            self_approve=rule.self_approve,
            created_at=now,
            expires_at=now + rule.timeout,
        )
        for attempt in range(64):
            width = 3 if attempt < 32 else 4 + (attempt - 32) // 8
            candidate = replace(base, id=secrets.token_hex(4)[:width])
            serial = await store.approval_add(candidate)
            if serial is not None:
                return replace(candidate, serial=serial), False
        raise AgentikError("could not find a free approval id")  # pragma: no cover

    async def _resolve(
        self,
        a: Approval,
        decision: ApprovalDecision,
        approver: str | None,
        approver_id: str | None,
        reason: str | None,
    ) -> tuple[Approval, bool]:
        """Record the decision unless another one got there first: the stored outcome,
        and whether this call's decision is the one recorded."""
        store = self._store()
        now = time.time()
        won = await store.approval_resolve(a.serial, decision, approver, approver_id, reason, now)
        if won:
            done = replace(
                a, state="resolved", decision=decision, approver=approver,
                approver_id=approver_id, reason=reason, resolved_at=now,
            )  # fmt: skip
        else:
            found = await store.approval_get(a.serial)
            done = found if found is not None else a
        fut = self._waiting.get(a.serial)
        if fut is not None and not fut.done():
            fut.set_result(done)
        elif won and self.decided is not None:
            await self.decided(f"a:{a.serial}")
        return done, bool(won)

    async def settle_from_store(self, serial: int | None) -> None:
        """A decision may have been recorded by another process: the turn waiting here
        for approval ``serial`` (``None``: for any) gets it, read from the store."""
        serials = list(self._waiting) if serial is None else [serial]
        for one in serials:
            fut = self._waiting.get(one)
            if fut is None or fut.done():
                continue
            found = await self._store().approval_get(one)
            if found is not None and found.state != "pending" and not fut.done():
                fut.set_result(found)

    # -- deciding -----------------------------------------------------------------------------
    async def pending(
        self, scope: str | None = None, *, conversation_id: str | None = None
    ) -> list[Approval]:
        """Pending approvals (of a channel ``scope`` or a conversation), oldest first.

        Ones past their expiry that no turn waits for are left out.
        """
        rows = await self._store().approvals(
            scope=scope, conversation_id=conversation_id, state="pending"
        )
        now = time.time()
        return [a for a in rows if a.expires_at > now or a.serial in self._waiting]

    async def find(
        self, approval_id: str, *, scope: str | None = None, conversation_id: str | None = None
    ) -> Approval:
        """The approval with short id ``approval_id`` (a pending one first)."""
        rows = await self._store().approvals(
            scope=scope, conversation_id=conversation_id, short_id=approval_id.lower()
        )
        if not rows:
            raise ApprovalError("not_found", f"no approval {approval_id!r} here")
        pending = [a for a in rows if a.state == "pending"]
        return pending[0] if pending else rows[-1]

    async def decide(
        self,
        approval: Approval,
        decision: Literal["approve", "deny"],
        *,
        approver: str | None,
        approver_id: str | None,
        role: str,
        reason: str | None = None,
    ) -> Approval:
        """Approve or deny a pending approval; raises :class:`ApprovalError` when not allowed.

        ``approver_id`` is the verified, transport-qualified identity
        (``None``: unverified, always refused); ``role`` is its role in the
        approval's channel.
        """
        a = approval
        if a.state != "pending":
            who = f" by {a.approver}" if a.approver else ""
            raise ApprovalError("not_pending", f"approval {a.id} is already {a.decision}{who}")
        if a.serial not in self._waiting and not (
            self.elsewhere is not None and await self.elsewhere(a)
        ):
            if a.expires_at <= time.time():
                raise ApprovalError("not_pending", f"approval {a.id} has expired")
            raise ApprovalError(
                "not_pending",
                f"approval {a.id} is not waiting now (the bot restarted); it is asked"
                " again when the resumed turn calls the tool again",
            )
        if approver_id is None:
            raise ApprovalError(
                "unverified",
                f"approval {a.id}: only a verified identity may decide"
                " (log in to your network's services)",
            )
        if not self.at_least(role, a.approvers):
            raise ApprovalError(
                "forbidden", f"approval {a.id}: only {a.approvers}s may decide (you are {role})"
            )
        if decision == "approve" and approver_id == a.asker_id and not a.self_approve:
            raise ApprovalError(
                "self", f"approval {a.id}: you asked for this call; someone else must approve it"
            )
        reason = " ".join((reason or "").split())[:300] or None
        done, _ = await self._resolve(
            a, "approved" if decision == "approve" else "denied", approver, approver_id, reason
        )
        if done.decision != ("approved" if decision == "approve" else "denied") or (
            done.approver_id != approver_id
        ):
            raise ApprovalError("not_pending", f"approval {a.id} is already {done.decision}")
        log.info("approval %s (%s) %s by %s", a.id, a.tool, done.decision, approver_id)
        return done

    # -- after a restart -------------------------------------------------------------------------
    async def awaiting(self, conversation_id: str, run_id: str) -> set[str]:
        """The call ids of ``run_id`` whose approval a restart left pending (and
        not expired): the resumed turn asks again from the stored call."""
        if self.store is None or not self.rules:
            return set()
        try:
            rows = await self._store().approvals(conversation_id=conversation_id, state="pending")
        except NotImplementedError:
            return set()
        now = time.time()
        return {
            a.call_id
            for a in rows
            if a.run_id == run_id
            and a.created_at < self._born
            and a.serial not in self._waiting
            and a.expires_at > now
        }

    async def leftovers(self) -> list[Approval]:
        """Pending approvals no turn of this process waits for (a restart cut them off)."""
        rows = await self._store().approvals(state="pending")
        return [a for a in rows if a.serial not in self._waiting]

    async def expire(self, parts: PartsLike | None, a: Approval, reason: str) -> Approval:
        """Expire a pending approval no turn waits for; ``approval_resolved`` when ``parts``
        (once: only the call whose decision is recorded emits it)."""
        done, won = await self._resolve(a, "expired", None, None, reason)
        if parts is not None and won:
            self._emit_resolved(parts, a.run_id, done)
        return done

    async def run_ended(
        self, parts: PartsLike, run_id: str, *, reason: str = WENT_ON_WITHOUT_IT
    ) -> None:
        """A turn ended: approvals it left pending (it did not ask again) expire."""
        if self.store is None or not self.rules:
            return
        for a in await self._store().approvals(conversation_id=parts.id, state="pending"):
            if a.run_id == run_id and a.serial not in self._waiting:
                await self.expire(parts, a, reason)

    async def recent(self, *, limit: int = 50, scope: str | None = None) -> Sequence[Approval]:
        """The most recent approvals (every state), newest first."""
        rows = await self._store().approvals(scope=scope, limit=limit, newest_first=True)
        return rows
