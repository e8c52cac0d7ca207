"""The invariants the chaos soak (bench/soak.py) checks after its run, and its goodput.

- budget_completed: the run completed and merged at least its budget.
- versions_only_went_up: every fragment's published version, read from Redis
  all through the soak, never went down; and the merge events of each fragment
  name strictly growing versions, except after a declared rollback.
- tokens_counted_once: for each fragment the tokens of its merge events add up
  to syncd's counter in Redis, no version was merged twice, and the run's token
  counter in the database is syncd's total (the counter / fragments).
- checkpoints_verify: every checkpoint the database names has the sha256 it
  records and loads (syncd.checkpoint.load), with versions and tokens no
  newer than the run's end.
- database_agrees_with_syncd: the database's newest merge of each fragment is
  Redis's version, the run's tokens are syncd's, and the islands' epochs agree.
- hostile_entries_quarantined: every batch of hostile entries (bench/hostile.py)
  left the run's stream while the run trained, and syncd recorded them as
  "rejection" events with their count, aggregated (fewer events than entries,
  counting no more than were written), each in the name of the island the entries
  named or of none.
- merging_after_hostile_entries: after each batch every fragment's version went
  up, and a merge after it took an update of the island the entries named.
- keys_outside_hostile_entries_kept: the canary of the run's own (read when its
  batch was quarantined) and that of another run (read at the end), which the
  entries named, hold what was written.
- no_process_left_behind: after the system stopped, no process of its process
  groups runs, and no island process (`trainer.runner`) of its Redis.
"""

from __future__ import annotations

import hashlib
import os
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.procs import processes
from syncd import checkpoint


class Observer:
    """Reads the published versions from Redis on every call and remembers any that
    went down (a lost acknowledged merge)."""

    def __init__(self, store: Any):
        self.store = store
        self.newest: dict[int, int] = {}
        self.went_down: list[dict[str, int]] = []
        self.samples = 0

    def observe(self) -> None:
        for p, version in self.store.globals.versions().items():
            before = self.newest.get(p, 0)
            if version < before:
                self.went_down.append({"fragment": p, "from": before, "to": version})
            self.newest[p] = max(before, version)
        self.samples += 1


def check_invariants(run: Any, store: Any, observer: Observer, intruder: Any
                     ) -> tuple[dict[str, bool], dict[str, Any]]:
    """Every invariant but the last (checked after the stop), and what each found;
    `intruder`: the bench.hostile.Intruder of the soak's hostile entries."""
    from webapp.runs.models import Run

    observer.observe()
    fragments = run.config["sync"]["fragments"]
    versions, tokens = store.globals.versions(), store.globals.tokens_merged()
    events = list(run.events.filter(kind__in=("merge", "rollback")).order_by("id")
                  .values_list("kind", "detail"))
    merged = merge_ledger(events)
    syncd_total = sum(tokens.values()) // fragments
    budget = run.config["budget"]["total_tokens"]
    details: dict[str, Any] = {}
    ok: dict[str, bool] = {}

    ok["budget_completed"] = run.state == Run.State.COMPLETED and run.tokens >= budget
    details["budget_completed"] = {"state": run.state, "tokens": run.tokens, "budget": budget}

    ok["versions_only_went_up"] = not observer.went_down and not merged["out_of_order"]
    details["versions_only_went_up"] = {"redis_samples": observer.samples,
                                        "went_down": observer.went_down[:10],
                                        "merge_events_out_of_order":
                                            merged["out_of_order"][:10],
                                        "rollbacks": merged["rollbacks"]}

    per_fragment = {p: {"merge_events": merged["tokens"].get(p, 0), "syncd": tokens.get(p, 0)}
                    for p in range(fragments)}
    ok["tokens_counted_once"] = (all(v["merge_events"] == v["syncd"]
                                     for v in per_fragment.values())
                                 and not merged["duplicates"] and run.tokens == syncd_total)
    details["tokens_counted_once"] = {"per_fragment": per_fragment,
                                      "duplicate_versions": merged["duplicates"][:10],
                                      "run_tokens": run.tokens, "syncd_total": syncd_total,
                                      "recovered_merges": merged["recovered"]}

    checked = verify_checkpoints(run, versions, tokens, fragments)
    ok["checkpoints_verify"] = bool(checked) and all(c["ok"] for c in checked)
    details["checkpoints_verify"] = checked

    db_epochs = dict(run.islands.values_list("name", "epoch"))
    redis_epochs = store.epochs()
    agree = {"newest_merge": {p: merged["newest"].get(p) for p in range(fragments)},
             "redis_versions": {p: versions.get(p) for p in range(fragments)},
             "run_tokens": run.tokens, "syncd_tokens": syncd_total,
             "epochs_differ": {n: (e, redis_epochs.get(n)) for n, e in db_epochs.items()
                               if redis_epochs.get(n) != e}}
    ok["database_agrees_with_syncd"] = (agree["newest_merge"] == agree["redis_versions"]
                                        and run.tokens == syncd_total
                                        and not agree["epochs_differ"])
    details["database_agrees_with_syncd"] = agree
    hostile_ok, hostile_details = check_hostile(run, versions, intruder)
    return {**ok, **hostile_ok}, {**details, **hostile_details}


