"""The live event stream: replay after reconnect, gaps, slow subscribers."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.eventbus import EventBus, ReplayBuffer
from agentik.core.events import Event, EventsLost, TextDelta, TurnEnded
from agentik.core.services import event_weight


def make_bus(buffer=5, max_pending=100, seal_every=None):
    return EventBus(
        key=lambda e: e.seq,
        lost=lambda e, after, oldest: EventsLost(
            conversation_id="c", requested_after=after, oldest_seq=oldest
        ),
        buffer=buffer,
        max_pending=max_pending,
        seal_every=seal_every,
    )


def ev(seq):
    return TextDelta(conversation_id="c", seq=seq, text=str(seq))


async def drain(sub, n):
    return [await asyncio.wait_for(anext(sub), 60) for _ in range(n)]


async def test_live_subscriber_gets_events_in_order():
    bus = make_bus()
    sub = bus.subscribe()
    for i in range(1, 4):
        bus.publish(ev(i))
    assert [e.seq for e in await drain(sub, 3)] == [1, 2, 3]


async def test_reconnect_replays_missed_events_then_live():
    bus = make_bus(buffer=10)
    for i in range(1, 6):
        bus.publish(ev(i))
    sub = bus.subscribe(after=3)
    bus.publish(ev(6))
    assert [e.seq for e in await drain(sub, 3)] == [4, 5, 6]


async def test_reconnect_beyond_buffer_is_told_about_the_gap():
    bus = make_bus(buffer=3)
    for i in range(1, 11):
        bus.publish(ev(i))
    sub = bus.subscribe(after=2)
    got = await drain(sub, 4)
    assert got[0].kind == "events_lost"
    assert got[0].requested_after == 2 and got[0].oldest_seq == 8
    assert [e.seq for e in got[1:]] == [8, 9, 10]


async def test_reconnect_from_a_future_sequence_is_a_gap():
    """A cursor from before a restart (ahead of this process) cannot be served."""
    bus = make_bus()
    bus.publish(ev(1))
    sub = bus.subscribe(after=500)
    assert (await drain(sub, 1))[0].kind == "events_lost"


async def test_up_to_date_reconnect_has_no_gap():
    bus = make_bus(buffer=3)
    for i in range(1, 11):
        bus.publish(ev(i))
    sub = bus.subscribe(after=10)
    bus.publish(ev(11))
    assert [e.seq for e in await drain(sub, 1)] == [11]


async def test_slow_subscriber_is_cut_off_not_the_publisher():
    bus = make_bus(buffer=1000, max_pending=10)
    slow = bus.subscribe()
    fast = bus.subscribe()
    for i in range(1, 51):
        bus.publish(ev(i))
        if i <= 10:
            assert (await anext(fast)).seq == i
    events = [e async for e in slow]
    assert [e.kind for e in events] == ["events_lost"]
    # It received nothing: everything from the start is what it lost, and
    # resubscribing after that point replays all of it from the buffer.
    assert events[0].requested_after == 0
    again = bus.subscribe(after=events[0].requested_after)
    assert [e.seq for e in await drain(again, 50)] == list(range(1, 51))


async def test_a_subscriber_cut_off_mid_stream_resumes_after_what_it_received():
    bus = make_bus(buffer=1000, max_pending=5)
    sub = bus.subscribe()
    for i in range(1, 4):
        bus.publish(ev(i))
    assert [e.seq for e in await drain(sub, 2)] == [1, 2]
    for i in range(4, 20):
        bus.publish(ev(i))
    rest = [e async for e in sub]
    assert [e.kind for e in rest] == ["events_lost"]
    assert rest[0].requested_after == 2  # 3 was queued but never received
    again = bus.subscribe(after=2)
    assert [e.seq for e in await drain(again, 17)] == list(range(3, 20))


async def test_a_small_queue_can_be_asked_for_per_subscriber():
    bus = make_bus(buffer=1000, max_pending=100)
    small = bus.subscribe(max_pending=3)
    big = bus.subscribe()
    for i in range(1, 11):
        bus.publish(ev(i))
    assert [e.kind for e in [e async for e in small]] == ["events_lost"]
    assert [e.seq for e in await drain(big, 10)] == list(range(1, 11))


async def test_close_ends_subscriptions_after_draining():
    bus = make_bus()
    sub = bus.subscribe()
    bus.publish(ev(1))
    bus.close()
    assert [e.seq async for e in sub] == [1]


async def test_kind_filter():
    bus = make_bus()
    sub = bus.subscribe(kinds={"turn_ended"})
    bus.publish(ev(1))
    bus.close()
    assert [e async for e in sub] == []


async def test_subscribers_who_join_or_leave_mid_stream_get_exactly_their_kinds():
    # Publishing remembers, per kind, who follows it: someone joining or leaving
    # after a kind was published must still get (or stop getting) it at once.
    bus = make_bus(buffer=100)
    texts = bus.subscribe(kinds={"text_delta"})
    ended = bus.subscribe(kinds={"turn_ended"})
    everything = bus.subscribe()
    bus.publish(ev(1))
    bus.publish(TurnEnded(conversation_id="c", seq=2))
    late = bus.subscribe(kinds={"text_delta", "turn_ended"})
    bus.publish(ev(3))
    bus.publish(TurnEnded(conversation_id="c", seq=4))
    assert [e.seq for e in await drain(texts, 2)] == [1, 3]
    await texts.aclose()
    bus.publish(ev(5))
    bus.close()
    assert [e.seq async for e in texts] == []
    assert [e.seq async for e in ended] == [2, 4]
    assert [e.seq async for e in everything] == [1, 2, 3, 4, 5]
    assert [e.seq async for e in late] == [3, 4, 5]


async def test_a_self_sealing_buffer_replays_events_it_cannot_pack_as_they_are():
    # A plugin's event may hold a value that does not pickle: the events packed
    # with it stay objects (and are not tried again), the others are packed, and
    # a replay still gives every one, in order.
    bus = make_bus(buffer=100, seal_every=4)
    published = [ev(i) for i in range(1, 11)]
    published[5] = TextDelta(conversation_id="c", seq=6, text=lambda: "no pickle")  # type: ignore[arg-type]
    for e in published:
        bus.publish(e)
    assert bus.buffer.sealed == 4  # 1-4 packed; 5-8 kept as they are; 9-10 not sealed yet
    replayed = await drain(bus.subscribe(after=0), 10)
    assert replayed == published
    assert replayed[5] is published[5]
    assert [e.seq for e in await drain(bus.subscribe(after=7), 3)] == [8, 9, 10]


def test_a_replay_buffers_weight_is_what_its_events_weigh_through_seals_and_edits():
    # The agent's memory budget reads each buffer's weight: it must stay what the
    # events held weigh, whether they were weighed on the way in or not, sealed,
    # pushed out by the length bound, edited (redaction) or cleared.
    buf = ReplayBuffer(6, key=lambda e: e.seq, weigh=event_weight)

    def held() -> int:
        return sum(map(event_weight, buf))

    for i in range(1, 4):
        buf.append(ev(i))
    buf.append(ev(4), event_weight(ev(4)))
    assert buf.weight() == held() > 0
    buf.seal()
    assert buf.sealed == 4 and buf.weight() == held()
    for i in range(5, 10):  # the oldest leave from the sealed blob
        buf.append(TextDelta(conversation_id="c", seq=i, text="x" * i * 10))
    assert len(buf) == 6 and buf.weight() == held()
    buf[-1] = TextDelta(conversation_id="c", seq=9, text="[redacted]")
    assert buf.weight() == held()
    buf.seal()
    for i in range(10, 20):  # and from the live events, none sealed
        buf.append(ev(i), event_weight(ev(i)))
    assert [e.seq for e in buf] == list(range(14, 20)) and buf.weight() == held()
    buf.clear()
    assert buf.weight() == 0


def test_a_replay_buffer_refuses_a_seal_size_below_one():
    # 0 would seal after every event and then fail to cut the events into blobs:
    # the mistake is named where it is made, not at the first event.
    for bad in (0, -4):
        with pytest.raises(ValueError, match="seal_every must be at least 1"):
            ReplayBuffer(6, key=lambda e: e.seq, weigh=event_weight, seal_every=bad)
    buf = ReplayBuffer(6, key=lambda e: e.seq, weigh=event_weight, seal_every=1)
    buf.append(ev(1))
    assert buf.sealed == 1 and [e.seq for e in buf] == [1]


async def test_sealed_turns_small_and_large_replay_equal_to_what_was_published():
    # Short turns are packed with a small compression window, long ones (tool outputs)
    # with zlib's default: both replay the events as published, however many seals
    # (against the process's compression dictionary) came before.
    bus = make_bus(buffer=1000, seal_every=10_000)  # sealed by hand, between turns
    published: list[Event] = []
    seq = 0
    for size in (10, 20, 9_000, 30, 60_000, 5):
        for _ in range(3):
            seq += 1
            text = "".join(f"{seq}:{i} " for i in range(size // 6))[:size]
            published.append(TextDelta(conversation_id="c", seq=seq, text=text))
            bus.publish(published[-1])
        bus.seal()
    assert bus.buffer.sealed == len(published)
    assert await drain(bus.subscribe(after=0), len(published)) == published
