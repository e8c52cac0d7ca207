"""The run page's scripts read only fields that syncd's status (syncd.records.RunStatus) and
the API's run (webapp.api.schemas.RunOut) have: a field renamed or dropped there fails here,
not silently on the page. run.js reads the status and the run; run_map.js the islands of
either (the status's, or the API's until the status comes); live.js the status it holds."""

from __future__ import annotations

import re
from pathlib import Path

from syncd.records import RunStatus, field_paths
from webapp.api.schemas import IslandOut, RunOut

STATIC = Path(__file__).resolve().parents[3] / "webapp/dashboard/static/dashboard"
RUN_JS = STATIC / "run.js"
# What the script's variables of these names hold: a place in the status (RunStatus)...
STATUS_NAMES = {"status": "", "lastStatus": "", "point": "", "island": "islands.*.",
                "fragment": "fragments.*.", "last": "fragments.*.last_merge.",
                "link": "islands.*.link.", "corpus": "corpus."}
# ... or in the API's run: the run, and an island it lists.
API_NAMES = {"run": RunOut, "listed": IslandOut}
# What run_map.js's variables hold: an island of the status or of the API's run, its link.
MAP_NAMES = {"island": "islands.*.", "i": "islands.*.", "i.link": "islands.*.link.",
             "link": "islands.*.link."}
# What live.js's hold: the status.
LIVE_NAMES = {"this.status": ""}


def _code(script: str) -> str:
    return re.sub(r"(^|\s)//.*$", "", script, flags=re.MULTILINE)


def status_reads(script: str, held: dict[str, str] = STATUS_NAMES) -> set[str]:
    """The status fields the script reads by name, as paths into the status
    (syncd.records.field_paths): `island.tokens_per_s` is islands.*.tokens_per_s.
    `held` says what the script's variables hold (`i.link`: a variable's field)."""
    code = _code(script)
    names = "|".join(re.escape(name) for name in sorted(held, key=len, reverse=True))
    reads = {held[name] + field
             for name, field in re.findall(rf"(?<![\w.$])({names})\.(\w+)", code)}
    # (fragment.last_merge || {}).weights, not a call's Object.entries(last.weights || {})
    reads |= {f"{held[name]}{field}.{inner}" for name, field, inner in re.findall(
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


def test_the_run_map_reads_only_fields_an_island_of_the_status_and_of_the_api_has():
    reads = status_reads((STATIC / "run_map.js").read_text(), MAP_NAMES)
    island_fields = {path.split(".")[2] for path in reads}

    assert {"islands.*.region", "islands.*.link.bytes_up"} <= reads  # the parser finds them
    assert reads - field_paths(RunStatus) == set()
    assert island_fields - set(IslandOut.model_fields) == set()


def test_the_live_status_reads_only_fields_the_status_record_has():
    reads = status_reads((STATIC / "live.js").read_text(), LIVE_NAMES)

    assert reads == {"time", "islands"}
    assert reads - field_paths(RunStatus) == set()


def test_a_map_read_of_a_field_the_island_or_its_link_lacks_is_found():
    script = """
    const width = (i) => i.link.bytes_sent + i.regoin;
    const link = island.link || {}; link.state + link.colour;
    """

    missing = status_reads(script, MAP_NAMES) - field_paths(RunStatus)

    assert missing == {"islands.*.link.bytes_sent", "islands.*.regoin", "islands.*.link.colour"}
