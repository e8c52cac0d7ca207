"""Chromium for Playwright: the benchmarks and the browser tests launch it the same
way, through its executable path (Playwright's own browser download is not
available here).

`python -m bench.browser` prints the Chromium they use, after installing Debian's
package chromium if there is none and it runs as root on Debian or Ubuntu;
`make test-browser` runs it before the browser tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from syncd.environment import text

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Where a Chromium is when it is not on PATH: Debian's own binary, snap's, macOS apps.
USUAL_PLACES = (Path("/usr/lib/chromium/chromium"), Path("/snap/bin/chromium"),
                Path("/Applications/Chromium.app/Contents/MacOS/Chromium"),
                Path("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"))
MISSING = ("Chromium was not found on PATH or in the usual places: install the package "
           "chromium (apt-get install chromium) or set CHROMIUM to its path.")


def find_chromium() -> str | None:
    """CHROMIUM if set, else a Chromium on PATH, else one in the usual places."""
    if override := text("CHROMIUM"):
        if not os.access(override, os.X_OK):
            raise RuntimeError(f"CHROMIUM is {override!r}, which is not an executable file.")
        return override
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return next((str(p) for p in USUAL_PLACES if os.access(p, os.X_OK)), None)


def can_install() -> bool:
    """Whether this process may install Debian's package: root on Debian or Ubuntu."""
    try:
        release = Path("/etc/os-release").read_text()
    except OSError:
        return False
    family = {line.split("=", 1)[1].strip().strip('"')
              for line in release.splitlines() if line.startswith(("ID=", "ID_LIKE="))}
    words = {word for value in family for word in value.split()}
    return os.geteuid() == 0 and bool(words & {"debian", "ubuntu"}) and \
        shutil.which("apt-get") is not None


def install_chromium() -> None:
    print("Chromium is missing: installing Debian's package chromium", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=300"]  # another install may hold the lock
    for command in (["apt-get", *wait, "update", "-qq"],
                    ["apt-get", *wait, "install", "-y", "-qq", "chromium"]):
        if subprocess.run(command, env=env, stdout=subprocess.DEVNULL).returncode:
            raise RuntimeError(f"{' '.join(command)} failed; {MISSING}")


def chromium_path(may_install: bool | None = None) -> str:
    """The Chromium to launch; installed first when it is missing and `may_install`
    (default: can_install()); RuntimeError with MISSING when there is none."""
    path = find_chromium()
    if path is None and (can_install() if may_install is None else may_install):
        install_chromium()
        path = find_chromium()
    if path is None:
        raise RuntimeError(MISSING)
    return path


if __name__ == "__main__":
    try:
        print(f"Chromium: {chromium_path()}")
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
