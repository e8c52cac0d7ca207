"""A real Chromium, driven by Playwright, against the real system: Daphne serving the
ASGI app, syncd and a Celery worker, on a Redis of the tests' own and the test
database.

Debian's chromium package is used through its executable path (Playwright's own
browser download is not available here); CHROMIUM overrides the path. Screenshots
of each step go to var/artifacts/browser/ (ARTIFACTS_DIR overrides), kept after
the run.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

from bench.browser import CHROMIUM_FLAGS, chromium_path
from tests.fixtures import wait_until
from tests.webapp.runs.test_runtime_processes import ROOT, Processes, database_url
from trainer.launch import free_port

# Playwright's sync API keeps an event loop running in the test thread; the ORM
# calls the tests make around it are still synchronous.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

REGIONS = "us-east,us-central,us-west,us-south"


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


LOCAL = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)(:\d+)?/")


@pytest.fixture
def page(browser):
    """A page at the operator's screen size, 1440 x 900, that may reach this host only:
    a request to any other host is blocked, and the test fails if the page made one."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    elsewhere: list[str] = []

    def local_only(route) -> None:
        if LOCAL.match(route.request.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", local_only)
    page = context.new_page()
    page.set_default_timeout(20000)
    yield page
    context.close()
    assert elsewhere == [], f"the page asked other hosts for {elsewhere}"


@pytest.fixture
def artifacts(request) -> Path:
    """Where a test keeps its screenshots: one folder per test."""
    root = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "var" / "artifacts" / "browser"))
    folder = root / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def control_room(redis_url, tmp_path, settings, transactional_db):
    """The web app on Daphne, syncd and one worker for the regions us-east and us-west;
    yields the web app's base URL."""
    # The redis_url fixture pointed Celery at the test Redis.
    settings.LOG_DIR = tmp_path / "logs"
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url(),
           "CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "LOG_DIR": str(tmp_path / "logs"),
           "DJANGO_SETTINGS_MODULE": "webapp.settings", "PYTHONPATH": str(ROOT),
           "REGIONS": REGIONS,
           # The runs the tests create read a corpus from the test's own folder.
           "DATA_ROOTS": str(tmp_path)}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    processes = Processes(env, tmp_path)
    processes.start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                    "webapp.asgi:application")
    processes.start("syncd", "manage.py", "syncd")
    processes.start("worker", "-m", "celery", "-A", "webapp", "worker",
                    "-Q", "control,region.us-east,region.us-west", "--concurrency", "4",
                    "--pool", "prefork", "-n", "browser@test", "--without-gossip",
                    "--without-mingle", "--loglevel", "WARNING")
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/accounts/login/", timeout=2).status == 200
        except OSError:
            return False

    wait_until(answers, 60, "Daphne to serve the sign-in page")
    yield url
    processes.stop_all()
