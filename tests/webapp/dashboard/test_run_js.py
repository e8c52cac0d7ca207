"""The run page's script reads only fields that syncd's status (syncd.records.RunStatus) and
the API's run (webapp.api.schemas.RunOut) have: a field renamed or dropped there fails here,
not silently on the page."""

from __future__ import annotations

import re
from pathlib import Path

from syncd.records import RunStatus, field_paths
from webapp.api.schemas import IslandOut, RunOut

RUN_JS = Path(__file__).resolve().parents[3] / "webapp/dashboard/static/dashboard/run.js"
# What the script's variables of these names hold: a place in the status (RunStatus)...
STATUS_NAMES = {"status": "", "lastStatus": "", "point": "", "island": "islands.*.",
                "fragment": "fragments.*.", "last": "fragments.*.last_merge.",
                "link": "islands.*.link."}
# ... or in the API's run: the run, and an island it lists.
API_NAMES = {"run": RunOut, "listed": IslandOut}


def _code(script: str) -> str:
    return re.sub(r"(^|\s)//.*$", "", script, flags=re.MULTILINE)


def status_reads(script: str) -> set[str]:
    """The status fields the script reads by name, as paths into the status
    (syncd.records.field_paths): `island.tokens_per_s` is islands.*.tokens_per_s."""
    code, names = _code(script), "|".join(STATUS_NAMES)
    reads = {STATUS_NAMES[name] + field
             for name, field in re.findall(rf"(?<![\w.$])({names})\.(\w+)", code)}
    # (fragment.last_merge || {}).weights, not a call's Object.entries(last.weights || {})
    reads |= {f"{STATUS_NAMES[name]}{field}.{inner}" for name, field, inner in re.findall(
        rf"(?<![\w.$])\(({names})\.(\w+) \|\| \{{\}}\)\.(\w+)", code)}
    # islandValues(point.islands, "tokens_per_s"): a field of each island, named
    reads |= {f"islands.*.{field}" for field in re.findall(r'islandValues\([\w.]+, "(\w+)"\)',
                                                           code)}
    return reads


def api_reads(script: str) -> dict[str, set[str]]:
    """The API run's and listed islands' fields the script reads, by variable name."""
    code = _code(script)
    return {name: set(re.findall(rf"(?<![\w.$]){name}\.(\w+)", code)) for name in API_NAMES}


def test_the_run_page_reads_only_fields_the_status_record_has():
    reads = status_reads(RUN_JS.read_text())

    assert len(reads) >= 35  # the parser still finds the page's reads
    assert reads - field_paths(RunStatus) == set()


def test_the_run_page_reads_only_fields_the_api_gives_of_a_run_and_its_islands():
    for name, fields in api_reads(RUN_JS.read_text()).items():
        assert fields, name
        assert fields - set(API_NAMES[name].model_fields) == set(), name


def test_a_read_of_a_field_the_record_lacks_is_found():
    script = """
    // status.in_a_comment is no read
    $("x").textContent = status.goodput + island.no_such_field;
    for (const [island, w] of Object.entries((fragment.last_merge || {}).weighs || {})) {}
    extend("chart", time, islandValues(point.islands, "tokens_per_minute"));
    """

    missing = status_reads(script) - field_paths(RunStatus)

    assert missing == {"islands.*.no_such_field", "fragments.*.last_merge.weighs",
                       "islands.*.tokens_per_minute"}
