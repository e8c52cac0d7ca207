"""Many hosts on one machine: a hub and a network namespace per region, joined by links
the kernel shapes, for the many-hosts test (tests/system/test_many_hosts.py) and
`python -m bench wan`.

The hub namespace holds the control Redis and the data plane (both wanting a
password), syncd (its server of published fragments at SYNCD_SERVE_URL) and the web
app; each region's namespace its Celery worker, its pool manager and the islands they
start. Each region is joined to the hub's bridge by a veth pair whose two ends are
shaped by the token-bucket queue discipline (tbf) at the stated rate, one each way,
so a message between a region and the hub takes its time in the kernel. netem is not
assumed, so there is no delay on the links: a run's latency stays in its islands
(emulation.link process) or is 0 (none).

Every process is configured only through the documented environment variables
(compose.yaml, docs/OPERATIONS.md): `environment` builds them, and every bind and
every URL it is given is checked against the harness's own address table
(`Network.addresses`, loopback aside): no test or benchmark sends a packet to an
address outside loopback and the namespaces it made. The addresses, 10.249.0.0/24,
exist only inside those namespaces.

Names carry the owner's pid (namespaces `arn<pid>-hub`, `arn<pid>-<i>`, links
`arn<pid>h<i>` / `arn<pid>r<i>`, the folder `/tmp/arn<pid>`), so a start clears what
a killed owner left (its processes, namespaces and folder) and nothing of a live one;
`Network.down` removes everything the harness made. Needs root, `ip` and `tc`:
`capability_missing` says in one sentence what is missing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "arn"
SUBNET = ipaddress.ip_network("10.249.0.0/24")
HUB_ADDRESS = str(SUBNET[1])
PORTS = {"redis": 6379, "dataplane": 6380, "postgres": 5432, "web": 8000, "syncd": 8765}
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(pid: int) -> bool:
    """Whether the process runs still: a zombie has ended."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _namespaces() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.strip()]


def _owner(name: str) -> int | None:
    """The pid in a name of the harness's (`arn<pid>-hub`, `/tmp/arn<pid>`), or None."""
    found = re.match(rf"{PREFIX}(\d+)", name)
    return int(found.group(1)) if found else None


