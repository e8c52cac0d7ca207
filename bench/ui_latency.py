"""UI latency: from syncd publishing a run's status to a real page having it.

`python -m bench ui_latency` starts the real path on this machine (its own Redis,
syncd, Daphne serving the ASGI app, the channel layer, the run websocket's
consumer) and a real Chromium page on a run of 16 islands. The islands are
synthetic: a thread here heartbeats for each of them four times a second as an
island process does, so syncd's status carries 16 alive islands; nothing trains.

Measured side by side, in the same run and under the same load:
- status: for each status the page takes (live.js applies the delta), the page's
  clock at that moment minus the time syncd stamped the status with when it
  built it. Same machine, same clock.
- floor: a bare channel-layer message sent from here straight to the run's group
  (an event, the cheapest thing the page takes), page clock minus send time.

Targets: status p95 at most half the status interval, and at most 3x the
floor's p95. Writes bench/results/ui_latency.json.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from bench import results
from bench.browser import CHROMIUM_FLAGS, chromium_path
from bench.system import ROOT, BenchSystem
from syncd.records import Heartbeat

REGIONS = ["us-east", "us-central", "us-west", "us-south"]
PROFILES = {"full": {"islands": 16, "updates": 240, "warmup": 10},
            "quick": {"islands": 16, "updates": 60, "warmup": 6}}
PASSWORD = "ui-latency-bench"
PROBE_ID = 10**12  # probe event ids: far above any real event's


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def make_run(islands: int) -> Any:
    """A running run of `islands` islands, started as the control room starts one. No
    worker consumes the region queues: the islands are the synthetic ones below."""
    from django.contrib.auth import get_user_model

    from webapp.runs.lifecycle import create_run, start_run

    get_user_model().objects.create_user("bench", password=PASSWORD)
    config = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
              "sync": {"inner_steps": 4, "fragments": 4, "min_quorum": 2},
              "eval": {"tokens": 256},
              "islands": [{"name": f"island-{i:02d}", "region": REGIONS[i % len(REGIONS)]}
                          for i in range(islands)]}
    run = create_run(name="ui latency", mode="decoupled", config=config, user=None)
    start_run(run, by=None)
    return run


class SyntheticIslands(threading.Thread):
    """Heartbeats for every island of the run, four times a second, as trainer.runner does."""

    def __init__(self, run: Any):
        super().__init__(daemon=True)
        from webapp.runs.stores import run_store

        self.store = run_store(run)
        self.names = list(run.islands.values_list("name", flat=True))
        self.stopping = threading.Event()

    def run(self) -> None:
        step = 0
        while not self.stopping.wait(0.25):
            step += 1
            for name in self.names:
                self.store.signals.heartbeat(name, Heartbeat.bare(
                    1, time.time(), step, step * 256, loss=3.0, bytes_down=step * 1000,
                    bytes_up=step * 1000))


def send_probes(run_id: int, count: int, every_s: float, stop: threading.Event,
                sent_ms: dict[int, float]) -> None:
    """Bare channel-layer messages to the run's group; `sent_ms` gets each one's id and
    send time. One event loop for all of them, as syncd keeps one: a connection made
    per message would be measured instead of the path."""
    import asyncio

    from channels.layers import get_channel_layer

    from syncd.live import status_group

    async def send_all() -> None:
        layer = get_channel_layer()
        for i in range(count):
            await asyncio.sleep(every_s)
            if stop.is_set():
                return
            sent_ms[PROBE_ID + i] = time.time() * 1000
            await layer.group_send(status_group(run_id), {"type": "run.events", "events": [{
                "id": PROBE_ID + i, "kind": "alert", "time": None, "island": None,
                "actor": None, "detail": {"message": "latency probe"}}]})

    asyncio.run(send_all())


def measure(system: BenchSystem, run: Any, profile: dict[str, Any]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    from syncd.service import STATUS_EVERY_S

    wanted = profile["updates"] + profile["warmup"]
    stop = threading.Event()
    sent_ms: dict[int, float] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{system.web_url}/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", PASSWORD)
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()
        page.goto(f"{system.web_url}/runs/{run.pk}/")
        page.wait_for_function("window.archLive && window.archLive.received.length > 0",
                               timeout=60000)
        probes = threading.Thread(target=send_probes, daemon=True,
                                  args=(run.pk, wanted, STATUS_EVERY_S, stop, sent_ms))
        probes.start()
        deadline = time.monotonic() + wanted * STATUS_EVERY_S * 4 + 60
        while time.monotonic() < deadline:
            got = page.evaluate("[archLive.received.length, archLive.eventsReceived.length]")
            results.say(f"  statuses {got[0]}/{wanted}, probes {got[1]}/{wanted}")
            if min(got) >= wanted:
                break
            time.sleep(2)
        stop.set()
        received = page.evaluate("archLive.received")
        events = page.evaluate("archLive.eventsReceived")
        browser.close()
    status_ms = [at - stamped * 1000 for _, at, stamped in received][profile["warmup"]:]
    floor_ms = [at - sent_ms[i] for i, at in events if i in sent_ms][profile["warmup"]:]
    if len(status_ms) < profile["updates"] or len(floor_ms) < profile["updates"]:
        raise RuntimeError(f"too few updates reached the page: {len(status_ms)} statuses, "
                           f"{len(floor_ms)} probes, wanted {profile['updates']} each")
    return {"p50_ms": round(percentile(status_ms, 50), 1),
            "p95_ms": round(percentile(status_ms, 95), 1),
            "floor_p50_ms": round(percentile(floor_ms, 50), 1),
            "floor_p95_ms": round(percentile(floor_ms, 95), 1),
            "interval_ms": STATUS_EVERY_S * 1000, "updates": len(status_ms),
            "probes": len(floor_ms), "islands": profile["islands"],
            "status_mean_ms": round(statistics.fmean(status_ms), 1)}


def main(quick: bool = False) -> int:
    profile = PROFILES["quick" if quick else "full"]
    system = BenchSystem(ROOT / "var" / "bench-ui-latency", REGIONS)
    try:
        system.setup_django()
        system.start_syncd()
        system.start_web()
        run = make_run(profile["islands"])
        heartbeats = SyntheticIslands(run)
        heartbeats.start()
        figures = measure(system, run, profile)
        heartbeats.stopping.set()
    finally:
        system.stop()
    checks = {
        "p95 <= interval / 2": results.check(figures["p95_ms"], figures["interval_ms"] / 2,
                                             at_least=False),
        "p95 <= 3 x floor p95": results.check(figures["p95_ms"], 3 * figures["floor_p95_ms"],
                                              at_least=False),
    }
    path = results.write("ui_latency-quick" if quick else "ui_latency",
                         {**figures, "checks": checks, "quick": quick})
    print(results.table([figures], ["islands", "updates", "p50_ms", "p95_ms", "floor_p50_ms",
                                    "floor_p95_ms", "interval_ms"]))
    print(results.checks_table(checks))
    results.say(f"wrote {path}")
    return results.exit_code(checks)
