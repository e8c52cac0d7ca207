"""Downloads of merged fragments off the training thread (trainer/downloads.py), with
plain callables standing in for Redis and the link."""

import threading
import time

import pytest
import torch

from diloco.synchronizer import Published
from trainer.downloads import RETRY_S, Downloads, GlobalMissing, NotReadable


def message(version: int) -> Published:
    return Published(version, 0.0, "none", {"w": torch.full((2,), float(version))})


class Syncd:
    """What the downloads thread asks of syncd's side: handled seqs and messages."""

    def __init__(self):
        self.handled_seq = -1
        self.version = 1
        self.release = threading.Event()
        self.release.set()
        self.fetches = 0

    def handled(self, fragment: int, seq: int) -> bool:
        return self.handled_seq >= seq

    def fetch(self, fragment: int, version: int) -> tuple[int, list[Published], int]:
        self.release.wait(30)
        self.fetches += 1
        if self.version <= version:
            return version, [], 0
        return self.version, [message(self.version)], 1000


def downloads(syncd: Syncd, link_s: float = 0.0, sleeps: list | None = None,
              stopping=lambda: False) -> Downloads:
    return Downloads(syncd.fetch, syncd.handled, lambda nbytes: link_s, lambda: None,
                     stopping, sleep=(sleeps.append if sleeps is not None else time.sleep))


def test_a_download_starts_only_once_syncd_handled_the_update():
    syncd = Syncd()
    d = downloads(syncd)
    d.request(0, seq=10, version=0)
    assert d.take(0) is None
    syncd.handled_seq = 10
    download = d.wait(0)
    assert (download.fragment, download.version, download.nbytes) == (0, 1, 1000)
    assert torch.equal(download.published[0].payload["w"], torch.ones(2))


def test_the_training_thread_is_never_held_by_a_download_in_flight():
    syncd = Syncd()
    syncd.handled_seq = 10
    syncd.release.clear()  # the read is slow: it has not returned yet
    d = downloads(syncd)
    d.request(0, seq=10, version=0)
    assert d.take(0) is None  # at once, while the thread is inside the read
    syncd.release.set()
    assert d.wait(0).version == 1
    assert d.take(0) is None  # handed over once


def test_a_download_takes_the_links_time_on_top_of_the_read_check_and_decode():
    syncd = Syncd()
    syncd.handled_seq = 10
    sleeps: list[float] = []
    d = downloads(syncd, link_s=30.0, sleeps=sleeps)
    d.request(0, seq=10, version=0)
    download = d.wait(0)
    assert sleeps == [30.0]
    assert download.seconds >= download.read_s  # the fake sleep took no time itself


def test_nothing_newer_arrives_as_the_islands_own_version_without_messages():
    syncd = Syncd()
    syncd.handled_seq, syncd.version = 10, 3
    d = downloads(syncd)
    d.request(1, seq=10, version=3)  # syncd refused the update: no version 4
    download = d.wait(1)
    assert (download.version, download.published, download.nbytes) == (3, [], 0)


def test_a_fragment_asked_for_twice_is_downloaded_once():
    syncd = Syncd()
    syncd.handled_seq = 20
    d = downloads(syncd)
    d.request(0, seq=10, version=0)
    d.request(0, seq=20, version=0)
    d.wait(0)
    d.request(2, seq=20, version=0)
    d.wait(2)  # requests go in order: fragment 0's second request would come first
    assert syncd.fetches == 2


def test_cancel_forgets_the_downloads_asked_for():
    syncd = Syncd()
    d = downloads(syncd)
    d.request(0, seq=10, version=0)
    d.cancel()
    syncd.handled_seq = 10
    d.request(1, seq=10, version=0)
    assert d.wait(1).fragment == 1
    assert d.take(0) is None  # fetched or not, what it brought is dropped


def test_a_missing_global_is_raised_on_the_training_thread():
    def fetch(fragment: int, version: int):
        raise GlobalMissing("global fragment 0 is missing from Redis")

    d = Downloads(fetch, lambda p, seq: True, lambda n: 0.0, lambda: None, lambda: False)
    d.request(0, seq=1, version=0)
    with pytest.raises(GlobalMissing, match="missing"):
        d.wait(0)


def test_a_wait_ends_when_the_island_stops():
    stop = threading.Event()
    d = downloads(Syncd(), stopping=stop.is_set)
    d.request(0, seq=10, version=0)  # never handled
    threading.Timer(0.1, stop.set).start()
    assert d.wait(0) is None


def test_a_fragment_that_cannot_be_read_now_is_read_again_instead_of_failing():
    syncd = Syncd()
    syncd.handled_seq = 10
    failures = [NotReadable("syncd's server is gone"), NotReadable("still gone")]
    fetch = syncd.fetch

    def flaky(fragment: int, version: int):
        if failures:
            raise failures.pop(0)
        return fetch(fragment, version)

    sleeps: list[float] = []
    d = Downloads(flaky, syncd.handled, lambda nbytes: 0.0, lambda: None, lambda: False,
                  sleep=sleeps.append)
    d.request(0, seq=10, version=0)

    download = d.wait(0)

    assert download.version == 1 and d.error is None
    assert sleeps[:2] == [RETRY_S, RETRY_S]  # a pause before each try again
