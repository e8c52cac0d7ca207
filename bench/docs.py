"""docs/BENCHMARKS.md from the committed results: `python -m bench docs`.

The page is a reference, not a log: one table per benchmark, a column per results
file (the profile, the preset or the run it holds), and rows for the command that
wrote it, the commit it ran on, its date, a few headline figures (HEADLINES) and
every check with its bound, held or missed. Any results file with `checks` gets its
table, so a new benchmark needs no change here; HEADLINES only adds its figures.
Why a figure moved, session by session, is in docs/journal/. A test
(tests/bench/test_docs.py) fails when the committed page is not the generated one.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "BENCHMARKS.md"
COMMITTED = ROOT / "bench" / "results"

# A benchmark's headline figures: (label, dotted path into its summary). A path that a
# results file lacks leaves its cell empty.
HEADLINES: dict[str, list[tuple[str, str]]] = {
    "convergence": [("decoupled held-out loss", "modes.decoupled.none.eval_loss"),
                    ("sync held-out loss", "modes.sync.none.eval_loss"),
                    ("decoupled loss at sync's tokens", "modes.decoupled.none.eval_loss_at_tokens"),
                    ("sync loss at its tokens", "modes.sync.none.eval_loss_at_tokens"),
                    ("decoupled merges per H window", "modes.decoupled.none.merges_per_window"),
                    ("decoupled update age p95", "modes.decoupled.none.staleness_p95"),
                    ("decoupled seconds waiting (tau 0)", "modes.decoupled.none.waited_s"),
                    ("decoupled tokens merged", "modes.decoupled.none.tokens"),
                    ("sync tokens merged", "modes.sync.none.tokens"),
                    ("decoupled, K = M, held-out loss", "modes.decoupled_all.none.eval_loss"),
                    ("dp held-out loss", "modes.dp.none.eval_loss"),
                    ("decoupled loss under kills", "modes.decoupled.kills.eval_loss"),
                    ("sync loss under kills", "modes.sync.kills.eval_loss"),
                    ("dp loss under kills", "modes.dp.kills.eval_loss"),
                    ("decoupled loss with a straggler", "modes.decoupled.straggle.eval_loss"),
                    ("sync loss with a straggler", "modes.sync.straggle.eval_loss"),
                    ("load average (1 min) before", "load_before.0"),
                    ("variant", "variant"),
                    ("in process: at_quorum / sync loss at equal tokens",
                     "ratios.at_quorum_vs_sync_tokens"),
                    ("in process: at_quorum / sync loss at equal time",
                     "ratios.at_quorum_vs_sync_time"),
                    ("in process: each_period / sync loss at equal time",
                     "ratios.each_period_vs_sync_time"),
                    ("in process: at_quorum merges per H window",
                     "seeds.1234.at_quorum.merges_per_window"),
                    ("in process: each_period merges per H window",
                     "seeds.1234.each_period.merges_per_window"),
                    ("in process: at_quorum virtual s",
                     "seeds.1234.at_quorum.virtual_s"),
                    ("in process: each_period virtual s", "seeds.1234.each_period.virtual_s")],
    "dataplane": [("memcpy MB/s", "limits.memcpy_mb_s"),
                  ("transport MB/s", "limits.transport_mb_s"),
                  ("served read MB/s", "limits.served_read_mb_s"),
                  ("utilization", "utilization.value"),
                  ("wall time at >= 100M parameters (s)", "wall_s_at_100m"),
                  ("wall time, whole run (s)", "seconds")],
    "efficiency": [("cores", "cpus")],
    "goodput": [("decoupled goodput", "decoupled.goodput"),
                ("elastic goodput, warm pool", "elastic_warm.goodput"),
                ("elastic goodput, cold", "elastic.goodput"),
                ("oracle goodput", "oracle_goodput")],
    "gpu_smoke": [("device", "gpu"), ("bf16 / fp32 tokens/s", "bf16_speedup")],
    "merge": [("merge / memcpy", "ratio_to_memcpy"),
              ("ingest / memcpy", "ingest_ratio_to_memcpy"),
              ("memcpy bytes/s", "memcpy_bytes_per_s")],
    "models": [("parameters", "params"), ("held-out loss (nats per token)", "eval_loss"),
               ("held-out bits per byte", "eval_bpb"),
               ("transformers' loss of the export", "transformers_loss"),
               ("merged tokens/s", "merged_tokens_per_s"),
               ("bare tokens/s", "bare_tokens_per_s"), ("wall time (s)", "seconds"),
               ("load average (1 min) before", "load_before.0")],
    "overhead": [("island / bare tokens/s", "ratio"),
                 ("with sync / bare", "ratio_with_sync"),
                 ("bare tokens/s", "bare_tokens_per_s")],
    "quality": [("dp test loss", "dp.eval_loss"),
                ("DiLoCo test loss", "diloco_sync.eval_loss"),
                ("decoupled test loss", "decoupled.eval_loss"),
                ("decoupled int4 test loss", "decoupled_int4.eval_loss"),
                ("device", "device_name")],
    "rejoin": [("warm rejoin to first step p95 (s)", "warm.rejoin_to_first_step_s.p95"),
               ("cold rejoin to first step p95 (s)", "cold.rejoin_to_first_step_s.p95"),
               ("rejoin to first step p95 (s)", "rejoin_to_first_step_s.p95"),
               ("rejoin's cost p95 (s)", "rejoin_cost_s.p95")],
    "scale": [("device", "device"), ("minutes at the top size", "minutes"),
              ("wall time at >= 100M parameters (s)", "wall_s_at_100m"),
              ("wall time, whole run (s)", "seconds")],
    "signing": [("1 MB: BLAKE3 tag (ms)", "rows.0.tag_blake3_ms"),
                ("1 MB: SHA-256 tag (ms)", "rows.0.tag_sha256_ms")],
    "simulate": [("reconfiguration (s)", "reconfigure_s")],
    "soak": [("faults", "faults"), ("invariants held", "invariants"), ("goodput", "goodput"),
             ("chaos (s)", "chaos_s")],
    "ui_latency": [("status p50 (ms)", "p50_ms"), ("status p95 (ms)", "p95_ms"),
                   ("floor p95 (ms)", "floor_p95_ms")],
    "utilization": [("island utilization", "utilization.value")],
    "wan": [("kernel send (s)", "cases.0.kernel.send_s"),
            ("emulated send (s)", "cases.0.emulated.send_s"),
            ("kernel pull (s)", "cases.0.kernel.pull_s"),
            ("emulated pull (s)", "cases.0.emulated.pull_s"),
            ("kernel merges per min", "cases.0.kernel.merges_per_min"),
            ("emulated merges per min", "cases.0.emulated.merges_per_min"),
            ("kernel test loss", "cases.0.kernel.eval_loss"),
            ("emulated test loss", "cases.0.emulated.eval_loss"),
            ("kernel: link's round trip (s)", "cases.0.kernel.link_round_trip_s"),
            ("kernel: syncd's t_sync (s)", "cases.0.kernel.grace_round_trip_s"),
            ("kernel: t_sync from", "cases.0.kernel.grace_round_trip_source")],
}

INTRO = """\
# Benchmarks