def _remove_namespace(name: str) -> None:
    """Kill every process in the namespace (SIGKILL), then delete it and its links."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _running(int(p))]
        time.sleep(0.05)
    _ip("netns", "delete", name, check=False)


def clear_leftovers() -> list[str]:
    """Remove what a harness whose owner is gone left: its namespaces (their processes
    killed, their links with them) and its folder. Returns what it removed."""
    removed = []
    for name in _namespaces():
        owner = _owner(name)
        if owner is not None and not _alive(owner):
            _remove_namespace(name)
            removed.append(name)
    for folder in Path("/tmp").glob(f"{PREFIX}*"):
        owner = _owner(folder.name)
        if owner is not None and not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def capability_missing() -> str | None:
    """Why this machine cannot run the harness, in one sentence; None if it can."""
    if os.geteuid() != 0:
        return "the many-hosts harness needs root to make network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the many-hosts harness needs `{tool}` (iproute2), which is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        _ip("-n", probe, "link", "add", "pb", "type", "bridge")
        tc = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "tbf",
                             "rate", "10mbit", "burst", "32kb", "latency", "50ms"],
                            capture_output=True, text=True, timeout=30)
        if tc.returncode:
            return f"this kernel cannot shape a link with tbf: {tc.stderr.strip()}"
    except subprocess.CalledProcessError as e:
        return f"this machine cannot make namespaces, veth pairs or bridges: {e.stderr.strip()}"
    finally:
        _ip("netns", "delete", probe, check=False)
    return None


@dataclass(frozen=True)
class Region:
    """One region's namespace, its address, and its link's two ends (hub side, own)."""

    name: str
    namespace: str
    address: str
    hub_end: str
    own_end: str


def burst_bytes(rate_mbit: float) -> int:
    """The token bucket's depth: 2 ms of the rate, at least 16 KiB (a few packets), so
    that a message of more than a few packets takes its time at the rate."""
    return max(int(rate_mbit * 1e6 / 8 * 0.002), 16 * 1024)


class Network:
    """The hub and a namespace per region, each region's link shaped both ways.

    Args:
        regions: the regions' names.
        rate_mbit: each link's rate, each way, in Mbit/s.
    """

    def __init__(self, regions: list[str], rate_mbit: float):
        owner = os.getpid()
        self.tag = f"{PREFIX}{owner}"
        self.hub = f"{self.tag}-hub"
        self.bridge = f"{self.tag}b"
        self.folder = Path("/tmp") / self.tag
        self.rate_mbit = rate_mbit
        self.regions = {name: Region(name, f"{self.tag}-{i}", str(SUBNET[2 + i]),
                                     f"{self.tag}h{i}", f"{self.tag}r{i}")
                        for i, name in enumerate(regions)}
        self.addresses = {"hub": HUB_ADDRESS,
                          **{name: r.address for name, r in self.regions.items()}}
        self.processes: dict[str, subprocess.Popen] = {}

    def namespace(self, host: str) -> str:
        return self.hub if host == "hub" else self.regions[host].namespace

    def up(self) -> None:
        """Make the namespaces, the bridge and the links, with their addresses and rates."""
        clear_leftovers()
        self.folder.mkdir(mode=0o755)
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", self.bridge, "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/{SUBNET.prefixlen}",
            "dev", self.bridge)
        _ip("-n", self.hub, "link", "set", self.bridge, "up")
        for r in self.regions.values():
            _ip("netns", "add", r.namespace)
            _ip("-n", r.namespace, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", r.hub_end, "type", "veth", "peer", "name",
                r.own_end, "netns", r.namespace)
            _ip("-n", self.hub, "link", "set", r.hub_end, "master", self.bridge, "up")
            _ip("-n", r.namespace, "addr", "add", f"{r.address}/{SUBNET.prefixlen}",
                "dev", r.own_end)
            _ip("-n", r.namespace, "link", "set", r.own_end, "up")
            self.shape(r.name, self.rate_mbit)

    def shape(self, region: str, rate_mbit: float) -> None:
        """The region's link at `rate_mbit` each way (tbf on both ends)."""
        r = self.regions[region]
        for namespace, end in ((self.hub, r.hub_end), (r.namespace, r.own_end)):
            subprocess.run(["tc", "-n", namespace, "qdisc", "replace", "dev", end, "root",
                            "tbf", "rate", f"{rate_mbit}mbit", "burst",
                            str(burst_bytes(rate_mbit)), "latency", "200ms"],
                           check=True, capture_output=True, timeout=30)

    def unshape(self, region: str) -> None:
        """The region's link at the veth's own speed: no queue discipline of the harness."""
        r = self.regions[region]
        for namespace, end in ((self.hub, r.hub_end), (r.namespace, r.own_end)):
            subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", end, "root"],
                           capture_output=True, timeout=30)

    def cut(self, region: str) -> None:
        """The region's link down at the kernel, both ends: nothing crosses it."""
        r = self.regions[region]
        _ip("-n", self.hub, "link", "set", r.hub_end, "down")
        _ip("-n", r.namespace, "link", "set", r.own_end, "down")

    def heal(self, region: str) -> None:
        r = self.regions[region]
        _ip("-n", self.hub, "link", "set", r.hub_end, "up")
        _ip("-n", r.namespace, "link", "set", r.own_end, "up")

    def check_address(self, host: str) -> None:
        """Raise unless `host` is loopback or an address of the harness's table."""
        address = ipaddress.ip_address(host)
        if address not in LOOPBACK and host not in self.addresses.values():
            raise ValueError(f"{host} is not an address of the harness's namespaces "
                             f"({', '.join(sorted(self.addresses.values()))}) or loopback")

    def check_environment(self, env: dict[str, str]) -> None:
        """Every URL and bind in a process's environment names an address of the table."""
        for name, value in env.items():
            if name.endswith("_URL") and "://" in value and not value.startswith("sqlite"):
                self.check_address(urllib.parse.urlsplit(value).hostname or "")
            elif name == "SYNCD_SERVE" and value != "off":
                self.check_address(value.rsplit(":", 1)[0])

    def start(self, name: str, host: str, argv: list[str], env: dict[str, str],
              binds: tuple[str, ...] = ()) -> subprocess.Popen:
        """Start a process in `host`'s namespace ("hub" or a region), its output in the
        folder's `<name>.log`; `binds` are the addresses it listens on (checked)."""
        for address in binds:
            self.check_address(address)
        self.check_environment(env)
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - closed with it
        self.processes[name] = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(host), *argv], cwd=ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self.processes[name]

    def stop(self, name: str, timeout: float = 20) -> None:
        """SIGTERM to the process's group, SIGKILL after `timeout`."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def down(self) -> None:
        """Stop every process (regions first, then the hub's, the last started first:
        a service before what it uses), delete the namespaces (the links go with them)
        and the folder."""
        for name in [n for n in self.processes if not n.startswith("hub")] + \
                [n for n in reversed(self.processes) if n.startswith("hub")]:
            self.stop(name)
        for r in self.regions.values():
            _remove_namespace(r.namespace)
        _remove_namespace(self.hub)
        shutil.rmtree(self.folder, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the harness's is still there: namespaces, links, the folder."""
        found = [n for n in _namespaces() if n.startswith(self.tag)]
        links = _ip("-o", "link", "show", check=False).stdout
        found += [word for word in links.split() if word.startswith(self.tag)]
        return found + ([str(self.folder)] if self.folder.exists() else [])


