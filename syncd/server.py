"""The syncd process: its share of the active runs served in one loop, status pushed live.

It finds active runs in Redis (arch:runs), takes a lease on its share of them
(several syncd may split the runs, see syncd/lease.py), keeps one RunSync for
each run it holds and ticks them in turn; one broken run is logged and retried,
never allowed to stop the others. Each new status snapshot goes to the channel
layer group "run-<id>", where the control room's websockets listen.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import redis

from syncd import lease
from syncd.acl import sweep_island_users
from syncd.connection import connect, redis_problem
from syncd.control import syncd_command
from syncd.evaluation import EVAL_CPU_SHARE
from syncd.fence import Lease, LeaseLost
from syncd.hooks import Hooks
from syncd.published_server import PublishedServer, parse_address
from syncd.service import RunSync
from syncd.store import RunStore

log = logging.getLogger("archipelago.syncd")
# How long a run's lease outlives its holder's last renewal (SYNCD_LEASE_TTL_S).
LEASE_TTL_S = 10.0
# A syncd whose main loop showed no progress this long stops renewing its leases from
# its lease-keeper thread, so that another takes its runs.
PROGRESS_DEADLINE_S = 60.0
# A run whose tick failed is built anew after this long, doubled after each failure in a
# row up to RETRY_MAX_S: a run that keeps failing costs syncd little, and syncd keeps it
# (under a new grant of its lease: Syncd._grant_again), so its updates are merged once
# it works again.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
# A pass that found nothing to do waits this long at most for an update to arrive
# (blocking on the runs' update streams: heartbeats, deadlines and commands are looked
# at again after it) ...
QUIET_WAIT_S = 0.1
# ... or, serving no run, sleeps this long before it looks for runs again.
IDLE_WAIT_S = 1.0
# How often the island users of the runs served are made again if Redis lost them (it
# restarted) and those of ended runs deleted (syncd/acl.py): an island whose user is
# gone rides out about 8 s of refused connections (syncd.connection.RESTART_RETRIES).
USER_SWEEP_S = 2.0
# At its stop (SIGTERM), syncd reads what the islands of a run being stopped still send
# for this long at most before it stops the run (Syncd.finish_stops): with the merge
# and the checkpoint after it, within the 7 s `python -m webapp.start` gives it.
SHUTDOWN_STOP_WAIT_S = 3.0


class Syncd:
    """Serves its share of the runs in arch:runs, ticking them in turn.

    Several syncd processes may share one Redis, on one host or many. Each serves
    the runs whose lease it holds (syncd/lease.py): it takes unowned runs up to its
    fair share, ceil(active runs / syncd processes alive), hands the runs beyond it
    over, and takes over the runs of a syncd that stopped renewing (killed, its host
    gone) once their leases expire. Every write for a run is fenced by its lease, so
    two syncd never write one run, and a slow run holds back only the runs of its
    own process.

    Args:
        redis_url: where the runtime's control Redis is.
        checkpoint_dir: the folder for checkpoints (one subfolder per run).
        hooks: the web side's records, rejoins and status pushes (syncd/hooks.py).
        lease_ttl_s: how long a lease outlives its holder's last renewal (renewed
            every third of it): the runs of a dead syncd wait this long for another.
        owner: this process's name in the leases; default host, pid and a random part.
        clock: monotonic seconds, for the renewal schedule.
        eval_cpu_share: the share of the host's CPU each run's live evaluation takes on
            average (SYNCD_EVAL_CPU_SHARE, syncd/evaluation.py).
        dataplane_url: where tensor messages lie (DATAPLANE_REDIS_URL); default the
            control Redis.
        serve: the address (host, port) syncd serves published fragments at
            (SYNCD_SERVE, syncd/published_server.py); None: they go on the data plane.
        serve_url: how islands reach that server (SYNCD_SERVE_URL); default its address.
        serve_tls: its certificate and key files (SYNCD_SERVE_CERT, SYNCD_SERVE_KEY):
            it speaks HTTPS; None: HTTP.
    """

    def __init__(self, redis_url: str, checkpoint_dir: str | Path,
                 hooks: Hooks, *,
                 lease_ttl_s: float = LEASE_TTL_S, owner: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 eval_cpu_share: float = EVAL_CPU_SHARE, dataplane_url: str | None = None,
                 serve: tuple[str, int] | None = None, serve_url: str | None = None,
                 serve_tls: tuple[str, str] | None = None):
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be above 0 seconds, got {lease_ttl_s}")
        self.client = connect(redis_url)
        self.data = connect(dataplane_url) if dataplane_url and dataplane_url != redis_url \
            else self.client
        self.redis_url = redis_url
        self.progress_at = time.monotonic()  # the main loop's last sign of progress
        self.checkpoint_dir = Path(checkpoint_dir)
        self.published = None if serve is None else PublishedServer(
            checkpoint_dir, *serve, advertise=serve_url, tls=serve_tls)
        self.runs: dict[str, RunSync] = {}
        self.leases: dict[str, Lease] = {}
        self.stopping = False
        self.hooks = hooks
        self.lease_ttl_s = lease_ttl_s
        self.owner = owner or lease.new_owner()
        self.clock = clock
        self.eval_cpu_share = eval_cpu_share
        self.members = 1
        self.next_renewal = 0.0
        self.next_user_sweep = 0.0
        self.last_active: set[str] = set()
        # run -> (when it is tried again, the wait after its last failure)
        self.retries: dict[str, tuple[float, float]] = {}

    def tick(self) -> bool:
        """Renew leases when due, take or hand over runs, tick every run held; True if
        any run had work."""
        if syncd_command(self.client) == "kill":
            log.warning("killed by an admin's fault injection")
            os.kill(os.getpid(), signal.SIGKILL)
        self.progress_at = time.monotonic()
        active = set(RunStore.active_runs(self.client))
        for run_id in [r for r in self.leases if r not in active]:
            self._let_go(run_id, "it is no longer active")
        now = self.clock()
        if now >= self.next_renewal:
            self.keep_leases()
            self._balance(active)
        elif active != self.last_active:
            self._balance(active)  # a run started or ended: no need to wait for renewal
        self.last_active = active
        if now >= self.next_user_sweep:
            self.next_user_sweep = now + USER_SWEEP_S
            sweep_island_users(self.client, self.data, [(run_id, sync.spec.secret)
                                                        for run_id, sync in self.runs.items()])
        busy = False
        for run_id in _in_order(self.leases):
            if run_id not in self.leases:
                continue  # lost while an earlier run's pass renewed the leases
            if run_id in self.retries and now < self.retries[run_id][0]:
                continue  # failed lately: it waits its turn to be built again
            try:
                busy |= self._run_sync(run_id).tick()
                self.retries.pop(run_id, None)
            except LeaseLost as e:
                log.warning("%s; run %s is another syncd's now", e, run_id)
                self.leases.pop(run_id, None)
                self.runs.pop(run_id, None)
                if self.published is not None:
                    self.published.forget(run_id)
            except Exception:
                # One broken run must not stop the others; it is built anew after a
                # wait that grows while it keeps failing, under a grant of its own.
                wait = min(2 * self.retries[run_id][1], RETRY_MAX_S) \
                    if run_id in self.retries else RETRY_FIRST_S
                self.retries[run_id] = (now + wait, wait)
                log.exception("run %s failed a tick; built anew in %.0f s", run_id, wait)
                self.runs.pop(run_id, None)
                self._grant_again(run_id)
        return busy

    def _grant_again(self, run_id: str) -> None:
        """Take a new grant of a run whose tick failed: its open rounds and unpublished
        merges went with the RunSync, and the islands send again what syncd has not
        handled once they see the lease change hands (trainer/resend.py), as after a
        restart of syncd. Should another syncd take the run meanwhile, it is theirs."""
        held = self.leases.pop(run_id)
        if self.published is not None:
            self.published.forget(run_id)
        lease.release(self.client, held)
        got = lease.acquire(self.client, run_id, self.owner, self.lease_ttl_s)
        if got is None:
            self.retries.pop(run_id, None)
            log.warning("run %s: another syncd took it as its lease was granted again", run_id)
            return
        self.leases[run_id] = got
        log.warning("run %s: granted again (fencing token %d), so its islands send again "
                    "what it had not handled", run_id, got.token)

    def _run_sync(self, run_id: str) -> RunSync:
        if run_id not in self.runs:
            served = None if self.published is None else self.published.serve(run_id)
            store = RunStore(self.client, run_id, fence=self.leases[run_id], data=self.data,
                             served=served)
            sync = RunSync(store, self.hooks.recorder(int(run_id)), self.checkpoint_dir,
                           notify=self.hooks.notify, rejoin=self.hooks.rejoin,
                           keepalive=self.keep_leases,
                           eval_cpu_share=self.eval_cpu_share)
            # The merges a killed syncd (or this one, before a failed tick) published
            # but never wrote to the database get their events now.
            if not any(e["kind"] == "rollback" for e in sync.recorder.events):
                recovered = sync.recorder.recover_merges(store.globals.versions(),
                                                         store.globals.tokens_merged())
                if recovered:
                    log.warning("run %s: recorded the merges of fragments %s that were "
                                "published but not written", run_id, recovered)
            self.runs[run_id] = sync
        return self.runs[run_id]

    def keep_leases(self) -> None:
        """Renew the leases if due: called from within a long pass over one run, so the
        other runs' leases, and its own, do not expire behind it."""
        self.progress_at = time.monotonic()
        now = self.clock()
        if now >= self.next_renewal:
            self.next_renewal = now + self.lease_ttl_s / 3
            self._renew()

    def _renew(self) -> None:
        """Announce this syncd and extend every lease it holds; forget the ones lost."""
        self.members = lease.register(self.client, self.owner, self.lease_ttl_s)
        for run_id, held in list(self.leases.items()):
            if not lease.renew(self.client, held, self.lease_ttl_s):
                log.warning("run %s: lost the lease (fencing token %d) before renewing it",
                            run_id, held.token)
                self.leases.pop(run_id)
                self.runs.pop(run_id, None)

    def _balance(self, active: set[str]) -> None:
        """Hand over the runs beyond this syncd's fair share; take unowned ones up to it."""
        share = lease.fair_share(len(active), self.members)
        extra = len(self.leases) - share
        for run_id in list(reversed(_in_order(self.leases)))[:max(extra, 0)]:
            self._let_go(run_id, f"{self.members} syncd share {len(active)} runs")
        for run_id in _in_order(active - set(self.leases)):
            if len(self.leases) >= share:
                break
            got = lease.acquire(self.client, run_id, self.owner, self.lease_ttl_s)
            if got is not None:
                self.leases[run_id] = got
                log.info("serving run %s (fencing token %d)", run_id, got.token)

    def _let_go(self, run_id: str, why: str) -> None:
        """Stop serving a run and free its lease at once, so another may take it."""
        sync = self.runs.pop(run_id, None)
        self.retries.pop(run_id, None)
        held = self.leases.pop(run_id)
        if self.published is not None:
            self.published.forget(run_id)
        if sync is not None:
            try:
                sync.recorder.flush()
            except Exception:
                log.exception("run %s: could not write its last records", run_id)
        lease.release(self.client, held)
        log.info("let go of run %s: %s", run_id, why)

    def close(self) -> None:
        """Give up every lease and the announcement, so others take the runs at once."""
        for run_id in list(self.leases):
            self._let_go(run_id, "syncd is stopping")
        lease.leave(self.client, self.owner)
        if self.published is not None:
            self.published.close()

    def keep_leases_meanwhile(self, stall_s: float = PROGRESS_DEADLINE_S) -> threading.Thread:
        """Renew the leases from a thread of its own every third of their time to live,
        while the main loop has shown progress (a pass began, or a long one called
        `keep_leases`) within `stall_s`: one step that takes long (building a big
        run's model, writing its checkpoint on a busy disk) does not cost syncd its
        runs, and a syncd whose loop is stuck still lets them go. Losses are the main
        loop's to find (its own renewal, or a fenced write refused)."""
        client = connect(self.redis_url)

        def renew() -> None:
            while not self.stopping:
                time.sleep(self.lease_ttl_s / 3)
                if time.monotonic() - self.progress_at > stall_s:
                    continue
                try:
                    lease.register(client, self.owner, self.lease_ttl_s)
                    for held in list(self.leases.values()):
                        lease.renew(client, held, self.lease_ttl_s)
                except Exception:
                    log.exception("could not renew the leases; the main loop will try")

        thread = threading.Thread(target=renew, name="lease-keeper", daemon=True)
        thread.start()
        return thread

    def wait_for_work(self, quiet_s: float = QUIET_WAIT_S, idle_s: float = IDLE_WAIT_S
                      ) -> None:
        """After a pass with nothing to do: block until an update arrives on the stream
        of a run served (XREAD BLOCK, at most `quiet_s`, and no later than a round's
        grace window closes: its merge is not late by a blocking read), or, serving no
        run, sleep `idle_s`. A syncd with no run costs one pass a second; a quiet run one blocking
        read per `quiet_s` between passes, not passes back to back."""
        if not self.runs:
            time.sleep(idle_s)
            return
        soonest = [s for s in (sync.wake_in() for sync in self.runs.values()) if s is not None]
        wait_for_updates(self.client, self.runs.values(), min([quiet_s, *soonest]))

    def finish_stops(self, wait_s: float = SHUTDOWN_STOP_WAIT_S) -> None:
        """As syncd stops: each run it serves whose stop is under way is stopped now
        (RunSync.finish_stop: what its islands still send is read for `wait_s` at most,
        then its final checkpoint is written and the run is `stopped`), so that a stop
        asked just before the system stops is done before it is down, not at the next
        start. A run that fails it is left to the next syncd, as before."""
        for run_id, sync in list(self.runs.items()):
            def wait(seconds: float, sync: RunSync = sync) -> None:
                self.keep_leases()  # the lease keeper thread ended with the loop
                wait_for_updates(self.client, [sync], seconds)

            try:
                if sync.stop_under_way():
                    log.info("run %s: finishing its stop before syncd stops", run_id)
                    sync.finish_stop(wait_s, wait)
            except Exception:
                log.exception("run %s: its stop could not be finished; the next syncd "
                              "finishes it", run_id)

    def serve_forever(self) -> None:
        log.info("syncd %s serving, checkpoints in %s", self.owner, self.checkpoint_dir)
        self.keep_leases_meanwhile()
        try:
            while not self.stopping:
                if not self.tick():
                    self.wait_for_work()
            self.finish_stops()
        finally:
            self.close()


