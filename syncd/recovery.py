"""How syncd recovers a run: checkpoints, the elastic whole-job restart, and the
fall-back to the newest checkpoint when Redis lost a run's state."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from syncd import checkpoint

if TYPE_CHECKING:
    from syncd.service import RunSync

log = logging.getLogger("archipelago.syncd")
DEFAULT_RESTART_DELAY_S = 5.0


def fall_back_to_checkpoint(run: RunSync) -> bool:
    """Redis lost the run's published versions (its data is really gone): go on
    from the newest checkpoint that verifies, as a declared rollback."""
    for path, sha256 in run.recorder.checkpoints():
        try:
            params, momentum, versions, tokens = checkpoint.load(Path(path), sha256)
        except (OSError, ValueError) as exc:
            log.warning("run %s: checkpoint %s is unusable: %s", run.store.run_id, path, exc)
            continue
        for p, fragment in enumerate(run.fragments):
            # Published as the version after the checkpoint's, so that no island
            # that held the checkpoint's versions sees them go backwards.
            run.sync.globals[p] = {n: params[n].float() for n in fragment.tensor_names}
            run.sync.optimizers[p].load_state_dict(
                {k.removeprefix(f"{p}."): v for k, v in momentum.items()
                 if k.startswith(f"{p}.")})
            run.sync.versions[p] = versions[p] + 1
            run.publish(p, tokens)
        run.recorder.event("rollback", None, reason="Redis lost the run's state",
                            checkpoint=path, versions=list(run.sync.versions))
        log.warning("run %s: Redis had no versions; rolled back to %s", run.store.run_id,
                    path)
        return True
    return False


def restart_delay(run: RunSync) -> float:
    """elastic.restart_delay_s, or the measured time for the job to start: a whole-job
    restart starts every island at once, and the barrier goes on when the slowest is
    back, so it is the longest start-up (launch to first step) of the islands' first
    incarnations, which started together (the first this syncd saw). Until each has
    reported one, the median start-up any incarnation reported."""
    if run.config.elastic.restart_delay_s is not None:
        return run.config.elastic.restart_delay_s
    if run.first_startups and set(run.first_startups) >= {i.name for i in run.config.islands}:
        return max(run.first_startups.values())
    measured = [b["startup_s"] for b in run.heartbeats.values() if b.get("startup_s")]
    return statistics.median(measured) if measured else DEFAULT_RESTART_DELAY_S


def note_first_startups(run: RunSync) -> None:
    """Keep the start-up each island's first incarnation reported (elastic's delay)."""
    for island, beat in run.heartbeats.items():
        if island not in run.first_startups and beat.get("startup_s"):
            run.first_startups[island] = float(beat["startup_s"])


def mark_restore_point(run: RunSync, now: float) -> None:
    """Elastic: after an outer step, the state a whole-job restart goes back to, and
    its checkpoint."""
    # Copies: the outer optimizer's step updates its momentum buffers in place (mul_,
    # add_), so its state_dict's tensors would move on with the next outer step.
    run.restore_point = ([{n: t.clone() for n, t in g.items()} for g in run.sync.globals],
                         [{k: v.clone() for k, v in opt.state_dict().items()}
                          for opt in run.sync.optimizers])
    run.restore_time = now
    run.restore_tokens = run.store.tokens_merged()
    save_checkpoint(run)


def unsent_steps(run: RunSync, island: str) -> float:
    """Inner steps of `island` since the last update of each fragment that syncd
    received, as goodput counts them (a fragment stands for 1/P of a step), up to
    its last heartbeat: the work a death or a restart of the island throws away."""
    beat = run.heartbeats.get(island)
    if not beat:
        return 0.0
    unsent = 0
    for p in range(len(run.fragments)):
        last = run.last_update.get((island, p))
        sent = last[1] if last else run.sync.handled[p].get(island, 0)
        unsent += max(int(beat.get("step", 0)) - sent, 0)
    return unsent / len(run.fragments)


def account_new_incarnations(run: RunSync, epochs: dict[str, int]) -> None:
    """An island whose epoch moved on lost the work its old incarnation had not sent:
    island-seconds lost "in_flight", at its fault-free step time."""
    for island, epoch in epochs.items():
        old = run.epochs.get(island)
        beat = run.heartbeats.get(island)
        if old is None or epoch <= old or island not in run.accounting.islands \
                or not beat or beat.get("epoch", 0) > old:
            continue
        seconds = unsent_steps(run, island) * (run.accounting.step_time(island) or 0.0)
        run.accounting.lost(island, seconds, "in_flight")


def barrier_waits(run: RunSync, p: int, now: float) -> dict[str, float]:
    """Elastic: how long each island with an update in fragment p's round has waited
    at the barrier by `now`: since its update arrived, less the tau steps it goes on
    computing before it needs the merge."""
    tau = run.config.sync.overlap_steps
    return {island: max(now - pending.arrival_time
                        - tau * (run.accounting.step_time(island) or 0.0), 0.0)
            for island, pending in run.sync.rounds[p].items()}


def account_barrier_wait(run: RunSync, p: int, now: float) -> None:
    """Elastic, as fragment p merges at `now`: its islands' waits, lost to "barrier_wait"."""
    for island, seconds in barrier_waits(run, p, now).items():
        if island in run.accounting.islands:
            run.accounting.lost(island, seconds, "barrier_wait")


