"""Writing results and printing tables, shared by the benchmarks."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

# The web app serves the HTML reports from the same folder (its BENCH_RESULTS_DIR setting).
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR", Path(__file__).parent / "results"))


def write(name: str, data: dict[str, Any]) -> Path:
    """Write bench/results/NAME.json with the machine it ran on."""
    RESULTS.mkdir(exist_ok=True)
    data = {**data, "machine": {"python": platform.python_version(), "torch": torch.__version__,
                                "threads": torch.get_num_threads(), "platform": platform.platform(),
                                "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
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
