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
    """elastic.restart_delay_s, or the measured time for an island process to
    start and load state (the median its incarnations reported)."""
    if run.config.elastic.restart_delay_s is not None:
        return run.config.elastic.restart_delay_s
    measured = [b["startup_s"] for b in run.heartbeats.values() if b.get("startup_s")]
    return statistics.median(measured) if measured else DEFAULT_RESTART_DELAY_S

def restart_job(run: RunSync, now: float, lost_island: str) -> None:
    """Elastic: every island rolls back to the last checkpoint and pauses for the
    restart delay, as a whole-job restart would make it."""
    if run.restore_point is None:
        params = [{n: t.clone() for n, t in g.items()} for g in run.sync.globals]
        momentum = [opt.state_dict() for opt in run.sync.optimizers]
    else:
        params, momentum = run.restore_point
    discarded = set()
    for p in range(len(run.fragments)):
        discarded.update(run.sync.roll_back(p, params[p], momentum[p], now))
        run.pending_ids = {k: v for k, v in run.pending_ids.items() if k[0] != p}
        run.publish(p, 0)
    delay = restart_delay(run)
    generation = run.store.restart_job(now + delay)
    run.accounting.rollback(run.restore_time, now)
    for island in run.config.islands:
        if island.name not in run.lost:
            run.accounting.lost(island.name, delay, "restart_pause")
    run.recorder.event("rollback", lost_island, versions=list(run.sync.versions),
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
