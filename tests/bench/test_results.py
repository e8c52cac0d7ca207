"""The results writer: a committed summary, the whole record beside it."""

import json
from pathlib import Path

from bench import results

COMMITTED = Path(results.__file__).parent / "results"


def test_it_writes_the_whole_record_beside_a_summary_without_its_samples(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    record = {"ratio": 0.9, "per_round": [1, 2], "sizes": [{"label": "1M", "samples": [3]}],
              "checks": {"ratio": results.check(0.9, 0.8)}}

    path = results.write("made_up", record)

    summary = json.loads(path.read_text())
    assert summary["sizes"] == [{"label": "1M"}] and "per_round" not in summary
    assert summary["checks"]["ratio"]["ok"] and summary["machine"]["torch"]
    assert summary["machine"]["commit"]  # the code it ran on
    assert summary["machine"]["command"] is None  # not `python -m bench`: nothing to repeat
    whole = json.loads((tmp_path / "made_up-samples.json").read_text())
    assert whole == {**record, "machine": summary["machine"]}


def test_it_keeps_a_short_object_on_one_line_and_breaks_a_long_one():
    check = {"value": 0.9, "bound": ">= 0.8", "ok": True}
    long = {"values": list(range(60))}

    lines = results.dumps({"check": check, "long": long}).splitlines()

    assert lines[1] == f'  "check": {json.dumps(check)},'
    assert len(lines) == 4 + 60 + 3  # each of the 60 values on a line of its own
    assert json.loads(results.dumps({"a": [check, long]})) == {"a": [check, long]}


def test_the_committed_results_are_summaries_under_5000_lines():
    files = [f for f in COMMITTED.glob("*.json") if not f.name.endswith("-samples.json")]
    lines = sum(len(f.read_text().splitlines()) for f in files)

    assert lines < 5000, f"bench/results holds {lines} lines of JSON"
    for f in files:
        assert json.loads(f.read_text()) == results.summary(json.loads(f.read_text())), f.name


def test_dumps_writes_keys_that_are_not_strings_as_json_names_them():
    record = {"by_island": {3: 1.0, True: 2, None: [1] * 40}, "rows": [{"a": "x" * 90}]}

    assert json.loads(results.dumps(record)) == json.loads(json.dumps(record))


def test_a_table_of_no_rows_is_its_header():
    """A run of some modes only has no checks to print: the table is its header."""
    assert results.table([], ["check", "value"]) == "check  value"