def wait_for_updates(client: redis.Redis, syncs: Iterable[RunSync],
                     quiet_s: float = QUIET_WAIT_S) -> None:
    """Block until an update arrives on the stream of one of these runs after what it
    read (XREAD BLOCK), `quiet_s` at most."""
    client.xread(dict(sync.waiting_on() for sync in syncs), count=1,
                 block=max(int(quiet_s * 1000), 1))


def _in_order(run_ids: Iterable[str]) -> list[str]:
    """Run ids in numeric order (ids are numbers; shorter first, then by text)."""
    return sorted(run_ids, key=lambda r: (len(r), r))


def main(hooks: Hooks, redis_url: str, checkpoint_dir: str | Path, health: bool = False,
         lease_ttl_s: float = LEASE_TTL_S, threads: int = 1,
         eval_cpu_share: float = EVAL_CPU_SHARE, dataplane_url: str | None = None,
         serve: str = "off", serve_url: str | None = None,
         serve_tls: tuple[str, str] | None = None) -> int:
    """The syncd program, as `manage.py syncd` wires it: serve until SIGTERM or SIGINT,
    or with `health` say whether a syncd on this host is serving. `serve` is
    SYNCD_SERVE: `host:port` of the server of published fragments, or off, and
    `serve_tls` its certificate and key files. Exits 2 with a sentence when a Redis
    (control or data plane) cannot be reached or wants a password, `serve` is not an
    address, or the certificate and key cannot be read or are not a pair."""
    problem = redis_problem(redis_url) or (
        dataplane_url and redis_problem(dataplane_url, setting="DATAPLANE_REDIS_URL"))
    try:
        address = None if serve == "off" else parse_address(serve)
    except ValueError as exc:
        problem = problem or str(exc)
    if problem:
        print(f"syncd cannot start: {problem}", file=sys.stderr)
        return 2
    if health:
        host = f"{socket.gethostname()}:"
        members = lease.members_alive(connect(redis_url))
        return 0 if any(m.startswith(host) for m in members) else 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s "
                                                   "%(message)s")
    import torch

    from syncd.malloc import return_large_frees

    torch.set_num_threads(threads)
    return_large_frees()
    try:
        service = Syncd(redis_url, checkpoint_dir, hooks, lease_ttl_s=lease_ttl_s,
                        eval_cpu_share=eval_cpu_share, dataplane_url=dataplane_url,
                        serve=address, serve_url=serve_url, serve_tls=serve_tls)
    except OSError as exc:
        print(f"syncd cannot start: cannot serve published fragments at {serve}: {exc}",
              file=sys.stderr)
        return 2

    def stop(signum: int, frame: object) -> None:
        service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    service.serve_forever()
    return 0
