"""docs/BENCHMARKS.md is generated from the committed results, and stays a reference."""

import json

from bench import docs, results


def test_the_committed_page_is_the_one_the_results_make():
    assert docs.PAGE.read_text() == docs.page(docs.COMMITTED), \
        "docs/BENCHMARKS.md is stale: run `.venv/bin/python -m bench docs` and commit it"


def test_the_page_is_under_500_lines():
    assert len(docs.PAGE.read_text().splitlines()) < 500


def write(folder, name, record):
    (folder / f"{name}.json").write_text(results.dumps(record) + "\n")


def test_any_results_file_with_checks_gets_a_table_held_or_missed(tmp_path):
    checks = {"wan ratio": results.check(0.95, 0.9), "wan p95 (s)": results.check(3.0, 2.0, False)}
    write(tmp_path, "wan", {"checks": checks, "machine": {"date": "2026-12-06 20:00:00",
                                                         "commit": "abc1234", "threads": 2}})
    write(tmp_path, "wan-quick", {"checks": {"wan ratio": results.check(0.5, 0.8)}})
    (tmp_path / "wan-samples.json").write_text(json.dumps({"checks": {"left out": {}}}))

    page = docs.page(tmp_path)

    assert "## wan\n" in page and "(`python -m bench wan`): 3 checks, 2 missed." in page
    assert "| command | `python -m bench wan` | `python -m bench wan --quick` |" in page
    assert "| commit | `abc1234` |  |" in page
    assert "| wan ratio | 0.95 (>= 0.9) | **0.5 (>= 0.8), missed** |" in page
    assert "| wan p95 (s) | **3 (<= 2.0), missed** |  |" in page
    assert "left out" not in page


def test_a_headline_figure_comes_from_its_path_and_a_missing_one_is_left_out(tmp_path):
    write(tmp_path, "overhead", {"ratio": 0.97, "bare_tokens_per_s": 49853.2})
    write(tmp_path, "signing", {"rows": []})

    page = docs.page(tmp_path)

    assert "| island / bare tokens/s | 0.97 |" in page
    assert "| bare tokens/s | 49,853 |" in page and "with sync" not in page
    assert "BLAKE3" not in page and "no checks." in page


def test_a_headline_of_figures_by_name_reads_each_name_and_its_figure(tmp_path):
    write(tmp_path, "scale", {"wall_s_at_100m": {"113M": 333.3, "llama-114M": 1234.5}})

    page = docs.page(tmp_path)

    assert "| wall time at >= 100M parameters (s) | 113M 333.3, llama-114M 1,234 |" in page


def test_the_command_is_the_recorded_one_else_read_from_the_file_name():
    assert docs.command("scale-long", {"minutes": 10.0}) == "python -m bench scale --minutes 10"
    assert docs.command("quality-preset-gpt2_small", {"preset": "gpt2_small"}) == \
        "python -m bench quality --preset gpt2_small"
    assert docs.command("rejoin-quick", {"machine": {"command": "python -m bench rejoin -q"}}) \
        == "python -m bench rejoin -q"