def check_hostile(run: Any, versions: dict[int, int], intruder: Any
                  ) -> tuple[dict[str, bool], dict[str, Any]]:
    """The invariants of the hostile entries, and what each found; `versions`: the
    run's final ones."""
    batches = intruder.batches
    fragments = run.config["sync"]["fragments"]
    written = intruder.entries_written()
    named = {batch.island for batch in batches}
    quarantines = [detail | {"island": island} for island, detail in
                   run.events.filter(kind="rejection").values_list("island__name", "detail")
                   if "quarantined" in detail]
    counted = sum(int(q["quarantined"]) for q in quarantines)
    ok: dict[str, bool] = {}
    details: dict[str, Any] = {}

    ok["hostile_entries_quarantined"] = (
        bool(batches) and all(b.quarantined_after_s is not None for b in batches)
        and 0 < len(quarantines) < written and counted <= written
        and all(q["island"] in named | {None} for q in quarantines))
    details["hostile_entries_quarantined"] = {
        "batches": len(batches), "entries": written,
        "quarantined_after_s": [b.quarantined_after_s for b in batches],
        "events": len(quarantines), "counted": counted,
        "causes": sorted({q.get("cause", "") for q in quarantines})}

    merges = list(run.events.filter(kind="merge").values_list("time", "detail"))
    after = []
    for batch in batches:
        since = datetime.fromtimestamp(batch.time, UTC)
        later = [detail for at, detail in merges if at > since]
        after.append({"island": batch.island, "versions_before": batch.versions,
                      "merges_after": len(later),
                      "island_merged_after": any(batch.island in (d.get("weights") or {})
                                                 for d in later),
                      "versions_went_up": all(versions.get(p, 0) > batch.versions.get(p, 0)
                                              for p in range(fragments))})
    ok["merging_after_hostile_entries"] = bool(after) and all(
        a["island_merged_after"] and a["versions_went_up"] for a in after)
    details["merging_after_hostile_entries"] = after

    other_kept = intruder.other_canary_kept()
    ok["keys_outside_hostile_entries_kept"] = bool(batches) and other_kept and all(
        b.canary_kept for b in batches)
    details["keys_outside_hostile_entries_kept"] = {
        "own_canaries_kept": [b.canary_kept for b in batches],
        "other_run_canary": intruder.other_canary, "other_run_canary_kept": other_kept}
    return ok, details


def merge_ledger(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per fragment, from the run's merge and rollback events in the order written:
    tokens, newest version, versions that did not grow, versions merged twice."""
    tokens: dict[int, int] = defaultdict(int)
    newest: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    out_of_order, duplicates, rollbacks, recovered = [], [], 0, 0
    for kind, detail in events:
        if kind == "rollback":
            rollbacks += 1
            for p, v in enumerate(detail.get("versions") or []):
                newest[p] = int(v)
            continue
        p, v = int(detail["fragment"]), int(detail["version"])
        recovered += detail.get("reason") == "recovered"
        if (p, v) in seen:
            duplicates.append({"fragment": p, "version": v})
        seen.add((p, v))
        if v <= newest.get(p, 0):
            out_of_order.append({"fragment": p, "version": v, "after": newest.get(p, 0)})
        newest[p] = max(newest.get(p, 0), v)
        tokens[p] += int(detail.get("tokens", 0))
    return {"tokens": dict(tokens), "newest": newest, "out_of_order": out_of_order,
            "duplicates": duplicates, "rollbacks": rollbacks, "recovered": recovered}


def verify_checkpoints(run: Any, versions: dict[int, int], tokens: dict[int, int],
                       fragments: int) -> list[dict[str, Any]]:
    """Each checkpoint of the run: its sha256, whether it loads, and whether its
    versions and tokens are within the run's final ones."""
    checked = []
    for row in run.checkpoints.order_by("id"):
        entry: dict[str, Any] = {"path": row.path, "ok": False}
        try:
            body = Path(row.path).read_bytes()
            entry["sha256_matches"] = hashlib.sha256(body).hexdigest() == row.sha256
            _, _, saved_versions, saved_tokens = checkpoint.load(Path(row.path), row.sha256)
        except (OSError, ValueError) as e:
            entry["error"] = str(e)
            checked.append(entry)
            continue
        within = all(v <= versions.get(p, 0) for p, v in enumerate(saved_versions)) and \
            saved_tokens <= sum(tokens.values()) // fragments
        entry.update(versions=saved_versions, tokens=saved_tokens, within_the_run=within,
                     ok=entry["sha256_matches"] and within)
        checked.append(entry)
    return checked


def goodput_of(run: Any, outcome: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Goodput over the whole run, as docs/FIGURES.md defines it, and syncd's own figure.

    Useful island-seconds: the merged tokens (each step counted once over its
    fragments: the run's tokens), at the islands' fault-free seconds per step as
    syncd measured them; every island is alike, so no island's share is needed.
    Allocated: every island from the run's start to its completion. syncd's own
    figure covers only the time since its last restart (its accounting starts
    anew), hence both.
    """
    islands = run.config["islands"]
    tokens_per_step = islands[0]["batch_size"] * run.config["model"]["block_size"]
    step_times = [t for t in outcome.get("step_time_s", {}).values() if t]
    step_s = statistics.median(step_times) if step_times else 0.0
    useful_s = run.tokens / tokens_per_step * step_s
    allocated_s = len(islands) * wall_s
    return {"run": round(useful_s / allocated_s, 4) if allocated_s else 0.0,
            "useful_s": round(useful_s, 1), "allocated_s": round(allocated_s, 1),
            "step_time_s": round(step_s, 4),
            "syncd_since_restart": outcome.get("goodput") or 0.0,
            "syncd_wall_s": outcome.get("wall_s")}


def processes_left(groups: list[int], redis_port: int) -> list[str]:
    """Live processes of the system's process groups, and island processes of its
    Redis, anywhere (zombies do not count: nothing is left running)."""
    left = []
    marker = f"127.0.0.1:{redis_port}"
    for proc in processes():
        if proc.pid == os.getpid() or not proc.running:
            continue
        if proc.pgid in groups or ("trainer.runner" in proc.cmdline and marker in proc.cmdline):
            left.append(f"{proc.pid}: {proc.cmdline[:160]}")
    return left
