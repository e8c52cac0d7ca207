"""A standby's CPU priority (trainer/priority.py): idle only where it can come back.

Each case runs in a child process of its own: the kernel lets a thread leave
SCHED_IDLE with CAP_SYS_NICE (root's) or an RLIMIT_NICE of 20, and refuses a user with
neither (the default limit is 0): a child that became the user nobody with that limit.
The tests' user is root (CI's), which may make such a child.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.pool_manager import standby_preexec

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def as_user(code: str, unprivileged: bool, idle: bool = False) -> list[str]:
    """The words `code` prints in a child: as the user nobody with an RLIMIT_NICE of 0
    if `unprivileged`, else as the tests' user (root); started at idle priority first
    if `idle`."""
    assert os.geteuid() == 0, "these tests make children of other users: run them as root"
    prologue = "import os, resource, logging\nfrom trainer import priority\n"
    if unprivileged:
        prologue += ("resource.setrlimit(resource.RLIMIT_NICE, (0, 0))\n"
                     f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n")
    result = subprocess.run([sys.executable, "-c", prologue + code], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            preexec_fn=standby_preexec(os.getpid(), idle))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize(("unprivileged", "reversible"), [(True, False), (False, True)])
def test_idle_is_reversible_only_for_a_privileged_user_and_the_probe_changes_no_caller(
        unprivileged, reversible):
    out = as_user("print(priority.idle_is_reversible(), os.sched_getscheduler(0))",
                  unprivileged)

    assert out == [str(reversible), str(os.SCHED_OTHER)]


def test_a_standby_started_idle_takes_normal_priority_back_on_every_thread():
    code = ("import threading\n"
            "t = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)\n"
            "t.start()\n"
            "print(os.sched_getscheduler(t.native_id), priority.normal_priority(),\n"
            "      os.sched_getscheduler(0), os.sched_getscheduler(t.native_id))\n")

    started_idle, normal, main, other = as_user(code, False, idle=True)

    assert int(started_idle) == os.SCHED_IDLE  # threads inherit the process's
    assert (normal, int(main), int(other)) == ("True", os.SCHED_OTHER, os.SCHED_OTHER)


def test_a_user_that_may_not_leave_idle_priority_is_told_so_and_stays_idle():
    code = ("logging.basicConfig(format='%(message)s')\n"
            "priority.go_idle()\n"
            "print(priority.normal_priority(), os.sched_getscheduler(0))\n")

    assert as_user(code, True) == ["False", str(os.SCHED_IDLE)]


def test_a_manager_starts_standbys_at_idle_priority_only_when_told_to():
    code = "print(os.sched_getscheduler(0))"

    assert as_user(code, False, idle=True) == [str(os.SCHED_IDLE)]
    assert as_user(code, False, idle=False) == [str(os.SCHED_OTHER)]
