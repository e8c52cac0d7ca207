"""Writing results and printing tables, shared by the benchmarks."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from syncd.environment import path

# The web app serves the HTML reports from the same folder (its BENCH_RESULTS_DIR setting).
RESULTS = path("BENCH_RESULTS_DIR", Path(__file__).parent / "results")


# Keys that hold a benchmark's curves and samples, wherever they are in its record. The
# committed NAME.json, which the docs and the checks read, leaves them out: the whole record
# goes to NAME-samples.json beside it (not committed, as the HTML reports are not).
SAMPLE_KEYS = frozenset({"samples", "per_round", "raw", "phases", "fault_log", "heals", "fit",
                         "series", "curve", "curves", "goodput_table", "bandwidth_table"})
WIDTH = 120  # a list or an object this short in JSON stays on one line of the file


def write(name: str, data: dict[str, Any]) -> Path:
    """Write the record with the machine it ran on: bench/results/NAME-samples.json whole,
    bench/results/NAME.json its summary (the record less its SAMPLE_KEYS)."""
    RESULTS.mkdir(exist_ok=True)
    data = {**data, "machine": {"python": platform.python_version(), "torch": torch.__version__,
                                "threads": torch.get_num_threads(), "platform": platform.platform(),
                                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "commit": commit(), "command": command()}}
    (RESULTS / f"{name}-samples.json").write_text(dumps(data) + "\n")
    path = RESULTS / f"{name}.json"
    path.write_text(dumps(summary(data)) + "\n")
    return path


def commit() -> str | None:
    """The commit the benchmark ran on, "+ changes" where the tracked files differ from it."""
    git = ["git", "-C", str(Path(__file__).parent)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head} + changes" if changed else head


def command() -> str | None:
    """The command line of `python -m bench ...`; None when something else called write."""
    main = Path(sys.argv[0])
    if (main.parent.name, main.name) != ("bench", "__main__.py"):
        return None
    return " ".join(["python -m bench", *sys.argv[1:]])


def summary(record: Any) -> Any:
    """The record without its curves and samples (SAMPLE_KEYS, at any depth)."""
    if isinstance(record, dict):
        return {k: summary(v) for k, v in record.items() if k not in SAMPLE_KEYS}
    if isinstance(record, list):
        return [summary(v) for v in record]
    return record


def dumps(value: Any, indent: int = 0) -> str:
    """JSON indented by two, where a list or an object that fits in WIDTH stays on one line."""
    flat = json.dumps(value)
    if indent + len(flat) <= WIDTH or not isinstance(value, dict | list) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{_key(k)}: {dumps(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dumps(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _key(key: Any) -> str:
    """A key as a JSON object names it: json.dumps makes the keys 3, True and None the
    strings "3", "true" and "null", which json.dumps of the key alone does not."""
    return json.dumps({key: 0})[1:-4]


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def say(message: str) -> None:
    print(message, flush=True, file=sys.stderr)


def check(value: float, bound: float, at_least: bool = True) -> dict[str, Any]:
    """One relation a benchmark must show: its value, its bound and whether it holds."""
    ok = value >= bound if at_least else value <= bound
    return {"value": round(value, 4), "bound": f"{'>=' if at_least else '<='} {bound}", "ok": ok}


def checks_table(checks: dict[str, dict[str, Any]]) -> str:
    return table([{"check": k, **v} for k, v in checks.items()], ["check", "value", "bound", "ok"])


def exit_code(checks: dict[str, dict[str, Any]]) -> int:
    """0 when every check holds; otherwise says which failed and returns 1."""
    failed = [k for k, c in checks.items() if not c["ok"]]
    for name in failed:
        say(f"FAILED: {name} is {checks[name]['value']}, the target is {checks[name]['bound']}")
    return 1 if failed else 0
