"""Faults a user injects (webapp/runs/faults.py): kill an island or a region, straggle,
partition, degrade or corrupt an island, kill syncd; each checked, sent through the
run's Redis and recorded with who asked."""

import json
import time

import pytest

from syncd.connection import connect
from tests.webapp.runs.three_islands import commands
from webapp.runs.faults import (
    inject_fault,
    kill_island,
    kill_region,
    kill_syncd,
)
from webapp.runs.models import Event
from webapp.runs.services import stop_run

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_kill_island_sends_a_kill_for_its_epoch_and_records_who_asked(running, store,
                                                                       operator):
    kill_island(running, "west-a", operator)

    assert commands(store(running), "west-a") == [{"kind": "kill", "epoch": 1}]
    assert commands(store(running), "east-a") == []
    event = Event.objects.get(run=running, kind=Event.Kind.FAULT)
    assert (event.island.name, event.actor, event.detail["fault"]) == ("west-a", operator,
                                                                       "kill")


def test_kill_region_kills_every_island_of_the_region(running, store, operator):
    killed = kill_region(running, "us-east", operator)

    assert [i.name for i in killed] == ["east-a", "east-b"]
    s = store(running)
    # A dark region tells no one: the supervisors hold the deaths back.
    assert commands(s, "east-a") == commands(s, "east-b") == [
        {"kind": "kill", "epoch": 1, "report": False}]
    assert commands(s, "west-a") == []
    assert Event.objects.filter(run=running, kind=Event.Kind.FAULT, actor=operator,
                                detail__region="us-east").count() == 2


def test_kill_region_names_the_regions_the_run_has(running, operator):
    with pytest.raises(ValueError, match=r"no island in region 'eu-west' \(its regions: "
                                         r"us-east, us-west\)"):
        kill_region(running, "eu-west", operator)


def test_inject_fault_sets_the_islands_fault_key_for_a_while(running, store, operator):
    before = time.time()

    inject_fault(running, "east-b", "straggle", 30, 3.0, operator)

    s = store(running)
    fault = json.loads(s.client.get(s.key("fault", "east-b")))
    assert (fault["kind"], fault["factor"]) == ("straggle", 3.0)
    assert before + 30 <= fault["until"] <= time.time() + 30
    assert 30 < s.client.ttl(s.key("fault", "east-b")) <= 90
    event = Event.objects.get(run=running, kind=Event.Kind.FAULT)
    assert (event.island.name, event.actor) == ("east-b", operator)
    assert (event.detail["fault"], event.detail["seconds"], event.detail["factor"]) == (
        "straggle", 30, 3.0)


@pytest.mark.parametrize("kind, factor", [("partition", 1.0), ("degrade", 10.0),
                                          ("corrupt", 1.0)])
def test_each_fault_kind_has_a_default_factor(running, store, kind, factor):
    inject_fault(running, "east-a", kind, 5)

    s = store(running)
    assert json.loads(s.client.get(s.key("fault", "east-a")))["factor"] == factor


@pytest.mark.parametrize("kind, seconds, factor, message", [
    ("meteor", 10, None, "fault kind must be one of straggle, partition, degrade, corrupt, "
                         "got 'meteor'"),
    ("kill", 10, None, "fault kind must be one of"),
    ("straggle", 0, None, "seconds must be more than 0 and at most 86400, got 0"),
    ("straggle", float("inf"), None, "seconds must be"),
    ("straggle", "10", None, "seconds must be"),
    ("straggle", 10, 0.5, r"factor of straggle must be between 1 and 1e6 \(each inner step "
                          r"takes factor times as long\), got 0.5"),
    ("degrade", 10, float("nan"), "factor must be a finite number"),
    ("degrade", 10, 0.1, "factor of degrade must be between 1 and 1e6"),
])
def test_a_bad_fault_is_refused_and_changes_nothing(running, store, kind, seconds, factor,
                                                    message):
    with pytest.raises(ValueError, match=message):
        inject_fault(running, "east-a", kind, seconds, factor)

    s = store(running)
    assert s.client.get(s.key("fault", "east-a")) is None
    assert not Event.objects.filter(kind=Event.Kind.FAULT).exists()


def test_faults_need_an_island_the_run_has(running):
    with pytest.raises(ValueError, match=r"no island named 'nope' \(it has east-a, east-b, "
                                         r"west-a\)"):
        inject_fault(running, "nope", "partition", 10)


def test_faults_need_a_running_run(running, operator):
    stop_run(running, operator)

    with pytest.raises(ValueError, match="cannot inject a fault: the run is stopping"):
        inject_fault(running, "east-a", "partition", 10)
    with pytest.raises(ValueError, match="cannot kill an island: the run is stopping"):
        kill_island(running, "east-a", operator)


def test_only_an_admin_may_kill_syncd(running, operator, django_user_model, redis_url):
    with pytest.raises(PermissionError):
        kill_syncd(operator)
    admin = django_user_model.objects.create_superuser("root", password=None)
    kill_syncd(admin)
    assert connect(redis_url).lpop("arch:syncd:control") == b"kill"
    assert Event.objects.filter(run=running, kind="fault", actor=admin,
                                detail__fault="kill_syncd").exists()
