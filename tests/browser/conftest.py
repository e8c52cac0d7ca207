"""A real Chromium, driven by Playwright, against Django's live server.

Debian's chromium package is used through its executable path (Playwright's
own browser download is not available here); CHROMIUM overrides the path.
"""

import os
import shutil

import pytest

# Playwright's sync API keeps an event loop running in the test thread; the ORM
# calls the tests and Django's live server make around it are still synchronous.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not path:
        raise RuntimeError("browser tests need Chromium: apt-get install chromium "
                           "(.ci/run installs it), or set CHROMIUM to its path")
    return path


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()
