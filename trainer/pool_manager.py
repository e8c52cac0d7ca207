"""The warm standby islands of one host (started as manage.py pool_manager --region R).

One manager per host owns its standbys (trainer/standby.py) as its own children,
so it can wait for each and report its exit: a Celery prefork child can wait only
for its own children. It

- keeps standbys ready (trainer/pool.py's Pool), refilling one at a time, each at
  idle priority (SCHED_IDLE) until it is claimed, where it may leave it then
  (trainer/priority.py), so that a refill never slows the islands that train: by
  default (ISLAND_POOL_SIZE=auto) as many as the largest active run has islands in
  its region that this host does not run yet, plus one, within the host's memory
  (trainer.pool.wanted_size, looked at every second: a run that starts raises it,
  its islands taking standbys lower it back to one spare, one that ends lowers it and
  the standbys beyond it end), or a fixed number;
- takes claims from its region's claim list in Redis (syncd/store.py PoolStore),
  which the run services push there directly for a start or a rejoin: a claim
  never waits behind the busy tasks of the region's Celery queue;
- checks each claim (trainer.pool.check_claim: the run active, the claim's epoch
  the island's current one; trainer.claims: signed by the run services; and the
  first start of that epoch anywhere, syncd.pool_store.first_start: a replayed
  claim starts nothing; a refused claim is written in the island's log), hands it
  to the standby ready the longest, or, with the pool empty, starts the island cold
  (`python -m trainer.runner`, today's start);
- takes claims into its own processing list and drops each once handled, and hands
  back to the region's list the claims of managers gone silent (one that died with
  claims in hand);
- supervises every island it started with trainer.supervisor.IslandSupervisor
  (commands, kill, stop, pause, the death report, the log shipped to Redis), one
  thread per island;
- announces its pool (ready, launching, pids) every second and at each change,
  which the run services read to decide between a claim and a task on the region's
  queue.

Idle, it costs about nothing: it blocks on the claim list (BLPOP) for up to a second
at a time, so a host with no claims makes one Redis call a second.

SIGTERM stops it: the islands it supervises stop as a "stop" would make them
(their cursors saved), the unclaimed standbys end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from syncd.acl import island_url
from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore
from trainer.claims import claim_signed
from trainer.island_logs import island_log_path
from trainer.launch import (
    ASKED_AT_ENV,
    DATAPLANE_URL_ENV,
    ISLAND_KEY_ENV,
    LAUNCHED_AT_ENV,
    REDIS_URL_ENV,
    end_with_parent,
    island_command,
    island_env,
    island_processes,
)
from trainer.pool import Pool, check_claim, wanted_size, warm_for
from trainer.priority import go_idle, idle_is_reversible
from trainer.supervisor import PROJECT_ROOT, IslandSupervisor

log = logging.getLogger("archipelago.pool")
# The longest a pass blocks on the claim list: how soon a dead standby is noticed and
# a ready one announced.
CLAIM_WAIT_S = 1.0
# Announcements every this long at least (readers believe one for 3 s, PoolStore).
ANNOUNCE_S = 1.0
HAND_BACK_S = 2.0  # how often the claims of silent managers are looked for


def standby_preexec(parent: int, idle: bool) -> Callable[[], None]:
    """In a standby before exec: SIGTERM when the manager dies, and idle priority if
    `idle`."""
    with_parent = end_with_parent(parent)

    def preexec() -> None:
        if with_parent is not None:
            with_parent()
        if idle:
            go_idle()

    return preexec


class PoolManager:
    """The standbys and the islands of one host.

    Args:
        redis_url: the Redis of the runs (claims, specs, epochs).
        dataplane_url: where the islands' tensor messages go (default `redis_url`'s).
        region: the region whose claims this host takes.
        size: the standbys kept ready (0: no pool; claims, if any, start cold); None:
            as many as the active runs want (trainer.pool.wanted_size).
        memory_bytes: the host's memory, which standbys and islands share (with `size`
            None); default the machine's.
        log_dir: islands' logs go to <log_dir>/run-<id>/<island>.log; the standbys'
            output before their claim to <log_dir>/pool-<region>.log.
        host: this host's name in the announcements; default hostname:pid.
        on_failure: called with (run id, island, the supervisor's result) when an
            island it supervises fails on its own (the web app's alert).
        claims_key: the key the run services sign claims with (trainer.claims).
    """

    def __init__(self, redis_url: str, region: str, size: int | None, log_dir: str | Path, *,
                 memory_bytes: int | None = None, host: str | None = None,
                 on_failure: Callable[[int, str, dict[str, Any]], None] | None = None,
                 claims_key: bytes, dataplane_url: str | None = None):
        self.redis_url = redis_url
        self.dataplane_url = dataplane_url or redis_url
        self.client = connect(redis_url)
        self.pools = PoolStore(self.client)
        self.region = region
        self.fixed_size = size
        self.memory_bytes = memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf(
            "SC_PHYS_PAGES")
        self.pool = Pool(1 if size is None else size)
        self.ending: list[subprocess.Popen[bytes]] = []  # standbys beyond the size, ended
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.host = host or f"{socket.gethostname()}:{os.getpid()}"
        self.on_failure = on_failure
        self.claims_key = claims_key
        self._handed_back = 0.0
        self.env = island_env(dict(os.environ))
        # Standbys at idle priority only where a claimed one can leave it.
        self.idle = idle_is_reversible()
        if not self.idle:
            log.warning("standbys are built at normal priority on %s: a claimed one could "
                        "not leave idle priority (this user has no CAP_SYS_NICE and an "
                        "RLIMIT_NICE below 20)", self.host)
        self.standbys: dict[int, subprocess.Popen[bytes]] = {}  # unclaimed, by pid
        self.islands: dict[tuple[str, str, int], IslandSupervisor] = {}
        self.threads: list[threading.Thread] = []
        self.ready_events: queue.Queue[int] = queue.Queue()
        # What new standbys prepare: the largest active run's, else the last claim's run.
        self.warm: dict[str, Any] = {}
        self.stopping = False
        self._announced = self._resized = 0.0
        # Reentrant: request_stop runs in a signal handler, on the main thread, which may
        # hold it already.
        self._lock = threading.RLock()
        self._log: IO[bytes] = open(self.log_dir / f"pool-{region}.log", "ab")  # noqa: SIM115

    # -- the loop -------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop at once (SIGTERM, from the signal handler): the islands it supervises are
        told now, as a "stop" command tells them, not after the pass under way, which
        may be blocked on the claims for a second; the pool shuts down after it."""
        self.stopping = True
        with self._lock:
            supervisors = list(self.islands.values())
        for supervisor in supervisors:
            supervisor.request_stop()

    def serve_forever(self) -> None:
        try:
            while not self.stopping:
                self.tick()
        finally:
            self.shutdown()

    def tick(self) -> None:
        """One pass: standbys that got ready or died, the claims waiting, a refill."""
        changed = self._take_ready() | self._reap() | self._resize()
        self._hand_back()
        claims = self.pools.take_claims(self.region, self.host, CLAIM_WAIT_S)
        for raw, claim in claims:
            try:
                self.handle(claim)
            except Exception:  # one bad claim must not end the host's pool
                log.exception("claim of %s epoch %s of run %s failed", claim.get("island"),
                              claim.get("epoch"), claim.get("run"))
            finally:
                self.pools.done_claim(self.region, self.host, raw)
        if not claims and self.pool.needs_refill():
            self._launch()
            changed = True
        self.announce(force=changed or bool(claims))

    def _hand_back(self) -> None:
        """Every HAND_BACK_S: the claims of the region's silent managers go back."""
        now = time.time()
        if now - self._handed_back < HAND_BACK_S:
            return
        self._handed_back = now
        handed = self.pools.hand_back_stale(self.region, now)
        if handed:
            self._note(f"{handed} claims of silent pool managers handed back")

    def announce(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._announced < ANNOUNCE_S:
            return
        self._announced = now
        with self._lock:
            running = len(self.islands)
        self.pools.put_host(self.region, self.host, {
            **self.pool.counts(), "time": now, "pid": os.getpid(), "islands": running,
            "standbys": sorted(self.standbys)})

    # -- standbys ---------------------------------------------------------------

    def _resize(self) -> bool:
        """With no fixed size, once a second: the size the active runs want, and what
        new standbys prepare; the standbys beyond it end. True if the size changed."""
        now = time.time()
        if self.fixed_size is not None or now - self._resized < ANNOUNCE_S:
            return False
        self._resized = now
        specs = {run_id: spec for run_id in RunStore.active_runs(self.client)
                 if (spec := RunStore(self.client, run_id).spec())}
        with self._lock:
            serving = Counter(str(run_id) for run_id, _, _ in self.islands)
        size, warm = wanted_size(specs, self.region, self.memory_bytes, serving)
        if warm:
            self.warm = warm
        if size == self.pool.size:
            return False
        self._note(f"pool size {self.pool.size} -> {size}")
        self.pool.size = size
        for pid in self.pool.surplus():
            process = self.standbys.pop(pid)
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            self.ending.append(process)
            self._note(f"standby {pid} ended: the pool is smaller now")
        return True

    def _launch(self) -> None:
        argv = [sys.executable, "-m", "trainer.standby", "--warm", json.dumps(self.warm)]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=self._log, env=self.env, cwd=PROJECT_ROOT,
                                   preexec_fn=standby_preexec(os.getpid(), self.idle))
        self.standbys[process.pid] = process
        self.pool.launched(process.pid, time.time(), self.warm)
        self._note(f"standby {process.pid} launched (warm for {json.dumps(self.warm)})")
        threading.Thread(target=self._wait_ready, args=(process,), daemon=True).start()

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip() == b"ready":
                self.ready_events.put(process.pid)
        process.stdout.close()  # after a claim the standby writes to the island's log

    def _take_ready(self) -> bool:
        """Mark the standbys that said ready; True if any did."""
        taken = False
        while True:
            try:
                pid = self.ready_events.get_nowait()
            except queue.Empty:
                return taken
            if pid in self.standbys:
                self.pool.ready(pid, time.time())
                self._note(f"standby {pid} ready")
                taken = True

    def _reap(self) -> bool:
        """Forget the standbys that exited unclaimed; True if any did."""
        reaped = False
        for pid, process in list(self.standbys.items()):
            code = process.poll()
            if code is not None:
                del self.standbys[pid]
                self.pool.exited(pid)
                self._note(f"standby {pid} exited unclaimed with exit code {code}")
                reaped = True
        self.ending = [process for process in self.ending if process.poll() is None]
        return reaped

    # -- claims -----------------------------------------------------------------

    def handle(self, claim: dict[str, Any]) -> None:
        """Check a claim and start its island: on a warm standby, or cold."""
        store = RunStore(self.client, claim.get("run", ""))
        # A run being stopped takes no new epoch, as a worker's task would not.
        active = store.is_active() and store.control.stop_requested() is None
        refused = check_claim(claim, active, store.epochs().get(str(claim.get("island"))))
        if not refused and not claim_signed(claim, self.claims_key):
            refused = "the claim is not signed by the run services"
        if not refused and not isinstance(claim.get("island_key"), str):
            refused = "the claim carries no island key"
        if not refused and not self.pools.first_start(store.run_id, claim["island"],
                                                      claim["epoch"]):
            refused = (f"replayed claim: epoch {claim['epoch']} of island "
                       f"{claim['island']!r} was started already")
        if refused:
            self._note(f"claim refused: {refused}")
            if isinstance(claim.get("island"), str) and active:
                self._island_note(store.run_id, claim["island"], f"claim refused: {refused}")
            return
        run_id, island, epoch = store.run_id, claim["island"], claim["epoch"]
        spec = store.spec() or {}
        processes, device = island_processes(spec, island)
        self.warm = warm_for(spec)
        log_path = island_log_path(self.log_dir, run_id, island)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The island connects as its run's island user, with this host's URLs for Redis.
        url = island_url(self.redis_url, run_id, claim.get("redis_password"))
        data_url = island_url(self.dataplane_url, run_id, claim.get("redis_password"))
        standby = self.pool.claim() if processes == 1 else None
        if standby is not None:
            process = self.standbys.pop(standby.pid)
            message = {**claim, "claimed_at": time.time(), "redis_url": url,
                       "dataplane_url": data_url,
                       "log_path": str(log_path)}
            assert process.stdin is not None
            process.stdin.write((json.dumps(message) + "\n").encode())
            process.stdin.close()
            supervisor = IslandSupervisor(process.args, store, island, epoch, log_path,
                                          env=self.env)
            self._note(f"standby {standby.pid} claimed by {island} epoch {epoch} of run "
                       f"{run_id}")
            self._supervise(supervisor, [process], claim)
            return
        env = {**self.env, REDIS_URL_ENV: url, DATAPLANE_URL_ENV: data_url,
               ISLAND_KEY_ENV: str(claim.get("island_key", ""))}
        if claim.get("asked_at") is not None:
            env[ASKED_AT_ENV] = repr(float(claim["asked_at"]))
        env.pop(LAUNCHED_AT_ENV, None)
        command = island_command(int(run_id), island, epoch,
                                 device if processes > 1 else None)
        supervisor = IslandSupervisor(command, store, island, epoch, log_path, env=env,
                                      processes=processes)
        self._note(f"no standby ready: {island} epoch {epoch} of run {run_id} starts cold")
        self._supervise(supervisor, None, claim)

    def _supervise(self, supervisor: IslandSupervisor,
                   children: list[subprocess.Popen[bytes]] | None, claim: dict) -> None:
        key = (supervisor.store.run_id, supervisor.island, supervisor.epoch)

        def body() -> None:
            try:
                result = supervisor.run(adopt=children)
                self._note(f"{key[1]} epoch {key[2]} of run {key[0]} ended: {result['ended']}"
                           f", exit code {result['exit_code']}")
                if result["ended"] == "failed" and self.on_failure is not None:
                    self.on_failure(int(key[0]), key[1], result)
            except Exception:
                log.exception("supervising %s failed", key)
            finally:
                with self._lock:
                    self.islands.pop(key, None)

        with self._lock:
            self.islands[key] = supervisor
        thread = threading.Thread(target=body, name=f"island-{key[1]}-{key[2]}")
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    # -- the end ----------------------------------------------------------------

    def shutdown(self, timeout: float = 40.0) -> None:
        """Stop the islands (their cursors saved) and end the unclaimed standbys."""
        with self._lock:
            supervisors = list(self.islands.values())
        for supervisor in supervisors:
            supervisor.request_stop()
        for process in [*self.standbys.values(), *self.ending]:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        for process in [*self.standbys.values(), *self.ending]:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(Exception):
            self.pools.remove_host(self.region, self.host)
        self._log.close()

    def _note(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log.write(f"[pool {stamp}] {message}\n".encode())
        self._log.flush()

    def _island_note(self, run_id: str, island: str, message: str) -> None:
        path = island_log_path(self.log_dir, run_id, island)
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(path, "ab") as f:
            f.write(f"[pool {stamp}] {message}\n".encode())
