"""syncd's RunSync against a real Redis and the real database, driven tick by tick:
what ties its parts together (the status, the evaluation, the budget, a user's stop
and the run's end).

Updates are written into the run's stream exactly as an island would write
them (or as an attacker could), and each tick is one pass of the live loop.
"""

import math

import pytest

from syncd.service import STATUS_CPU_SHARE, STOP_WAIT_S
from syncd.store import RunStore
from tests.syncd.runs import (
    CONFIG,
    TOKENS_PER_STEP,
    beat_at,
    heartbeat_all,
    make_run_sync,
    send,
    write_beat,
)
from webapp.runs.models import Event, Run
from webapp.runs.reports import run_summary

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_a_run_that_completes_at_its_budget_keeps_only_its_status_and_logs_in_redis(
        redis_url, tmp_path):
    config = {**CONFIG, "budget": {"total_tokens": 1000}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    sync.store.signals.put_log("a", ["a line"])
    for p in (0, 1):
        for island in ("a", "b"):
            send(sync, island, p, 16, steps=16)  # 1,024 tokens a fragment
    sync.tick()
    sync.tick()

    assert sync.completed
    left = {k.decode()[len(sync.store.prefix):] for k in
            sync.store.client.scan_iter(match=sync.store.prefix + "*")}
    lasting = {k for k in left if sync.store.client.ttl(sync.store.key(k)) == -1}
    assert lasting == {"status", "status_seq"}
    assert "log:a" in left
    assert "outcome" in sync.store.status()
    assert not {k.split(":")[0] for k in left} & {"blob", "full", "pub", "momentum", "updates"}


def test_a_long_pass_lets_syncd_renew_its_leases_between_updates_and_merges(
        redis_url, tmp_path):
    calls = []
    sync = make_run_sync(redis_url, tmp_path, "decoupled", keepalive=lambda: calls.append(1))
    built = len(calls)
    heartbeat_all(sync)
    for island in ("a", "b"):
        send(sync, island, 0, 4)
        send(sync, island, 1, 4)

    sync.tick()

    assert built >= 2  # while the model was built and the fragments restored
    assert len(calls) - built >= 4 + 2  # after each of 4 updates and each of 2 merges


def test_the_eval_loss_comes_with_the_tokens_of_the_model_it_evaluated(redis_url, tmp_path):
    config = {**CONFIG, "eval": {"tokens": 256, "interval_steps": 1}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    for p in (0, 1):
        for island in ("a", "b"):
            send(sync, island, p, 4)
    sync.tick()  # both fragments merge; an evaluation starts on that model
    evaluated = sync.rounds.tokens_merged()
    sync.evaluation.wait(60)
    for p in (0, 1):
        for island in ("a", "b"):
            send(sync, island, p, 8, base_version=1)
    sync.clock_state["now"] += 1.0
    sync.tick()  # more merges, then the loss is picked up

    status = sync.store.status()
    assert status["tokens_merged"] > evaluated
    assert status["eval_loss"] is not None and status["eval_tokens"] == evaluated
    # the bytes tokenizer: a byte per token, the loss in bits
    assert status["eval_bpb"] == pytest.approx(status["eval_loss"] / math.log(2))


def test_the_status_carries_goodput_once_step_times_are_known(run_sync):
    for round_, now in enumerate((1000.0, 1004.0, 1008.0)):  # 4 steps in 4 s: 1 s a step
        run_sync.clock_state["now"] = now
        beat_at(run_sync, "a", now)
        beat_at(run_sync, "b", now)
        seq = 4 * (round_ + 1)
        send(run_sync, "a", 0, seq, base_version=round_)
        send(run_sync, "b", 0, seq, base_version=round_)
        run_sync.next_status = 0.0
        run_sync.tick()
    status = run_sync.store.status()
    assert status["versions"] == [3, 0]
    # Fragment 0 of 2 merged 12 steps of each island: 6 steps' worth of 1 s useful,
    # out of the 8 s allocated since syncd took the run on at 1000.
    assert status["goodput"] == pytest.approx(0.75)
    assert status["islands"]["a"]["goodput"] > 0
    assert status["islands"]["a"]["fault"] == "none"


def test_the_status_has_each_islands_tokens_per_second_and_the_train_loss(run_sync):
    for now, tokens, loss in ((1000.0, 0, 3.0), (1002.0, 640, 2.0)):
        run_sync.clock_state["now"] = now
        for island in ("a", "b"):
            beat = {"epoch": 1, "time": now, "step": tokens // 32, "tokens": tokens,
                    "state": "training", "loss": loss + (island == "b")}
            write_beat(run_sync, island, **beat)
        run_sync.next_status = 0.0
        run_sync.tick()
    status = run_sync.store.status()
    assert status["islands"]["a"]["tokens_per_s"] == pytest.approx(320.0)
    assert status["train_loss"] == pytest.approx(2.5)  # the median of 2.0 and 3.0


def test_each_islands_link_in_the_status_carries_the_bytes_of_the_last_interval(run_sync):
    for now, sent in ((1000.0, 1000), (1000.5, 1600)):
        run_sync.clock_state["now"] = now
        for name in ("a", "b"):
            beat = {"epoch": 1, "time": now, "step": 1, "tokens": 32, "state": "training",
                    "bytes_up": sent, "bytes_down": 2 * sent}
            write_beat(run_sync, name, **beat)
        run_sync.next_status = 0.0
        run_sync.tick()
    scale = run_sync.spec.config.emulation.bytes_scale
    assert run_sync.store.status()["islands"]["a"]["link"] == {
        "state": "up", "bytes_up": 600 * scale, "bytes_down": 1200 * scale}


def test_the_run_row_keeps_tokens_outer_steps_and_progress_current_at_the_status_cadence(
        run_sync):
    heartbeat_all(run_sync)
    for p in (0, 1):
        send(run_sync, "a", p, 4)
        send(run_sync, "b", p, 4)
    run_sync.tick()
    row = Run.objects.get(pk=run_sync.recorder.run_id)

    assert (row.tokens, row.outer_steps) == (2 * 4 * TOKENS_PER_STEP, 1)
    assert run_summary(row)["progress"] == pytest.approx(row.tokens / 10**9)


def test_each_merge_event_names_the_epoch_of_every_island_it_took_in(run_sync):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4, epoch=3)
    send(run_sync, "b", 0, 4)
    run_sync.tick()

    merge = Event.objects.get(run_id=run_sync.recorder.run_id, kind="merge")
    assert merge.detail["epochs"] == {"a": 3, "b": 1}


def test_a_stop_merges_the_open_rounds_checkpoints_and_ends_the_run_as_stopped(run_sync):
    run = Run.objects.get(pk=run_sync.recorder.run_id)
    Run.objects.filter(pk=run.pk).update(state=Run.State.STOPPING)
    run_sync.store.client.sadd("arch:runs", run_sync.store.run_id)
    beat_at(run_sync, "a", 1000.0)
    beat_at(run_sync, "b", 1000.0)
    send(run_sync, "a", 0, 4)  # below the quorum of 2: it waits
    run_sync.tick()
    assert run_sync.rounds.sync.versions() == [0, 0]

    run_sync.store.control.request_stop(1000.0)
    run_sync.tick()  # b still trains: the stop waits for it
    assert Run.objects.get(pk=run.pk).state == Run.State.STOPPING
    send(run_sync, "b", 1, 6, steps=6)  # b sends what it had not sent, then stops
    beat_at(run_sync, "b", 1000.0, state="stopped")
    beat_at(run_sync, "a", 1000.0, state="stopped")
    run_sync.tick()

    assert run_sync.rounds.sync.versions() == [1, 1]  # both open rounds merged as they were
    run.refresh_from_db()
    assert run.state == Run.State.STOPPED
    assert run.tokens == (4 + 6) * TOKENS_PER_STEP // 2
    assert run.checkpoints.count() == 1
    assert Event.objects.filter(run=run, kind="checkpoint").exists()
    merges = Event.objects.filter(run=run, kind="merge")
    assert {e.detail["reason"] for e in merges} == {"stop"}
    assert set(run.islands.values_list("state", flat=True)) == {"stopped"}
    assert run_sync.store.run_id not in RunStore.active_runs(run_sync.store.client)
    assert run_sync.store.status()["outcome"]["tokens_merged"] == run.tokens


def test_a_stop_gives_up_waiting_for_islands_that_never_stop(run_sync):
    run = Run.objects.get(pk=run_sync.recorder.run_id)
    Run.objects.filter(pk=run.pk).update(state=Run.State.STOPPING)
    heartbeat_all(run_sync)
    run_sync.store.control.request_stop(1000.0)
    run_sync.tick()
    assert Run.objects.get(pk=run.pk).state == Run.State.STOPPING

    run_sync.clock_state["now"] = 1000.0 + STOP_WAIT_S
    run_sync.tick()
    assert Run.objects.get(pk=run.pk).state == Run.State.STOPPED


def test_a_stop_saves_and_ends_the_run_even_when_the_final_evaluation_fails(
        run_sync, monkeypatch):
    run = Run.objects.get(pk=run_sync.recorder.run_id)
    Run.objects.filter(pk=run.pk).update(state=Run.State.STOPPING)
    heartbeat_all(run_sync)

    def missing_corpus(*args, **kwargs):
        raise FileNotFoundError("corpus.txt is not on syncd's host")

    monkeypatch.setattr("diloco.data.load_corpus", missing_corpus)  # read at the final eval
    run_sync.store.control.request_stop(1000.0)
    run_sync.tick()
    run_sync.clock_state["now"] = 1000.0 + STOP_WAIT_S
    run_sync.tick()

    run.refresh_from_db()
    assert run.state == Run.State.STOPPED
    assert run.checkpoints.count() == 1
    failed = Event.objects.get(run=run, kind="alert", detail__has_key="evaluation_failed")
    assert "corpus.txt is not on syncd's host" in failed.detail["evaluation_failed"]


def test_the_final_checkpoint_shows_the_final_evaluations_loss_not_the_one_before(run_sync):
    run = Run.objects.get(pk=run_sync.recorder.run_id)
    Run.objects.filter(pk=run.pk).update(state=Run.State.STOPPING)
    heartbeat_all(run_sync)
    run_sync.eval_loss = 9.0  # an evaluation of an earlier model
    run_sync.store.control.request_stop(1000.0)
    run_sync.tick()
    run_sync.clock_state["now"] = 1000.0 + STOP_WAIT_S
    run_sync.tick()

    final = run_sync.store.status()["eval_loss"]
    assert final is not None and final != 9.0
    [checkpoint] = Run.objects.get(pk=run.pk).checkpoints.all()
    assert checkpoint.eval_loss == final


def beat_step(sync, island: str, time: float, step: int) -> None:
    beat = {"epoch": 1, "time": time, "step": step, "tokens": step * TOKENS_PER_STEP,
            "state": "training"}
    write_beat(sync, island, **beat)


def test_a_syncd_that_takes_a_run_over_credits_only_the_steps_trained_since(
        run_sync, tmp_path, caplog):
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    # At 1000 a new syncd takes the run over: both islands' last heartbeats say step 395
    # and their updates of fragment 0, steps 1-400, are in flight. Island a then dies;
    # b trains on at 0.1 s a step.
    for island in ("a", "b"):
        beat_step(run_sync, island, 1000.0, 395)
        send(run_sync, island, 0, 400, steps=400)
    clock = {"now": 1000.0}
    again = RunSync(run_sync.store, DatabaseRecorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: clock["now"], control_every_s=0.0)
    clock["now"] = 1000.5
    again.tick()
    assert again.rounds.sync.version(0) == 1
    clock["now"] = 1001.5
    beat_step(run_sync, "b", 1001.5, 410)
    send(run_sync, "b", 0, 410, steps=10, base_version=1)
    again.tick()

    status = again.status(1020.0)
    # a: steps 396-400 of one fragment of two, 2.5 steps at 0.1 s, out of 20 s; on the
    # old clipped count, 200 steps' worth (20 s) read goodput 1.
    assert status["islands"]["a"]["goodput"] == pytest.approx(2.5 * 0.1 / 20)
    assert status["overcredited"] == []
    assert not status["islands"]["a"]["overcredited"]


def test_the_benchmarks_revalued_goodput_of_a_taken_over_run_is_at_most_one(
        run_sync, tmp_path):
    from bench.goodput_report import revalued_goodput
    from syncd import outcome
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    # As above, and the run ends 10 s after the takeover: bench goodput values each
    # island's useful steps of the outcome at one clock. They were 200 steps each
    # (40 s in 20 s allocated, 2.0) while syncd's clipped goodput read 1.
    for island in ("a", "b"):
        beat_step(run_sync, island, 1000.0, 395)
        send(run_sync, island, 0, 400, steps=400)
    clock = {"now": 1000.0}
    again = RunSync(run_sync.store, DatabaseRecorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: clock["now"], control_every_s=0.0)
    clock["now"] = 1000.5
    again.tick()
    again.accounting.observe_step_time("a", 0.1, faulted=False, steps=10)
    out = outcome.finish(again.accounting, again.spec, 1010.0, tokens_merged=0,
                         eval_loss=None, versions=[1, 0])

    useful = {name: island["useful_steps"] for name, island in out["islands"].items()}
    value = revalued_goodput(useful, {"a": 0.1, "b": 0.1}, out["allocated_s"])
    assert value <= 1
    assert value == pytest.approx(out["goodput"])


def test_an_island_credited_above_its_allocation_is_flagged_in_the_status_and_logged(
        run_sync, caplog):
    # Nothing tells this syncd that the 400 steps were trained before it took the run:
    # 200 steps' worth at 0.1 s a step is 20 s, credited in 4 s of allocation.
    for island in ("a", "b"):
        send(run_sync, island, 0, 4, steps=4)
    run_sync.tick()
    run_sync.clock_state["now"] = 1000.4
    for island in ("a", "b"):
        beat_step(run_sync, island, 1000.4, 8)
        send(run_sync, island, 1, 400, steps=400)
    run_sync.tick()
    run_sync.accounting.observe_step_time("a", 0.1, faulted=False, steps=100)
    run_sync.clock_state["now"] = 1004.0
    run_sync.next_status = 0.0
    run_sync.tick()

    status = run_sync.store.status()
    assert "a" in status["overcredited"] and status["islands"]["a"]["overcredited"]
    assert status["islands"]["a"]["goodput"] > 1
    assert any("credited more useful seconds than they were allocated" in r.message
               for r in caplog.records)


def drive_tiny_run(sync, until: float, *, islands=("a", "b"), step_s: float = 0.005,
                   pass_s: float = 0.005, status_pass_s: float = 0.06) -> None:
    """Islands of 5 ms steps (H = 4, P = 2: each sends one fragment every 2 steps), and
    syncd's passes 5 ms apart but 60 ms for the one that writes the status."""
    clock = sync.clock_state
    step = {island: int((clock["now"] - 1000.0) / step_s) for island in islands}
    while clock["now"] < until:
        for island in islands:
            while (step[island] + 1) * step_s <= clock["now"] - 1000.0:
                step[island] += 1
                seq = step[island]
                if seq % 2 == 0:
                    p = (seq // 2) % 2
                    send(sync, island, p, seq, steps=min(4, seq),
                         base_version=sync.rounds.sync.version(p))
                    beat_step(sync, island, clock["now"], seq)
        due = clock["now"] >= sync.next_status
        sync.tick()
        clock["now"] += status_pass_s if due else pass_s


def test_a_fault_free_run_of_a_tiny_model_reads_healthy_and_a_stall_reads_down(run_sync):
    # Fragments are due every 20 ms (theta 40 ms on the step times alone); every status
    # pass of syncd's holds merges up for 60 ms.
    drive_tiny_run(run_sync, 1003.0)
    healthy = run_sync.status(run_sync.clock_state["now"])
    assert healthy["versions"][0] > 50
    assert healthy["uptime"] >= 0.99
    assert healthy["theta_s"] >= 2 * 0.06

    # b stops: without a quorum of 2 nothing merges for 5 s.
    drive_tiny_run(run_sync, 1008.0, islands=("a",))
    stalled = run_sync.status(run_sync.clock_state["now"])
    assert stalled["uptime"] < 0.5


def test_the_status_says_the_tau_syncd_chose_for_the_islands_and_what_waiting_costs(
        run_sync):
    """Before syncd chooses, the islands use the config's tau 1; it measures the pace
    overlapping (windows of 2 s here), then waiting, and these islands, which train at
    one pace either way, wait (syncd/waiting.py)."""
    assert run_sync.status(1000.0)["tau"] == 1 and run_sync.store.control.tau() is None

    drive_tiny_run(run_sync, 1001.0)
    overlapping = run_sync.status(run_sync.clock_state["now"])
    assert overlapping["tau"] == 1 == run_sync.store.control.tau()  # as the islands start
    assert overlapping["wait_slowdown"] is None  # waiting is not measured yet

    drive_tiny_run(run_sync, 1006.5)
    chosen = run_sync.status(run_sync.clock_state["now"])
    assert chosen["wait_slowdown"] == pytest.approx(0.0, abs=0.05)
    assert chosen["tau"] == 0 == run_sync.store.control.tau()


def test_a_run_that_merges_on_while_an_island_cold_starts_beside_the_others_reads_up(
        redis_url, tmp_path):
    # Three islands of 0.1 s steps, K = 2, one fragment due every H = 4 steps: merges
    # every 0.4 s, theta 0.8 s. At 1020 c is lost and cold-starts beside a and b, which
    # go at 0.3 s a step while it loads: merges every 1.2 s, until 1026.
    config = {**CONFIG, "sync": {**CONFIG["sync"], "fragments": 1},
              "islands": [*CONFIG["islands"],
                          {"name": "c", "region": "us-east", "batch_size": 2}]}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    sync.store.set_epoch("c", 1)
    clock = sync.clock_state
    steps = dict.fromkeys("abc", 0)
    trained = dict.fromkeys("abc", 0.0)  # seconds of training so far
    while clock["now"] < 1046.0:
        now = clock["now"]
        slow = 1020.0 <= now < 1026.0
        for island in ("a", "b") if now >= 1020.0 else ("a", "b", "c"):
            trained[island] += 0.1 / (3 if slow else 1)
            while (steps[island] + 1) * 0.1 <= trained[island] + 1e-9:
                steps[island] += 1
                if steps[island] % 4 == 0:
                    send(sync, island, 0, steps[island],
                         base_version=sync.rounds.sync.version(0))
            beat_step(sync, island, now, steps[island])
        if now == 1020.0:
            sync.store.signals.report_death("c", 1, -9, at=now)
        sync.tick()
        clock["now"] = round(now + 0.1, 3)

    status = sync.status(clock["now"])
    assert sync.liveness.lost == {"c"}
    assert status["versions"][0] > 80
    assert status["uptime"] == pytest.approx(1.0)


def test_a_status_that_took_long_to_make_defers_the_next_within_its_cpu_share(
        run_sync, monkeypatch):
    cpu = iter([10.0, 10.5])  # the status takes half a CPU second to make
    monkeypatch.setattr("syncd.service.time.thread_time", lambda: next(cpu))
    run_sync.clock_state["now"] = 1000.0
    run_sync.next_status = 0.0

    run_sync.tick()

    assert run_sync.next_status == 1000.0 + 0.5 / STATUS_CPU_SHARE  # not 0.5 s later


def test_the_grace_windows_round_trip_follows_the_islands_measured_link_not_the_config(
        run_sync):
    """The config's link gives t_sync until the islands' heartbeats measure sends and
    pulls; then their median send plus pull does, whatever the config says."""
    configured = None
    for now, messages in ((1000.0, 2), (1000.5, 2), (1001.0, 6)):
        run_sync.clock_state["now"] = now
        for name, slow in (("a", 1.0), ("b", 3.0)):
            beat = {"epoch": 1, "time": now, "step": 1, "tokens": 32, "state": "training",
                    "sends": messages, "send_link_s": messages * 0.5 * slow,
                    "pulls": messages, "pull_link_s": messages * 0.25 * slow}
            write_beat(run_sync, name, **beat)
        run_sync.next_status = 0.0
        run_sync.tick()
        status = run_sync.store.status()
        configured = configured or status["round_trip_s"]
        assert status["round_trip_source"] == ("measured" if messages == 6 else "configured")
    # Islands a and b: 0.75 s and 2.25 s a round trip; the median is their mean.
    assert status["round_trip_s"] == pytest.approx(1.5)
    assert configured < 0.1
    assert run_sync.rounds.round_stats().sync_time_s == pytest.approx(1.5)