<!-- Generated by `python -m bench docs` from bench/results: edit those or bench/docs.py. -->

Each benchmark measures side by side in one run, reports ratios, and exits non-zero
when a check misses its bound. It writes its summary to `bench/results/NAME.json`
(committed; the record less its curves and samples, `bench/results.py`) and the
whole record to `NAME-samples.json` (not committed), beside any HTML report. This
page is generated from the summaries by `.venv/bin/python -m bench docs`: run it
whenever a results file changes and commit the page with it (tests/bench/test_docs.py
fails on a stale page). Why each figure is where it is, run by run, is in
docs/journal/benchmarks-2026.md; what a figure means is in docs/FIGURES.md.

Figures are from the development machine (2 cores, CPU PyTorch) unless a table
says a GPU (its torch is a CUDA build). A column is one results file; "commit" is
the code it ran on, or for results older than the writer's record of it the commit
that brought them.
A check reads "value (bound)", and **missed** where it did not hold.
"""


def main() -> int:
    PAGE.write_text(page(COMMITTED))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


def page(folder: Path) -> str:
    """The whole page from the summaries in `folder`, benchmarks in name order."""
    runs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith("-samples.json"):
            continue
        runs.setdefault(path.stem.split("-")[0], []).append(
            (path.stem, json.loads(path.read_text())))
    sections = [section(name, sorted(files, key=lambda f: (f[0] != name, f[0])))
                for name, files in sorted(runs.items())]
    return "\n".join([INTRO, *sections])


def section(name: str, files: list[tuple[str, dict[str, Any]]]) -> str:
    """One benchmark's heading, what it measures, and its table."""
    checks = [c for _, record in files for c in record.get("checks", {})]
    missed = sum(not c.get("ok") for _, r in files for c in r.get("checks", {}).values())
    rows = [["", *(f"`{stem}.json`" for stem, _ in files)],
            ["command", *(f"`{command(stem, r)}`" for stem, r in files)],
            ["commit", *(commit(r) for _, r in files)],
            ["date", *(str(r.get("machine", {}).get("date", ""))[:10] for _, r in files)],
            ["machine", *(machine(r) for _, r in files)]]
    rows += [[label, *(figure(lookup(r, path)) for _, r in files)]
             for label, path in HEADLINES.get(name, [])
             if label not in checks and any(lookup(r, path) is not None for _, r in files)]
    rows += [[check, *(held(r.get("checks", {}).get(check)) for _, r in files)]
             for check in dict.fromkeys(checks)]
    tally = f"{len(checks)} checks, {missed} missed" if checks else "no checks"
    lines = [f"## {name}", "", f"{summary(name)} (`python -m bench {name}`): {tally}.", "",
             "| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows[1:]]
    return "\n".join(lines) + "\n"


def summary(name: str) -> str:
    """The first line of the benchmark's module docstring, its command left out."""
    module = ROOT / "bench" / f"{name}.py"
    doc = ast.get_docstring(ast.parse(module.read_text())) if module.exists() else None
    first = (doc or name).split("\n\n")[0].replace("\n", " ")
    return first.split(": `python -m bench")[0].rstrip(".")


def command(stem: str, record: dict[str, Any]) -> str:
    """The command that wrote the file: as the run recorded it, else from its name
    (NAME-quick: --quick, NAME-long: --minutes, NAME-PRESET or NAME-preset-PRESET)."""
    recorded = record.get("machine", {}).get("command")
    if recorded:
        return recorded
    name, *parts = stem.split("-")
    words = ["python -m bench", name]
    for part in parts:
        if part == "quick":
            words.append("--quick")
        elif part == "long" and record.get("minutes"):
            words.append(f"--minutes {record['minutes']:g}")
        elif part == record.get("preset"):
            words.append(f"--preset {part}")
    if record.get("device") == "cuda" and name == "scale":
        words.append("--device cuda")
    return " ".join(words)


def commit(record: dict[str, Any]) -> str:
    """The code the run measured; for a run older than the writer's record of it, the
    commit that brought its results."""
    machine = record.get("machine", {})
    found = machine.get("commit") or record.get("commit")
    if found:
        return f"`{found}`"
    return f"brought by `{machine['committed_in']}`" if machine.get("committed_in") else ""


def machine(record: dict[str, Any]) -> str:
    found = record.get("machine", {})
    threads = found.get("threads", "?")
    return f"torch {found.get('torch', '?')}, {threads} thread{'' if threads == 1 else 's'}"


def lookup(record: Any, path: str) -> Any:
    """The value at a dotted path (a list's index as a number), None where it is not."""
    for part in path.split("."):
        if isinstance(record, dict):
            record = record.get(part)
        elif isinstance(record, list) and part.isdigit() and int(part) < len(record):
            record = record[int(part)]
        else:
            return None
    return record


def figure(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict) and value and all(isinstance(v, bool) for v in value.values()):
        return f"{sum(value.values())} of {len(value)}"
    if isinstance(value, dict) and value and all(isinstance(v, int | float)
                                                 for v in value.values()):
        return ", ".join(f"{key} {figure(v)}" for key, v in value.items())
    return str(value) if isinstance(value, str) else json.dumps(value)


def held(check: dict[str, Any] | None) -> str:
    """A check's cell: its value and bound, bold and **missed** where it did not hold."""
    if check is None:
        return ""
    text = f"{figure(check.get('value'))} ({check.get('bound', '')})"
    return text if check.get("ok") else f"**{text}, missed**"
