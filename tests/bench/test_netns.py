"""The many-hosts harness (bench/netns.py): its address table, its names, and what it
clears after an owner killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bench.netns import (
    HUB_ADDRESS,
    Network,
    _namespaces,
    _owner,
    burst_bytes,
    capability_missing,
    clear_leftovers,
    wait_until,
)
from tests.webapp.runs.test_runtime_processes import ROOT


def test_it_lets_processes_reach_only_loopback_and_its_own_addresses():
    network = Network(["us-east", "us-west"], 40.0)
    network.check_address("127.0.0.1")
    network.check_address(HUB_ADDRESS)
    network.check_address(network.regions["us-west"].address)
    with pytest.raises(ValueError, match="not an address of the harness's namespaces"):
        network.check_address("10.249.0.99")
    network.check_environment({"REDIS_URL": f"redis://:pw@{HUB_ADDRESS}:6379/0",
                               "DATABASE_URL": "sqlite:////tmp/db.sqlite3",
                               "SYNCD_SERVE": f"{HUB_ADDRESS}:8765"})
    with pytest.raises(ValueError, match=r"192\.168\.1\.5"):
        network.check_environment({"DATAPLANE_REDIS_URL": "redis://192.168.1.5:6380/0"})
    with pytest.raises(ValueError, match=r"0\.0\.0\.0"):
        network.check_environment({"SYNCD_SERVE": "0.0.0.0:8765"})


def test_its_names_carry_the_owners_pid_and_fit_an_interface_name():
    network = Network(["us-east", "us-west"], 40.0)
    names = [network.hub, network.bridge, network.folder.name,
             *(n for r in network.regions.values()
               for n in (r.namespace, r.hub_end, r.own_end))]
    assert {_owner(name) for name in names} == {os.getpid()}
    assert all(len(r.hub_end) <= 15 and len(r.own_end) <= 15
               for r in network.regions.values())
    assert _owner("archipelago") is None and _owner("eth0") is None


def test_the_token_bucket_holds_two_milliseconds_of_the_rate_and_a_few_packets_at_least():
    assert burst_bytes(1000.0) == 250_000
    assert burst_bytes(10.0) == 16 * 1024


_OWNER = """
import subprocess, sys
from bench.netns import Network
network = Network(["us-east"], 40.0)
network.up()
network.start("sleeper", "us-east", ["sleep", "600"],
              {"PATH": "/usr/bin:/bin", "HOME": str(network.folder / "sleeper")})
print(network.tag, network.processes["sleeper"].pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.integration
@pytest.mark.system
def test_a_start_clears_what_an_owner_killed_with_sigkill_left_and_nothing_of_a_live_one():
    missing = capability_missing()
    if missing:
        pytest.skip(f"{missing}.")
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        tag, sleeper = owner.stdout.readline().split()
        assert clear_leftovers() == []  # its owner lives: nothing of it is touched
        assert [n for n in _namespaces() if n.startswith(tag)]
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        removed = clear_leftovers()
        assert f"{tag}-hub" in removed and f"{tag}-0" in removed
        assert not [n for n in _namespaces() if n.startswith(tag)]
        wait_until(lambda: not os.path.exists(f"/proc/{sleeper}"), 10, "the sleeper to go")
        assert not os.path.exists(f"/tmp/{tag}")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        clear_leftovers()
