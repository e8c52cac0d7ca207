import pytest

from trainer.resend import SentUpdates


class Syncd:
    """Stands in for the published handled seqs and syncd's lease (pure code's unit test)."""

    def __init__(self):
        self.handled: dict[int, int] = {}
        self.holder: str | None = "1:syncd-a"


def sent(syncd: Syncd, keep: int = 2) -> SentUpdates:
    return SentUpdates(lambda p: syncd.handled.get(p, -1), lambda: syncd.holder, keep)


def test_nothing_is_sent_again_while_the_same_syncd_holds_the_run():
    syncd = Syncd()
    s = sent(syncd)
    s.add(0, 4, b"u4")

    assert s.to_send_again() == []


def test_what_is_not_handled_is_sent_again_once_the_lease_changes_hands():
    syncd = Syncd()
    s = sent(syncd)
    s.add(0, 4, b"f0-4")
    s.add(1, 6, b"f1-6")
    s.add(0, 8, b"f0-8")
    syncd.handled = {0: 4}
    syncd.holder = "2:syncd-b"  # a restarted syncd: a new fencing token

    assert s.to_send_again() == [(0, 8, b"f0-8"), (1, 6, b"f1-6")]
    assert s.to_send_again() == []  # once per change of hands
    syncd.handled = {0: 8, 1: 6}
    syncd.holder = "3:syncd-c"
    assert s.to_send_again() == []  # handled: forgotten


def test_no_syncd_holding_the_run_sends_nothing_until_one_does():
    syncd = Syncd()
    s = sent(syncd)
    s.add(0, 4, b"u4")
    syncd.holder = None

    assert s.to_send_again() == []
    syncd.holder = "2:syncd-b"
    assert s.to_send_again() == [(0, 4, b"u4")]


def test_it_keeps_at_most_its_bound_per_fragment_the_newest():
    syncd = Syncd()
    s = sent(syncd, keep=2)
    for seq in (4, 8, 12):
        s.add(0, seq, f"u{seq}".encode())
    syncd.holder = "2:syncd-b"

    assert s.to_send_again() == [(0, 8, b"u8"), (0, 12, b"u12")]
    with pytest.raises(ValueError, match="at least 1"):
        sent(syncd, keep=0)


def test_a_send_waits_once_the_kept_updates_of_its_fragment_are_not_handled():
    """Backpressure: two updates of fragment 0 not handled, a third must wait; fragment
    1, with one, need not; a handled seq settles every send up to it."""
    syncd = Syncd()
    s = sent(syncd)
    s.add(0, 10, b"f0-10")
    s.add(0, 20, b"f0-20")
    s.add(1, 15, b"f1-15")

    assert s.must_wait(0) and not s.must_wait(1)
    syncd.handled = {0: 10}
    assert not s.must_wait(0) and s.unhandled(0) == 1
    syncd.handled = {0: 20}
    assert s.unhandled(0) == 0


def test_a_healthy_island_whose_updates_merge_a_round_late_never_waits():
    syncd = Syncd()
    s = sent(syncd)
    for seq in range(10, 200, 10):
        assert not s.must_wait(0)
        s.add(0, seq, b"update")
        syncd.handled = {0: seq - 10}  # the update before this one is merged