def restart_job(run: RunSync, now: float, island: str, *, joining: bool = False) -> None:
    """Elastic: every island rolls back to the last checkpoint and pauses for the
    restart delay, as a whole-job restart would make it. torchelastic restarts every
    worker on any change of membership: when `island` is lost, and again when it
    comes back (`joining`); an island lost or back while a restart is under way
    joins that one.

    Lost to "rollback": the merges since the checkpoint (taken back, and their tokens
    no longer count towards the budget), the updates waiting in the open rounds and
    each other island's work since its last sends; to "barrier_wait": how long each
    had waited at the barrier for the lost island; to "restart_pause": each other
    island's pause. The joining island's own start-up overlaps the pause, and it
    follows the restart like the others.
    """
    if now < run.store.restart()[1]:
        return
    for excused in run.excused:
        excused.clear()
    if run.restore_point is None:
        params = [{n: t.clone() for n, t in g.items()} for g in run.sync.globals]
        momentum = [opt.state_dict() for opt in run.sync.optimizers]
        kept = run.store.tokens_merged()
    else:
        params, momentum = run.restore_point
        kept = run.restore_tokens
    merged = run.store.tokens_merged()
    others = [i.name for i in run.config.islands if i.name != island
              and i.name not in run.lost and i.name in run.accounting.islands]
    thrown = {name: unsent_steps(run, name) for name in others}
    waited = dict.fromkeys(others, 0.0)  # an island waits at one barrier at a time
    discarded = set()
    for p in range(len(run.fragments)):
        for name, seconds in barrier_waits(run, p, now).items():
            if name in waited:
                waited[name] = max(waited[name], seconds)
        for name, pending in run.sync.rounds[p].items():
            if name in thrown:
                thrown[name] += pending.update.inner_steps / len(run.fragments)
        discarded.update(run.sync.roll_back(p, params[p], momentum[p], now))
        run.publish(p, kept.get(p, 0) - merged.get(p, 0), run.take_round(p))
        run.restart_versions[p] = run.sync.versions[p]
    delay = restart_delay(run)
    generation = run.store.restart_job(now + delay)
    run.disturbed[""] = now + delay  # no island's step time spans the pause
    run.accounting.rollback(run.restore_time, now)
    for name in others:
        run.accounting.lost(name, delay, "restart_pause")
        run.accounting.lost(name, waited[name], "barrier_wait")
        run.accounting.lost(name, thrown[name] * (run.accounting.step_time(name) or 0.0),
                            "rollback")
    run.recorder.event("rollback", island, versions=list(run.sync.versions),
                        reason="island joined" if joining else "island lost",
                        restart_delay_s=round(delay, 2), generation=generation,
                        discarded=sorted(discarded))


def save_checkpoint(run: RunSync) -> None:
    versions = list(run.sync.versions)
    momentum = {f"{p}.{k}": v for p, opt in enumerate(run.sync.optimizers)
                for k, v in opt.state_dict().items()}
    path = run.checkpoint_dir / f"run-{run.store.run_id}" / (
        f"outer-{min(versions)}-{int(run.clock() * 1000)}.safetensors")
    sha, nbytes = checkpoint.save(path, run.sync.global_params(), momentum, versions,
                                  run.tokens_merged())
    for old in run.recorder.checkpoint(versions, str(path), sha, nbytes, run.eval_loss,
                                        run.config.checkpoint.keep):
        Path(old).unlink(missing_ok=True)
    run.recorder.event("checkpoint", None, versions=versions, sha256=sha, bytes=nbytes)