def environment(home: Path, **config: str) -> dict[str, str]:
    """A process's whole environment on a host of its own: the basics and its config
    (documented variables only); `home` is made when a process starts with it."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "LOG_DIR": str(home / "logs"),
            "DATA_DIR": str(home / "data"), **config}


def redis_argv(port: int, folder: Path, password: str) -> list[str]:
    """A Redis on the hub's address alone, wanting `password`, keeping nothing on disk."""
    folder.mkdir(parents=True, exist_ok=True)
    return [shutil.which("redis-server") or "redis-server", "--port", str(port),
            "--bind", HUB_ADDRESS, "--dir", str(folder), "--save", "", "--appendonly", "no",
            "--requirepass", password, "--protected-mode", "no"]


class Probe:
    """A Python process in a namespace that runs the caller's code there: each `ask`
    sends code, which sets `result`, and gets its JSON back. What earlier code defined
    stays for the later."""

    def __init__(self, network: Network, host: str, env: dict[str, str]):
        network.check_environment(env)
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", network.namespace(host), sys.executable, "-c", _PROBE],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def ask(self, code: str) -> Any:
        """Run `code` in the probe; the value it left in `result`."""
        self.process.stdin.write(json.dumps(code) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(_ANSWER):
                reply = json.loads(line[len(_ANSWER):])
                if "error" in reply:
                    raise RuntimeError(f"in the probe: {reply['error']}")
                return reply["result"]
        raise RuntimeError(f"the probe exited ({self.process.wait()})")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


_ANSWER = "\x00answer "
# The probe's loop: a JSON string of code a line; the answer on a line of its own.
_PROBE = f"""
import json, sys, traceback
scope = {{}}
for line in sys.stdin:
    try:
        scope["result"] = None
        exec(json.loads(line), scope)
        reply = {{"result": scope["result"]}}
    except Exception:
        reply = {{"error": traceback.format_exc()}}
    sys.stdout.write({_ANSWER!r} + json.dumps(reply, default=str) + "\\n")
    sys.stdout.flush()
"""


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `condition` until it is true; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
