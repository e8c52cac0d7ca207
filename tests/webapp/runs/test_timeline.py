"""Each island's life on a timeline, from events and metric rows: state spans, fault
spans, marks, the recovery of each outage in seconds, and a lane's part from a time on."""

from webapp.runs.timeline import island_timeline, lane_since


def event(kind: str, time: float, island: str | None = "a", **detail) -> dict:
    return {"kind": kind, "time": time, "island": island, "detail": detail}


def samples(*points: tuple[float, str], fault: str = "none") -> list:
    return [(t, {"a": {"state": state, "fault": fault}, "b": {"state": "training"}})
            for t, state in points]


KILLED_AND_REJOINED = [
    event("fault", 100.0, fault="kill", epoch=1),
    event("island_lost", 103.0, silent_s=3.0),
    event("rejoin", 105.0, from_epoch=1, epoch=2),
    event("island_revived", 110.0, epoch=2),
    event("rejoin", 115.0, epoch=2, seconds_to_first_step=10.0),
    event("merge", 116.0, None, fragment=0, version=7, weights={"b": 1.0}),
    event("merge", 118.0, None, fragment=1, version=7, weights={"a": 0.5, "b": 0.5}),
]
HISTORY = samples((96.0, "training"), (98.0, "training"), (100.0, "training"),
                  (102.0, "training"), (104.0, "lost"), (106.0, "lost"), (108.0, "lost"),
                  (110.0, "starting"), (112.0, "starting"), (114.0, "starting"),
                  (116.0, "training"), (118.0, "training"))


def spans(lane: dict) -> list[tuple[str, float, float]]:
    return [(s["state"], s["start"], s["end"]) for s in lane["spans"]]


def test_a_killed_islands_lane_is_lost_then_rejoining_then_back_from_its_first_step():
    lane = island_timeline("a", KILLED_AND_REJOINED, HISTORY, end=120.0)

    # Training again at syncd's rejoin event (115), before the next metric row says so.
    assert spans(lane) == [("training", 96.0, 103.0), ("lost", 103.0, 105.0),
                           ("rejoining", 105.0, 110.0), ("starting", 110.0, 115.0),
                           ("training", 115.0, 120.0)]


def test_a_lost_span_gives_kill_lost_rejoin_first_step_and_first_merge_in_seconds():
    lane = island_timeline("a", KILLED_AND_REJOINED, HISTORY, end=120.0)

    lost = lane["spans"][1]
    assert lost["recovery"]["fault"] == "kill"
    assert lost["recovery"]["seconds"] == {"fault": 0.0, "lost": 3.0, "rejoin": 5.0,
                                           "first_step": 15.0, "first_merge": 18.0}
    assert lane["spans"][2]["recovery"] == lost["recovery"]  # rejoining: the same outage
    assert "recovery" not in lane["spans"][0]


def test_an_outage_not_yet_healed_says_what_has_not_happened():
    lane = island_timeline("a", KILLED_AND_REJOINED[:2], HISTORY[:6], end=107.0)

    assert spans(lane)[-1] == ("lost", 103.0, 107.0)
    assert lane["spans"][-1]["recovery"]["seconds"] == {
        "fault": 0.0, "lost": 3.0, "rejoin": None, "first_step": None, "first_merge": None}


def test_the_rejoins_phases_come_with_its_recovery_when_syncd_records_them():
    events = [*KILLED_AND_REJOINED[:4],
              event("rejoin", 115.0, epoch=2, seconds_to_first_step=10.0,
                    phases={"launch": 4.0, "load": 6.0})]

    lane = island_timeline("a", events, HISTORY, end=120.0)

    assert lane["spans"][1]["recovery"]["phases"] == {"launch": 4.0, "load": 6.0}


def test_a_rejoin_asked_before_the_loss_is_noticed_makes_the_outage_rejoining_at_once():
    events = [event("fault", 100.0, fault="kill"), event("rejoin", 101.0, from_epoch=1),
              event("island_lost", 103.0), event("island_revived", 108.0),
              event("rejoin", 112.0, seconds_to_first_step=11.0)]

    lane = island_timeline("a", events, HISTORY, end=120.0)

    assert spans(lane)[1] == ("rejoining", 103.0, 108.0)
    assert lane["spans"][1]["recovery"]["seconds"]["rejoin"] == 1.0
    assert lane["spans"][1]["recovery"]["seconds"]["first_step"] == 12.0


def test_a_partition_that_silences_an_island_is_the_cause_of_its_loss():
    events = [event("fault", 100.0, fault="partition", seconds=20, until=120.0),
              event("island_lost", 103.0), event("island_revived", 120.5)]
    history = samples((100.0, "training"), (104.0, "lost"), (121.0, "training"))

    lane = island_timeline("a", events, history, end=130.0)

    assert spans(lane) == [("training", 100.0, 103.0), ("lost", 103.0, 120.5),
                           ("training", 120.5, 130.0)]
    recovery = lane["spans"][1]["recovery"]
    assert recovery["fault"] == "partition"
    assert recovery["seconds"]["first_step"] == 21.0  # its first training row
    assert lane["faults"] == [{"fault": "partition", "start": 100.0, "end": 120.0}]


def test_a_fault_lasts_until_its_end_the_next_fault_or_now():
    events = [event("fault", 100.0, fault="straggle", until=200.0),
              event("fault", 110.0, fault="degrade", until=115.0),
              event("fault", 120.0, fault="corrupt", until=180.0)]

    lane = island_timeline("a", events, HISTORY, end=150.0)

    assert [(f["fault"], f["start"], f["end"]) for f in lane["faults"]] == [
        ("straggle", 100.0, 110.0), ("degrade", 110.0, 115.0), ("corrupt", 120.0, 150.0)]


def test_faults_rejoins_and_the_merges_that_took_the_islands_update_are_marks():
    lane = island_timeline("a", KILLED_AND_REJOINED, HISTORY, end=120.0)

    assert [(m["kind"], m["time"]) for m in lane["marks"]] == [
        ("fault", 100.0), ("rejoin", 105.0), ("rejoin", 115.0), ("merge", 118.0)]
    assert lane["marks"][-1]["label"] == "fragment 1 v7, weight 0.50"


def test_an_island_with_no_rows_yet_has_an_empty_lane():
    assert island_timeline("c", KILLED_AND_REJOINED, HISTORY, end=120.0) == {
        "island": "c", "spans": [], "faults": [], "marks": []}


def test_a_lane_since_a_time_keeps_what_ends_after_it_cut_there_and_the_marks_from_it():
    lane = island_timeline("a", KILLED_AND_REJOINED, HISTORY, end=120.0)

    newer = lane_since(lane, 106.0)

    assert spans(newer) == [("rejoining", 106.0, 110.0), ("starting", 110.0, 115.0),
                            ("training", 115.0, 120.0)]
    assert newer["spans"][0]["recovery"] == lane["spans"][2]["recovery"]
    assert [m["time"] for m in newer["marks"]] == [115.0, 118.0]
    assert lane["spans"][2]["start"] == 105.0  # the lane itself is left as it was


def test_a_lane_since_a_time_cuts_a_fault_span_that_crosses_it():
    events = [event("fault", 100.0, fault="straggle", until=110.0)]
    lane = island_timeline("a", events, HISTORY, end=120.0)

    assert lane_since(lane, 104.0)["faults"] == [
        {"fault": "straggle", "start": 104.0, "end": 110.0}]
    assert lane_since(lane, 110.0)["faults"] == []
