"""Each island's life on a timeline, from a run's events and metric rows (pure).

An island's lane has its states as spans (from the metric rows, which syncd writes
every two seconds, and, for its outages, from the events: lost at `island_lost`,
rejoining from the rejoin asked for, back at `island_revived`), its active faults
as spans (a fault event lasts until its `until`, or until the next fault replaces
it), and marks for its faults, rejoins and the merges that took its update.

An outage's spans carry its recovery: how many seconds after the fault that caused
it (a kill or a partition; else after the loss) the island was lost, the rejoin was
asked for, it trained again (its first step) and a merge first took its update.

Times are seconds since the epoch. Events are dicts with kind, time, island (a
name or None) and detail; samples are (time, {island: {"state", "fault"}}) pairs.

A page that has a lane asks only for what is new: `lane_since` keeps the part of a
lane from a time on, with the spans that cross it cut there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
Sample = tuple[float, dict[str, dict[str, Any]]]
# The faults that last a while (a kill is over at once) and the ones that make an
# island go silent.
LASTING_FAULTS = ("straggle", "partition", "degrade", "corrupt")
SILENCING_FAULTS = ("kill", "partition")


@dataclass
class Outage:
    lost: float
    fault: Event | None = None
    rejoin: float | None = None
    revived: float | None = None
    first_step: Event | None = None
    recovery: dict[str, Any] = field(default_factory=dict)


def island_timeline(island: str, events: list[Event], samples: list[Sample],
                    end: float) -> dict[str, Any]:
    """The lane of `island`: {"island", "spans", "faults", "marks"}, up to `end`.

    Spans are {"state", "start", "end"} (an outage's with its "recovery"), faults
    {"fault", "start", "end"}, marks {"kind", "time", "label"} in time order.
    """
    events = sorted(events, key=lambda e: e["time"])
    mine = [e for e in events if e.get("island") == island]
    states = [(t, islands[island]) for t, islands in sorted(samples, key=lambda s: s[0])
              if island in islands]
    outages = _outages(island, mine, events, states)
    return {"island": island, "spans": _state_spans(states, outages, end),
            "faults": _fault_spans(mine, end), "marks": _marks(island, events)}


def lane_since(lane: dict[str, Any], since: float) -> dict[str, Any]:
    """The part of `lane` from `since` on: its spans and fault spans that end after it
    (started no earlier than `since`: cut there) and its marks at or after it."""
    def cut(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**span, "start": max(span["start"], since)} for span in spans
                if span["end"] > since]

    return {"island": lane["island"], "spans": cut(lane["spans"]),
            "faults": cut(lane["faults"]),
            "marks": [m for m in lane["marks"] if m["time"] >= since]}


def _is_rejoin_request(event: Event) -> bool:
    # The web app's rejoin names the epoch it replaces; syncd's, the island's first step.
    return event["kind"] == "rejoin" and "from_epoch" in event["detail"]


def _outages(island: str, mine: list[Event], events: list[Event],
             states: list[tuple[float, dict[str, Any]]]) -> list[Outage]:
    outages: list[Outage] = []
    open_: Outage | None = None
    fault: Event | None = None  # the last silencing fault not yet healed
    rejoin: float | None = None  # a rejoin asked for before the loss was noticed
    for event in mine:
        kind, detail = event["kind"], event["detail"]
        if kind == "fault" and detail.get("fault") in SILENCING_FAULTS and open_ is None:
            fault = event
        elif _is_rejoin_request(event):
            if open_ is None:
                rejoin = event["time"]
            elif open_.rejoin is None:
                open_.rejoin = event["time"]
        elif kind == "island_lost" and open_ is None:
            cause = fault if fault and event["time"] <= fault["detail"].get(
                "until", event["time"]) else None
            open_ = Outage(lost=event["time"], fault=cause, rejoin=rejoin)
            outages.append(open_)
        elif kind == "island_revived" and open_ is not None:
            open_.revived = event["time"]
            open_, fault = None, None
        elif kind == "rejoin":  # syncd's: the new epoch's first step
            owner = outages[-1] if outages and outages[-1].first_step is None else None
            if owner is not None and (open_ is owner or owner.rejoin is not None):
                owner.first_step = event
            if open_ is None:
                fault, rejoin = None, None  # healed: they cause nothing after this
    for outage in outages:
        outage.recovery = _recovery(island, outage, events, states)
    return outages


def _recovery(island: str, outage: Outage, events: list[Event],
              states: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """Seconds from the outage's cause to each step of its recovery; None: not yet."""
    first_step = outage.first_step["time"] if outage.first_step else None
    if first_step is None and outage.revived is not None:
        first_step = next((t for t, s in states
                           if t >= outage.revived and s.get("state") == "training"), None)
    first_merge = None
    if first_step is not None:
        first_merge = next((e["time"] for e in events if e["kind"] == "merge"
                            and e["time"] >= first_step
                            and (e["detail"].get("weights") or {}).get(island, 0) > 0), None)
    start = outage.fault["time"] if outage.fault else outage.lost
    times = {"fault": start if outage.fault else None, "lost": outage.lost,
             "rejoin": outage.rejoin, "first_step": first_step, "first_merge": first_merge}
    detail = outage.first_step["detail"] if outage.first_step else {}
    return {"fault": outage.fault["detail"]["fault"] if outage.fault else None,
            "seconds": {k: None if t is None else round(t - start, 2) for k, t in times.items()},
            "phases": detail.get("phases") or {}}


def _state_spans(states: list[tuple[float, dict[str, Any]]], outages: list[Outage],
                 end: float) -> list[dict[str, Any]]:
    def outage_at(t: float) -> Outage | None:
        return next((o for o in outages
                     if o.lost <= t < (o.revived if o.revived is not None else end)), None)

    # (time, state, the outage it belongs to)
    points: list[tuple[float, str, Outage | None]] = [
        (t, s["state"], None) for t, s in states if outage_at(t) is None]
    for outage in outages:
        asked_before = outage.rejoin is not None and outage.rejoin <= outage.lost
        points.append((outage.lost, "rejoining" if asked_before else "lost", outage))
        if outage.rejoin is not None and not asked_before:
            points.append((outage.rejoin, "rejoining", outage))
        if outage.revived is not None:
            back = next((s["state"] for t, s in states
                         if t >= outage.revived and s["state"] != "lost"), "starting")
            points.append((outage.revived, back, None))
        if outage.first_step is not None:  # more precise than the next metric row
            points.append((outage.first_step["time"], "training", None))
    points.sort(key=lambda p: p[0])
    spans: list[dict[str, Any]] = []
    for t, state, outage in points:
        if t >= end:
            break
        if spans and spans[-1]["state"] == state and spans[-1].get("_outage") is outage:
            continue
        if spans:
            spans[-1]["end"] = t
        spans.append({"state": state, "start": t, "end": end, "_outage": outage})
    for span in spans:
        outage = span.pop("_outage")
        if outage is not None:
            span["recovery"] = outage.recovery
    return spans


def _fault_spans(mine: list[Event], end: float) -> list[dict[str, Any]]:
    faults = [e for e in mine if e["kind"] == "fault"
              and e["detail"].get("fault") in LASTING_FAULTS]
    spans = []
    for i, event in enumerate(faults):
        detail = event["detail"]
        until = detail.get("until", event["time"] + detail.get("seconds", 0))
        # One fault key per island: the next fault replaces this one.
        replaced = faults[i + 1]["time"] if i + 1 < len(faults) else end
        stop = min(until, replaced, end)
        if stop > event["time"]:
            spans.append({"fault": detail["fault"], "start": event["time"], "end": stop})
    return spans


def _marks(island: str, events: list[Event]) -> list[dict[str, Any]]:
    marks = []
    for event in events:
        kind, detail = event["kind"], event["detail"]
        if kind == "merge":
            weight = (detail.get("weights") or {}).get(island, 0)
            if weight > 0:
                marks.append({"kind": "merge", "time": event["time"],
                              "label": f"fragment {detail.get('fragment')} "
                                       f"v{detail.get('version')}, weight {weight:.2f}"})
        elif event.get("island") == island and kind == "fault":
            where = f" of region {detail['region']}" if detail.get("region") else ""
            marks.append({"kind": "fault", "time": event["time"],
                          "label": f"{detail.get('fault')}{where}"})
        elif event.get("island") == island and kind == "rejoin":
            label = ("rejoin asked" if _is_rejoin_request(event) else
                     f"training again, {detail.get('seconds_to_first_step')} s after the rejoin")
            marks.append({"kind": "rejoin", "time": event["time"], "label": label})
    return marks
