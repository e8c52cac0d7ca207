import re
from pathlib import Path

import pytest

from syncd import environment
from syncd.environment import SettingError, data_dir, flag, items, number, path, text, whole

ROOT = Path(__file__).resolve().parents[2]


def documented_variables() -> set[str]:
    """The variables docs/OPERATIONS.md's "Environment" table has a row for."""
    operations = (ROOT / "docs" / "OPERATIONS.md").read_text()
    section = operations.split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`",
                                                         row.split(" | ")[0])}


def test_the_documented_variables_are_the_ones_the_settings_module_names():
    assert documented_variables() == environment.SETTINGS


def test_a_variable_the_module_does_not_name_is_refused(monkeypatch):
    monkeypatch.setenv("NOT_A_SETTING", "1")
    with pytest.raises(KeyError, match="NOT_A_SETTING is not an environment variable"):
        text("NOT_A_SETTING")


def test_an_empty_or_unset_value_is_the_default(monkeypatch):
    monkeypatch.setenv("HOST", "  ")
    monkeypatch.delenv("PORT", raising=False)
    assert text("HOST", "127.0.0.1") == "127.0.0.1"
    assert whole("PORT", 8000) == 8000
    monkeypatch.setenv("HOST", " 0.0.0.0 ")
    assert text("HOST", "127.0.0.1") == "0.0.0.0"


def test_a_whole_number_is_refused_naming_its_variable_when_bad_or_too_small(monkeypatch):
    monkeypatch.setenv("PORT", "abc")
    with pytest.raises(SettingError, match="PORT must be a whole number, got 'abc'"):
        whole("PORT", 8000)
    monkeypatch.setenv("PORT", "0")
    with pytest.raises(SettingError, match="PORT must be at least 1, got 0"):
        whole("PORT", 8000, minimum=1)
    monkeypatch.setenv("PORT", "8001")
    assert whole("PORT", 8000, minimum=1) == 8001


def test_without_a_default_a_variable_must_be_set(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SettingError, match="RANK must be set"):
        whole("RANK")
    monkeypatch.delenv("ARCHIPELAGO_LAUNCHED_AT", raising=False)
    with pytest.raises(SettingError, match="ARCHIPELAGO_LAUNCHED_AT must be set"):
        number("ARCHIPELAGO_LAUNCHED_AT")


def test_a_number_is_refused_naming_its_variable(monkeypatch):
    monkeypatch.setenv("SYNCD_EVAL_CPU_SHARE", "0.1")
    assert number("SYNCD_EVAL_CPU_SHARE", 0.02) == 0.1
    monkeypatch.setenv("SYNCD_EVAL_CPU_SHARE", "a tenth")
    with pytest.raises(SettingError, match="SYNCD_EVAL_CPU_SHARE must be a number"):
        number("SYNCD_EVAL_CPU_SHARE", 0.02)


def test_a_flag_reads_common_spellings_and_refuses_others(monkeypatch):
    monkeypatch.setenv("DEBUG", "yes")
    assert flag("DEBUG") is True
    monkeypatch.setenv("DEBUG", "OFF")
    assert flag("DEBUG", True) is False
    monkeypatch.setenv("DEBUG", "")
    assert flag("DEBUG", True) is True
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(SettingError, match="DEBUG must be 1 or 0"):
        flag("DEBUG")


def test_a_list_drops_blank_items(monkeypatch):
    monkeypatch.setenv("REGIONS", " us-east, ,us-west,")
    assert items("REGIONS", "") == ["us-east", "us-west"]
    monkeypatch.delenv("REGIONS")
    assert items("REGIONS", "a,b") == ["a", "b"]
    monkeypatch.setenv("DATA_ROOTS", "/data:/corpora")
    assert items("DATA_ROOTS", "", ":") == ["/data", "/corpora"]


def test_the_data_directory_is_data_dir_else_var_data_in_the_checkout(monkeypatch, tmp_path):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.delenv("DATA_DIR")
    assert data_dir() == ROOT / "var" / "data"
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    assert path("LOG_DIR", ROOT / "var" / "logs") == tmp_path / "logs"
