"""``agentik webhooks …``: dead letters and deliveries still being retried, listed and
replayed (issue 35).  Works on the bot's database while it runs: a replayed delivery
is sent by the running bot at its next round."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from agentik.core.errors import ConfigError

from .webhooks import printable

if TYPE_CHECKING:
    from agentik.core.store.base import Store
    from agentik.core.store.records import WebhookDelivery, WebhookState

__all__ = ["add_parser", "webhooks_command"]


def add_parser(sub: Any, with_config: Any) -> None:
    """The ``webhooks`` command and its actions, on the CLI's subparsers ``sub``."""
    wh = sub.add_parser("webhooks", help="webhook deliveries: dead letters, retries, replay")
    wsub = wh.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, helptext in (
        ("dead-letters", "deliveries given up after their last retry"),
        ("pending", "deliveries still to send (or being retried)"),
    ):
        sp = with_config(wsub.add_parser(name, help=helptext))
        sp.add_argument("--webhook", help="only this [[webhooks]] name")
        sp.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
        sp.add_argument("--json", action="store_true", help="one JSON object per line, body too")
    rp = with_config(wsub.add_parser("replay", help="send dead letters again (same delivery id)"))
    rp.add_argument("ids", nargs="*", metavar="ID", help="delivery ids (dead-letters lists them)")
    rp.add_argument("--all", action="store_true", help="every dead letter")


async def webhooks_command(args: argparse.Namespace, store: Store) -> int:
    """Carry out ``agentik webhooks <action>`` on ``store`` (started)."""
    if args.action == "replay":
        if bool(args.ids) == bool(args.all):
            raise ConfigError("webhooks replay: name delivery ids, or --all (not both)")
        dead = {d.id for d in await store.webhook_deliveries(state="dead", limit=1_000_000)}
        unknown = [i for i in args.ids if i not in dead]
        count = await store.webhook_replay(None if args.all else args.ids, now=time.time())
        print(f"replayed {count} dead letter(s): the running bot sends them at its next round")
        for i in unknown:
            print(f"  {printable(i)}: not a dead letter (unknown, or pending already)")
        return 1 if unknown else 0
    state: WebhookState = "dead" if args.action == "dead-letters" else "pending"
    rows = await store.webhook_deliveries(
        state=state, webhook=args.webhook, limit=max(0, args.limit)
    )
    if args.json:
        for d in rows:
            print(json.dumps(_as_dict(d), ensure_ascii=False))
        return 0
    what = "dead letters" if state == "dead" else "pending deliveries"
    print(f"{what}: {len(rows) or 'none'}")
    for d in rows:
        print("  " + _line(d))
    return 0


def _as_dict(d: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": d.id, "webhook": d.webhook, "event": d.event_kind,
        "conversation_id": d.conversation_id, "state": d.state, "attempts": d.attempts,
        "created_at": d.created_at, "next_at": d.next_at, "finished_at": d.finished_at,
        "last_error": d.last_error, "body": json.loads(d.body),
    }  # fmt: skip


def _line(d: WebhookDelivery) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.created_at))
    if d.state == "dead":
        status = f"gave up after {d.attempts} attempt(s)"
    else:
        due = max(0.0, d.next_at - time.time())
        status = f"{d.attempts} attempt(s), next in {due:.0f}s"
    why = f": {printable(d.last_error)}" if d.last_error else ""
    return (
        f"{d.id}  {when}  {printable(d.webhook)}  {d.event_kind}"
        f"  conversation {printable(d.conversation_id)}  {status}{why}"
    )
