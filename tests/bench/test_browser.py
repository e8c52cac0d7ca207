"""Finding the Chromium the browser tests and benchmarks launch."""

import pytest

import bench.browser
from bench.browser import MISSING, chromium_path


@pytest.fixture
def no_chromium(monkeypatch, tmp_path):
    """A machine whose PATH and usual places have no Chromium."""
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(bench.browser, "USUAL_PLACES", ())
    (tmp_path / "bin").mkdir()
    return tmp_path / "bin"


def test_a_chromium_on_path_is_found(no_chromium):
    chromium = no_chromium / "chromium-browser"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)

    assert chromium_path(may_install=False) == str(chromium)


def test_without_chromium_the_message_names_the_package_to_install(no_chromium):
    with pytest.raises(RuntimeError) as raised:
        chromium_path(may_install=False)

    assert str(raised.value) == MISSING
    assert "install the package chromium" in MISSING


def test_a_chromium_override_that_is_not_executable_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "nowhere"))

    with pytest.raises(RuntimeError, match="not an executable file"):
        chromium_path(may_install=False)

