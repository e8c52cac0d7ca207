"""An island's whole pulls of the globals (its first one in setup, warm or cold, and
elastic's after a whole-job restart) go over the emulated link as every later pull:
not while a partition cuts it, and in the larger of the real read and the link's time."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from diloco.config import EmulationConfig, IslandConfig
from diloco.protocol import encode_message
from diloco.signing import load_verify_key, publish_key, verify_key_hex
from trainer.emulation import FaultEmulation
from trainer.phases import StartClock
from trainer.pulling import PULL_AHEAD, Pulling

SECRET = b"first-pull"


class Faults:
    """The run's fault keys for one island: partitioned until `healed` is set."""

    def __init__(self) -> None:
        self.healed = threading.Event()

    def fault(self, island: str) -> dict:
        return {} if self.healed.is_set() else {"kind": "partition", "until": 0.0}

    def clear_fault(self, island: str) -> None:
        self.healed.set()


class Globals:
    """The store's global fragments: when each whole read happened."""

    def __init__(self) -> None:
        meta = {"run": 1, "fragment": 0, "version": 7, "base_version": 7, "codec": "none"}
        self.blob = encode_message("global", meta, {"w": torch.ones(4)}, publish_key(SECRET))
        self.reads: list[float] = []

    def full(self, p: int) -> bytearray:
        self.reads.append(time.monotonic())
        return self.blob


def runner(faults: Faults, store: Globals, latency_ms: float) -> SimpleNamespace:
    link = IslandConfig(name="a", region="us-east", latency_ms=latency_ms)
    emulation = FaultEmulation(faults, "a", link, EmulationConfig(), lambda: False)
    return SimpleNamespace(emulation=emulation, store=store, bytes_down=0,
                           verify_key=load_verify_key(verify_key_hex(SECRET)),
                           run_ended=lambda: False, stopping=lambda: False,
                           stop=lambda: None)


def test_the_first_pull_of_the_globals_pays_the_emulated_link_time():
    faults, store = Faults(), Globals()
    faults.healed.set()
    island = runner(faults, store, latency_ms=300.0)  # far above the real read
    clock = StartClock({"model": time.time()})

    started = time.monotonic()
    version, tensors = Pulling.full(island, 0)
    clock.mark("pull", time.time())

    assert version == 7 and torch.equal(tensors["w"], torch.ones(4))
    assert time.monotonic() - started >= 0.3
    assert clock.breakdown()["pull"] >= 0.3  # the "pull" phase shows it
    assert island.bytes_down == len(store.blob)


def test_the_first_pull_waits_while_a_partition_cuts_the_link():
    faults, store = Faults(), Globals()
    island = runner(faults, store, latency_ms=0.0)
    heal_at = time.monotonic() + 0.5
    threading.Timer(0.5, faults.healed.set).start()

    Pulling.full(island, 0)

    assert store.reads and store.reads[0] >= heal_at - 0.01  # nothing read while cut


def test_the_first_pull_reads_again_while_syncds_server_is_gone(monkeypatch):
    from syncd.bulk import BulkError
    from trainer import pulling as pulling_module

    faults, store = Faults(), Globals()
    faults.healed.set()
    gone = [BulkError("http://127.0.0.1:1/... could not be read: refused")]
    read = store.full

    def full(p: int) -> bytearray:
        if gone:
            raise gone.pop()
        return read(p)

    store.full = full
    monkeypatch.setattr(pulling_module, "RETRY_S", 0.01)
    island = runner(faults, store, latency_ms=0.0)

    version, _ = Pulling.full(island, 0)

    assert version == 7 and not gone and len(store.reads) == 1


class Taken:
    """The island's side of the first pull: which fragments it took in, on which thread."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(4, 4)
        self.taken: list[tuple[int, int, str]] = []

    def reset_fragment(self, p: int, tensors: dict, version: int) -> None:
        self.taken.append((p, version, threading.current_thread().name))


def test_the_first_pull_reads_on_a_thread_while_the_stepping_thread_faults_in_its_pages(
        monkeypatch):
    from trainer import pulling as pulling_module

    faults, store = Faults(), Globals()
    faults.healed.set()
    island = runner(faults, store, latency_ms=0.0)
    island.full = lambda p: (store.reads.append(threading.current_thread().name) or (7, {}))
    faulted = []
    monkeypatch.setattr(pulling_module, "fault_in", lambda like, copies: faulted.append(
        (threading.current_thread().name, len(list(like)), copies)))

    Pulling.pull_all(island, 3, Taken, lambda name: None)

    here = threading.current_thread().name
    assert faulted == [(here, 2, 3)]  # weight and bias, gradients and two moments
    assert island.island.taken == [(0, 7, here), (1, 7, here), (2, 7, here)]
    assert len(store.reads) == 3 and here not in store.reads


def test_a_first_pull_that_ends_the_island_ends_it_from_the_stepping_thread(monkeypatch):
    from trainer import pulling as pulling_module

    island = runner(Faults(), Globals(), latency_ms=0.0)

    def run_ended(p: int) -> tuple:
        raise SystemExit(0)

    island.full = run_ended
    monkeypatch.setattr(pulling_module, "fault_in", lambda like, copies: 0)

    with pytest.raises(SystemExit) as ended:
        Pulling.pull_all(island, 2, Taken, lambda name: None)

    assert ended.value.code == 0 and island.island.taken == []


def test_the_first_pull_reads_on_while_the_island_is_built_and_takes_each_fragment_in():
    reads: list[tuple[int, float, float]] = []  # fragment, start, end
    taken: list[tuple[int, float]] = []
    phases: list[tuple[str, float]] = []

    def full(p: int) -> tuple[int, dict[str, torch.Tensor]]:
        started = time.monotonic()
        time.sleep(0.1)  # the link's time
        reads.append((p, started, time.monotonic()))
        return 7, {"w": torch.full((4,), float(p))}

    class Built:
        model = torch.nn.Linear(4, 4)

        def reset_fragment(self, p: int, tensors: dict, version: int) -> None:
            assert version == 7 and tensors["w"][0].item() == p
            time.sleep(0.03)
            taken.append((p, time.monotonic()))

    def build() -> Built:
        time.sleep(0.25)  # longer than two reads
        return Built()

    island = SimpleNamespace(full=full, island=None)

    Pulling.pull_all(island, 5, build, lambda name: phases.append((name, time.monotonic())))

    assert [p for p, _ in taken] == [0, 1, 2, 3, 4]  # each in its turn
    assert phases[0][0] == "model" and isinstance(island.island, Built)
    # The first reads went on, back to back, while the island was built.
    assert reads[1][1] - reads[0][2] < 0.03 and reads[1][2] < phases[0][1]
    # PULL_AHEAD messages in memory at most: a read begins once the fragment
    # PULL_AHEAD before it was taken in.
    for p, started, _ in reads[PULL_AHEAD:]:
        assert started >= taken[p - PULL_AHEAD][1]
