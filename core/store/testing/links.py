"""Linked channels: links made at run time and the persistent message map (issue 33)."""

from __future__ import annotations

from typing import Any

from ..records import LinkMessage, LinkRecord
from .kit import ContractBase

__all__ = ["LinksContract"]


class LinksContract(ContractBase):
    """``link_save``/``link_delete``/``links`` keep run-time links; ``link_map_*`` keep
    every copy of a relayed message, found by its canonical id or by a channel's id."""

    async def test_links_are_saved_replaced_and_deleted(self, store: Any) -> None:
        assert await store.links() == []
        team = LinkRecord(
            name="team", channels=("irc:libera:#team", "slack:T1:C1"),
            options={"relay": True, "answer": "asked"}, created_by="alice", created_at=5.0,
        )  # fmt: skip
        await store.link_save(team)
        await store.link_save(LinkRecord(name="ops", channels=("irc:x:#ops",), created_at=6.0))
        assert [link.name for link in await store.links()] == ["ops", "team"]
        assert (await store.links())[1] == team
        # Saving under the same name replaces it.
        wider = LinkRecord(name="team", channels=(*team.channels, "http:web:team"), created_at=7.0)
        await store.link_save(wider)
        assert (await store.links())[1] == wider
        assert await store.link_delete("team") is True
        assert await store.link_delete("team") is False
        assert [link.name for link in await store.links()] == ["ops"]

    async def test_a_links_options_keep_their_nested_values(self, store: Any) -> None:
        # ``!link team icons.libera=:irc:``: a network's icon is a table in the options;
        # changing the link in chat saves it again under its name.
        icons = {"libera": ":speech_balloon:", "web": "https://example.org/w.png?a=1&b=é"}
        team = LinkRecord(
            name="team", channels=("irc:libera:#team", "slack:T1:C1"),
            options={"icons": icons, "history": 3, "opt_out_prefix": "[nr]"},
            created_by="slack:T1:U9", created_at=5.0,
        )  # fmt: skip
        await store.link_save(team)
        assert await store.links() == [team]
        fewer = LinkRecord(
            name="team", channels=team.channels, options={"icons": {"libera": ":irc:"}},
            created_by="slack:T1:U9", created_at=6.0,
        )  # fmt: skip
        await store.link_save(fewer)
        assert await store.links() == [fewer]

    async def test_the_message_map_keeps_every_copy_and_learns_their_ids(self, store: Any) -> None:
        origin = LinkMessage(
            link="team", canonical="m1", channel_key="slack:T1:C1", ref="1700.1", origin=True,
            created_at=1.0,
        )  # fmt: skip
        copy = LinkMessage(
            link="team", canonical="m1", channel_key="irc:libera:#team", run_id="relay:m1",
            piece=0, created_at=1.0,
        )  # fmt: skip
        await store.link_map_add([copy, origin])
        assert await store.link_map("m1") == [origin, copy]
        assert await store.link_map_find("slack:T1:C1", "1700.1") == "m1"
        assert await store.link_map_find("irc:libera:#team", "abc") is None
        # The copy's id, once its channel gave one; a later row without an id keeps it.
        await store.link_map_add([LinkMessage(**{**_fields(copy), "ref": "abc"})])
        await store.link_map_add([copy])
        assert await store.link_map_find("irc:libera:#team", "abc") == "m1"
        assert [m.ref for m in await store.link_map("m1")] == ["1700.1", "abc"]
        assert await store.link_map("nothing") == []
        await store.link_map_add([])

    async def test_the_message_map_outlives_its_link(self, store: Any) -> None:
        await store.link_save(LinkRecord(name="t", channels=("a:b:c",), created_at=1.0))
        row = LinkMessage(link="t", canonical="x", channel_key="a:b:c", ref="r", origin=True)
        await store.link_map_add([row])
        await store.link_delete("t")
        assert await store.link_map("x") == [row]


def _fields(m: LinkMessage) -> dict[str, Any]:
    return {f: getattr(m, f) for f in m.__slots__}
