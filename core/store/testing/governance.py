"""The governance aggregate: roles granted in chat, channel settings, budget counters."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .kit import ContractBase

__all__ = ["GovernanceContract"]


class GovernanceContract(ContractBase):
    """Grants and their audit, channel settings and their audit, budget counters."""

    # -- access grants ----------------------------------------------------------------------
    async def test_a_grant_reads_back_by_identity(self, store: Any) -> None:
        before = time.time()
        await store.access_set("irc:zed", "admin", by="owner")
        await store.access_set("irc:amy", "user", by="owner", channel="irc:n:#c")
        grants = await store.access_grants()
        assert [(g.identity, g.role, g.granted_by) for g in grants] == [
            ("irc:amy", "user", "owner"),
            ("irc:zed", "admin", "owner"),
        ]
        assert all(before - 1 <= g.granted_at <= time.time() + 1 for g in grants)

    async def test_a_new_grant_replaces_the_old(self, store: Any) -> None:
        await store.access_set("irc:bob", "user", by="a")
        await store.access_set("irc:bob", "ignored", by="b")
        [g] = await store.access_grants()
        assert (g.role, g.granted_by) == ("ignored", "b")

    async def test_removing_a_grant(self, store: Any) -> None:
        await store.access_set("irc:bob", "admin", by="a")
        await store.access_set("irc:bob", None, by="a")
        assert await store.access_grants() == []

    async def test_every_role_change_is_audited_newest_first(self, store: Any) -> None:
        await store.access_set("irc:bob", "user", by="a", channel="irc:n:#c")
        await store.access_set("irc:bob", "admin", by="b")
        await store.access_set("irc:bob", None, by="c", channel="irc:n:#d")
        audit = await store.access_audit()
        assert [(c.actor, c.identity, c.old_role, c.new_role, c.channel) for c in audit] == [
            ("c", "irc:bob", "admin", None, "irc:n:#d"),
            ("b", "irc:bob", "user", "admin", None),
            ("a", "irc:bob", None, "user", "irc:n:#c"),
        ]
        assert audit[0].id > audit[1].id > audit[2].id

    async def test_the_access_audit_is_limited(self, store: Any) -> None:
        for n in range(5):
            await store.access_set(f"irc:u{n}", "user", by="a")
        audit = await store.access_audit(limit=2)
        assert [c.identity for c in audit] == ["irc:u4", "irc:u3"]

    async def test_removing_what_was_never_granted_is_audited(self, store: Any) -> None:
        await store.access_set("irc:bob", None, by="a")
        [c] = await store.access_audit()
        assert (c.old_role, c.new_role) == (None, None)
        assert await store.access_grants() == []

    # -- channel settings -------------------------------------------------------------------
    async def test_settings_read_back_by_key(self, store: Any) -> None:
        await store.set_channel_setting("k", "tools", '["a"]', actor="al", at=1.0)
        await store.set_channel_setting("k", "persona", '"pirate"', actor="bo", at=2.0)
        got = await store.channel_settings("k")
        assert [(s.channel_key, s.key, s.value, s.set_by, s.set_at) for s in got] == [
            ("k", "persona", '"pirate"', "bo", 2.0),
            ("k", "tools", '["a"]', "al", 1.0),
        ]

    async def test_setting_returns_the_old_value(self, store: Any) -> None:
        assert await store.set_channel_setting("k", "x", "1", actor="a", at=1.0) is None
        assert await store.set_channel_setting("k", "x", "2", actor="a", at=2.0) == "1"
        assert [s.value for s in await store.channel_settings("k")] == ["2"]

    async def test_unsetting(self, store: Any) -> None:
        await store.set_channel_setting("k", "x", "1", actor="a", at=1.0)
        assert await store.set_channel_setting("k", "x", None, actor="b", at=2.0) == "1"
        assert await store.channel_settings("k") == []

    async def test_unsetting_what_is_not_set_records_nothing(self, store: Any) -> None:
        assert await store.set_channel_setting("k", "x", None, actor="a", at=1.0) is None
        assert await store.channel_setting_changes() == []

    async def test_settings_are_per_channel(self, store: Any) -> None:
        await store.set_channel_setting("k1", "x", "1", actor="a", at=1.0)
        await store.set_channel_setting("k2", "x", "2", actor="a", at=1.0)
        assert [s.value for s in await store.channel_settings("k1")] == ["1"]
        assert [s.value for s in await store.channel_settings("k2")] == ["2"]
        assert await store.channel_settings("k3") == []

    async def test_setting_changes_are_audited_oldest_first(self, store: Any) -> None:
        await store.set_channel_setting("k", "x", "1", actor="a", at=1.0)
        await store.set_channel_setting("k", "x", "2", actor="b", at=2.0)
        await store.set_channel_setting("k", "x", None, actor="c", at=3.0)
        got = await store.channel_setting_changes("k")
        assert [(c.key, c.old_value, c.new_value, c.actor, c.at) for c in got] == [
            ("x", None, "1", "a", 1.0),
            ("x", "1", "2", "b", 2.0),
            ("x", "2", None, "c", 3.0),
        ]
        assert got[0].id < got[1].id < got[2].id

    async def test_setting_changes_filter_and_keep_the_last(self, store: Any) -> None:
        for n in range(4):
            await store.set_channel_setting("k1", "x", str(n), actor="a", at=float(n))
        await store.set_channel_setting("k2", "y", "z", actor="a", at=9.0)
        assert [c.new_value for c in await store.channel_setting_changes("k1", limit=2)] == [
            "2",
            "3",
        ]
        everything = await store.channel_setting_changes()
        assert [c.channel_key for c in everything] == ["k1"] * 4 + ["k2"]

    # -- budget counters ----------------------------------------------------------------------
    async def test_budget_counters_add_up(self, store: Any) -> None:
        await store.budget_add(
            [("identity", "bob", "tokens", 100, 5), ("identity", "bob", "tokens", 100, 7)]
        )
        await store.budget_add([("identity", "bob", "tokens", 100, 1)])
        got = await store.budget_usage([("identity", "bob")], {"tokens": 100})
        assert got == {("identity", "bob", "tokens"): 13}

    async def test_budget_usage_reads_each_kinds_window(self, store: Any) -> None:
        await store.budget_add(
            [
                ("identity", "bob", "tokens", 100, 5),
                ("identity", "bob", "tokens", 200, 6),
                ("identity", "bob", "messages", 10, 1),
                ("channel", "k", "tokens", 200, 9),
            ]
        )
        got = await store.budget_usage(
            [("identity", "bob"), ("channel", "k")], {"tokens": 200, "messages": 10}
        )
        assert got == {
            ("identity", "bob", "tokens"): 6,
            ("identity", "bob", "messages"): 1,
            ("channel", "k", "tokens"): 9,
        }

    async def test_an_unused_budget_reads_nothing(self, store: Any) -> None:
        assert await store.budget_usage([("identity", "nobody")], {"tokens": 1}) == {}
        assert await store.budget_usage([], {"tokens": 1}) == {}
        await store.budget_add([("identity", "bob", "tokens", 1, 3)])
        assert await store.budget_usage([("identity", "bob")], {}) == {}

    async def test_budget_prune_drops_old_windows_per_kind(self, store: Any) -> None:
        await store.budget_add(
            [
                ("identity", "bob", "tokens", 100, 1),
                ("identity", "bob", "tokens", 200, 2),
                ("identity", "bob", "messages", 100, 3),
            ]
        )
        assert await store.budget_prune({"tokens": 200}) == 1
        assert await store.budget_rows(0) == [
            ("identity", "bob", "messages", 100, 3),
            ("identity", "bob", "tokens", 200, 2),
        ]
        assert await store.budget_prune({"tokens": 200}) == 0

    async def test_budget_rows_since_a_window_sorted(self, store: Any) -> None:
        await store.budget_add(
            [
                ("identity", "zed", "tokens", 300, 1),
                ("channel", "k", "messages", 300, 2),
                ("identity", "amy", "tokens", 300, 3),
                ("identity", "amy", "tokens", 100, 4),
                ("identity", "amy", "tokens", 400, 5),
            ]
        )
        assert await store.budget_rows(300) == [
            ("channel", "k", "messages", 300, 2),
            ("identity", "amy", "tokens", 300, 3),
            ("identity", "amy", "tokens", 400, 5),
            ("identity", "zed", "tokens", 300, 1),
        ]

    async def test_budget_counters_are_per_subject(self, store: Any) -> None:
        await store.budget_add(
            [("identity", "a", "tokens", 1, 1), ("identity", "b", "tokens", 1, 2)]
        )
        assert await store.budget_usage([("identity", "a")], {"tokens": 1}) == {
            ("identity", "a", "tokens"): 1
        }

    # -- budget takes: check and add as one step ------------------------------------------------
    async def test_a_budget_take_adds_below_the_ceiling(self, store: Any) -> None:
        await store.budget_add([("identity", "bob", "messages", 60, 1)])
        taken = await store.budget_take(
            [("identity", "bob", "messages", 60, 2), ("channel", "k", "tokens", 0, 10)],
            [("identity", "bob", "messages", 60, 1), ("channel", "k", "messages", 60, 1)],
        )
        assert taken is None
        assert await store.budget_rows(0) == [
            ("channel", "k", "messages", 60, 1),
            ("identity", "bob", "messages", 60, 2),
        ]

    async def test_a_budget_take_at_the_ceiling_adds_nothing(self, store: Any) -> None:
        await store.budget_add([("channel", "k", "tokens", 0, 10)])
        checks = [("identity", "bob", "messages", 60, 5), ("channel", "k", "tokens", 0, 10)]
        rows = [("identity", "bob", "messages", 60, 1), ("channel", "k", "messages", 60, 1)]
        # The first check that fails, with its counter; nothing is added.
        assert await store.budget_take(checks, rows) == (1, 10)
        assert await store.budget_rows(0) == [("channel", "k", "tokens", 0, 10)]
        # A counter that does not exist is 0: a ceiling of 0 fails on it.
        assert await store.budget_take([("identity", "amy", "tokens", 0, 0)], rows) == (0, 0)
        assert await store.budget_rows(0) == [("channel", "k", "tokens", 0, 10)]

    async def test_a_budget_take_checks_each_window(self, store: Any) -> None:
        await store.budget_add([("identity", "bob", "messages", 60, 3)])
        rows = [("identity", "bob", "messages", 120, 1)]
        # Last minute's counter is full; this minute's is empty.
        assert await store.budget_take([("identity", "bob", "messages", 60, 3)], rows) == (0, 3)
        assert await store.budget_take([("identity", "bob", "messages", 120, 3)], rows) is None
        assert await store.budget_take([], [("identity", "bob", "messages", 120, 2)]) is None
        got = await store.budget_usage([("identity", "bob")], {"messages": 120})
        assert got == {("identity", "bob", "messages"): 3}

    async def test_concurrent_budget_takes_at_the_edge_pass_once(self, store: Any) -> None:
        await store.budget_add([("identity", "bob", "messages", 60, 1)])
        check = [("identity", "bob", "messages", 60, 2), ("channel", "k", "messages", 60, 9)]
        rows = [("identity", "bob", "messages", 60, 1), ("channel", "k", "messages", 60, 1)]
        results = await asyncio.gather(*(store.budget_take(check, rows) for _ in range(2)))
        assert sorted(results, key=repr) == [(0, 2), None]
        assert await store.budget_rows(0) == [
            ("channel", "k", "messages", 60, 1),
            ("identity", "bob", "messages", 60, 2),
        ]

    async def test_a_budget_take_counts_the_held_counters_not_expired(self, store: Any) -> None:
        """Reservations of running turns (kind ``tokens_held``, window: when they
        expire) count against a ``tokens`` check from the window given on."""
        await store.budget_add([("identity", "bob", "tokens", 0, 30)])
        held = ("tokens", "tokens_held", 100)
        check = [("identity", "bob", "tokens", 0, 100)]
        reserve = [("identity", "bob", "tokens_held", 110, 60)]
        assert await store.budget_take(check, reserve, held=held) is None  # 30 < 100
        # 30 counted + 60 held < 100: passes, holds 60 more.
        assert await store.budget_take(check, reserve, held=held) is None
        # 30 + 120 held: refused, with what counts; nothing added.
        assert await store.budget_take(check, reserve, held=held) == (0, 150)
        # Held counters whose window is before the one given have lapsed.
        assert await store.budget_take(check, reserve, held=("tokens", "tokens_held", 111)) is None
        # Settled: given back, they count no more.
        await store.budget_add([("identity", "bob", "tokens_held", 110, -180)])
        assert await store.budget_take(check, [], held=held) is None
        # Another subject's held counters are not counted.
        await store.budget_add([("identity", "amy", "tokens_held", 110, 500)])
        assert await store.budget_take(check, [], held=held) is None

    async def test_concurrent_budget_takes_with_held_tokens_pass_once(self, store: Any) -> None:
        check = [("channel", "k", "tokens", 0, 100)]
        rows = [("channel", "k", "tokens_held", 50, 100)]
        held = ("tokens", "tokens_held", 10)
        results = await asyncio.gather(
            *(store.budget_take(check, rows, held=held) for _ in range(4))
        )
        assert results.count(None) == 1

    async def test_many_concurrent_budget_takes_never_overshoot(self, store: Any) -> None:
        check = [("channel", "k", "messages", 60, 5)]
        rows = [("channel", "k", "messages", 60, 1), ("identity", "x", "messages", 60, 1)]
        results = await asyncio.gather(*(store.budget_take(check, rows) for _ in range(12)))
        assert results.count(None) == 5
        assert await store.budget_usage([("channel", "k")], {"messages": 60}) == {
            ("channel", "k", "messages"): 5
        }
