"""A warm standby's CPU priority: idle while it is built and waits, normal once claimed.

A host's pool manager starts each standby at idle priority (SCHED_IDLE), so that a
refill (an interpreter, torch's imports, a model built and stepped once: seconds of
CPU) never slows the islands that train beside it; at its claim the standby takes
the normal priority (SCHED_OTHER) back, since from then on it is an island.

Linux lets a thread leave SCHED_IDLE only with CAP_SYS_NICE or an RLIMIT_NICE of 20
(a nice value of 0 within its limit): root may, a service user with the default
limit of 0 may not. Such a standby would train at idle priority for good, starved by
anything else on its host. So the manager asks first (`idle_is_reversible`, tried on
a thread of its own that ends after) and starts standbys at idle priority only where
they can come back; elsewhere they are built at normal priority, and the manager says
so once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import psutil

log = logging.getLogger("archipelago.pool")


def _set_policy(tid: int, policy: str) -> bool:
    """Thread `tid` (0: the calling one) under the policy `os.<policy>`; False where the
    system refused or has no such policy."""
    try:
        os.sched_setscheduler(tid, getattr(os, policy), os.sched_param(0))
    except (OSError, AttributeError):
        return False
    return True


def idle_is_reversible() -> bool:
    """Whether a thread of this process (and so of a child it starts, which inherits
    its user, capabilities and limits) may go from SCHED_IDLE back to SCHED_OTHER. Tried
    on a short-lived thread: this process's own threads keep their priority."""
    answer: list[bool] = []
    thread = threading.Thread(name="priority-probe", target=lambda: answer.append(
        _set_policy(0, "SCHED_IDLE") and _set_policy(0, "SCHED_OTHER")))
    thread.start()
    thread.join()
    return answer[0]


def go_idle() -> None:
    """This process (its calling thread, before it starts any other) at idle priority;
    nothing where the system has no SCHED_IDLE. For a child before exec."""
    _set_policy(0, "SCHED_IDLE")


def idle_threads() -> list[int]:
    """The ids of this process's threads at idle priority (none where the system does
    not list them)."""
    try:
        threads = psutil.Process().threads()
    except psutil.Error:
        return []
    idle = []
    for thread in threads:
        # A thread that ended meanwhile, or a system without the call.
        with contextlib.suppress(OSError, AttributeError):
            if os.sched_getscheduler(thread.id) == os.SCHED_IDLE:
                idle.append(thread.id)
    return idle


def normal_priority() -> bool:
    """Every thread of this process back from SCHED_IDLE to SCHED_OTHER; False, with a
    warning, if one could not be (the system refused: see the module's docstring)."""
    for tid in idle_threads():
        _set_policy(tid, "SCHED_OTHER")  # a refusal is told below
    left = idle_threads()
    if left:
        log.warning("%d threads of process %d stay at idle priority: this user may not "
                    "leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE below 20)", len(left),
                    os.getpid())
    return not left
