"""Upload slots (syncd.upload_slots): tickets, and which ones syncd takes off."""

from syncd.upload_slots import (
    SLOT_START_S,
    SLOT_TIMEOUT_S,
    RunFacts,
    SlotKeeper,
    Ticket,
    crowded,
    publish_ticket,
    stale,
)


def facts(epochs: dict[str, int], lost: frozenset[str] = frozenset(),
          handled: dict[tuple[str, int], int] | None = None) -> RunFacts:
    """Islands a and b, in these epochs, these lost, these seqs handled."""
    return RunFacts({"a", "b"}, epochs, set(lost),
                    lambda island, p: (handled or {}).get((island, p), -1), fencing_token=5)


def test_a_ticket_names_its_update_and_reads_back_whatever_its_islands_name():
    ticket = Ticket("us:east/1", 3, 2, 40)

    assert ticket.encode() == "3:2:40:us:east/1"
    assert Ticket.parse(ticket.encode().encode()) == ticket


def test_what_is_not_a_ticket_parses_to_none():
    for raw in (b"", b"1:2:3", b"1:2:x:a", b"1:2:3:", b"-1:2:3:a", "é:1:2:a".encode()):
        assert Ticket.parse(raw) is None


def test_a_ticket_of_an_alive_island_in_its_epoch_is_not_stale_until_its_timeout():
    raw = Ticket("a", 2, 0, 8).encode().encode()

    assert not stale(raw, 100.0, 100.0 + SLOT_TIMEOUT_S - 1, facts({"a": 2}))
    assert stale(raw, 100.0, 100.0 + SLOT_TIMEOUT_S, facts({"a": 2}))


def test_a_ticket_whose_update_is_not_written_holds_its_slot_only_until_its_start():
    raw = Ticket("a", 2, 0, 8).encode().encode()

    assert not stale(raw, 100.0, 100.0 + SLOT_START_S - 1, facts({"a": 2}), written=False)
    assert stale(raw, 100.0, 100.0 + SLOT_START_S, facts({"a": 2}), written=False)
    assert not stale(raw, 100.0, 100.0 + SLOT_START_S, facts({"a": 2}), written=True)
    keeper = SlotKeeper()
    assert keeper.stale([raw], 0.0, facts({"a": 2}), [False]) == []
    assert keeper.stale([raw], SLOT_START_S, facts({"a": 2}), [False]) == [raw]


def test_a_ticket_of_a_lost_island_an_older_epoch_a_handled_update_or_a_stranger_is_stale():
    def of(island: str, epoch: int, seq: int = 8) -> bytes:
        return Ticket(island, epoch, 0, seq).encode().encode()

    assert stale(of("a", 1), 0.0, 0.0, facts({"a": 2}))
    assert stale(of("a", 2), 0.0, 0.0, facts({"a": 2}, lost=frozenset({"a"})))
    assert stale(of("z", 2), 0.0, 0.0, facts({"z": 2}))
    assert stale(b"garbage", 0.0, 0.0, facts({}))
    assert stale(of("a", 2, seq=8), 0.0, 0.0, facts({"a": 2}, handled={("a", 0): 8}))
    assert not stale(of("a", 2, seq=12), 0.0, 0.0, facts({"a": 2}, handled={("a", 0): 8}))
    assert not stale(of("b", 5), 0.0, 0.0, facts({"a": 2}))  # its epoch not read yet


def test_a_publish_ticket_of_this_grant_is_stale_only_after_its_timeout_another_at_once():
    mine, before = (publish_ticket(token, 1, 40).encode() for token in (5, 4))

    assert Ticket.parse(mine) is None
    assert not stale(mine, 100.0, 100.0 + SLOT_TIMEOUT_S - 1, facts({}))
    assert stale(mine, 100.0, 100.0 + SLOT_TIMEOUT_S, facts({}))
    assert stale(before, 100.0, 100.0, facts({}))  # a syncd that died publishing
    assert stale(b"publish:", 100.0, 100.0, facts({}))


def test_the_keeper_times_a_slot_from_when_it_first_saw_its_ticket_hold_it():
    keeper = SlotKeeper()
    first, second = (Ticket("a", 1, 0, s).encode().encode() for s in (8, 16))

    alive = facts({"a": 1})

    assert keeper.stale([first], 0.0, alive) == []
    assert keeper.stale([first, second], SLOT_TIMEOUT_S - 1, alive) == []
    assert keeper.stale([first, second], SLOT_TIMEOUT_S, alive) == [first]
    # A ticket that left and came back is timed afresh.
    assert keeper.stale([second], SLOT_TIMEOUT_S, alive) == []
    assert keeper.stale([first], SLOT_TIMEOUT_S + 1, alive) == []


def test_an_island_with_two_tickets_of_unwritten_updates_loses_all_of_them():
    """An island queues its next ticket only once its last update is written: a second
    ticket of an unwritten update in its name was queued by another, wherever it is."""
    def of(island: str, seq: int, epoch: int = 1) -> bytes:
        return Ticket(island, epoch, 0, seq).encode().encode()

    queue = [of("a", 8), of("a", 10**9), of("b", 8), of("a", 12), of("b", 12, epoch=9),
             of("z", 1), of("z", 2), b"junk", publish_ticket(5, 0, 3).encode(), of("b", 16)]
    written = [True, False, True, False, False, False, False, False, False, False]

    taken = crowded(queue, written, {"a", "b"})

    assert taken == {"a": [of("a", 10**9), of("a", 12)],
                     "b": [of("b", 12, epoch=9), of("b", 16)]}
    assert crowded(queue[:3], written[:3], {"a", "b"}) == {}  # one unwritten each at most
    assert crowded([of("a", 8)] * 3, [False] * 3, {"a"}) == {}  # the same ticket, once
