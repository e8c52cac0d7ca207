"""A corpus' documents read in one streaming pass (diloco/documents.py)."""

import json

import pytest

from diloco.documents import PIECE, Progress, Skipped, bar, pieces


def test_jsonl_lines_without_the_field_or_not_json_are_counted_and_the_rest_read(tmp_path):
    file = tmp_path / "c.jsonl"
    file.write_text("\n".join([json.dumps({"text": "one"}), "{not json",
                               json.dumps({"body": "no text"}), "", json.dumps(["a list"]),
                               json.dumps({"text": "two", "id": 2})]) + "\n")
    skipped = Skipped()

    read = list(pieces([("c.jsonl", file)], "text", skipped))

    assert [(p.text, p.key, p.last) for p in read] == [("one", "c.jsonl:1", True),
                                                       ("two", "c.jsonl:6", True)]
    assert (skipped.bad_json, skipped.no_text) == (1, 2)
    assert skipped.examples[0] == "c.jsonl:2: not JSON"


def test_a_named_text_field_is_read(tmp_path):
    file = tmp_path / "c.jsonl"
    file.write_text(json.dumps({"content": "body", "text": "other"}) + "\n")

    assert [p.text for p in pieces([("c.jsonl", file)], "content", Skipped())] == ["body"]


def test_parquet_rows_are_read_in_batches_and_empty_ones_counted(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"row {i}" if i % 100 else None for i in range(2500)]
    pq.write_table(pa.table({"text": rows, "n": list(range(2500))}), tmp_path / "c.parquet",
                   row_group_size=700)
    skipped = Skipped()

    read = list(pieces([("c.parquet", tmp_path / "c.parquet")], "text", skipped))

    assert [p.text for p in read] == [r for r in rows if r]
    assert skipped.no_text == 25


def test_a_parquet_file_without_the_column_says_which_it_has(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "c.parquet")

    with pytest.raises(ValueError, match=r"no column 'text'.*body"):
        list(pieces([("c.parquet", tmp_path / "c.parquet")], "text", Skipped()))


def test_a_text_file_is_one_document_in_line_cut_pieces_and_a_binary_one_is_skipped(tmp_path):
    line = "x" * 999 + "\n"
    (tmp_path / "big.txt").write_text(line * (2 * PIECE // 1000 + 10))
    (tmp_path / "bin.txt").write_bytes(b"abc\x00def")
    skipped = Skipped()

    read = list(pieces([("big.txt", tmp_path / "big.txt"), ("bin.txt", tmp_path / "bin.txt")],
                       "text", skipped))

    assert len(read) == 3 and [p.last for p in read] == [False, False, True]
    assert all(p.text.endswith("\n") for p in read)
    assert "".join(p.text for p in read) == (tmp_path / "big.txt").read_text()
    assert skipped.binary_files == 1


def test_a_pass_counts_the_bytes_read_the_documents_and_the_records_skipped(tmp_path):
    file = tmp_path / "c.jsonl"
    file.write_text("\n".join([json.dumps({"text": "one"}), "{not json",
                               json.dumps({"text": "two"}), json.dumps({"body": "x"})]) + "\n")
    skipped = Skipped()
    progress = Progress(tmp_path, "tokenizing", file.stat().st_size, skipped=skipped)
    seen = []

    for _ in pieces([("c.jsonl", file)], "text", skipped, progress):
        seen.append(progress.snapshot())

    assert [s["documents"] for s in seen] == [1, 2]
    assert seen[1]["bytes_read"] < file.stat().st_size  # the last line not read yet
    assert progress.snapshot() == {"stage": "tokenizing", "bytes_read": file.stat().st_size,
                                   "bytes_total": file.stat().st_size, "documents": 2,
                                   "skipped": 2}


def test_a_pass_logs_its_progress_with_a_bar_at_most_once_per_interval_and_at_its_end(caplog):
    clock = {"now": 0.0}
    progress = Progress("c.jsonl", "tokenizing", 1000, every_s=5.0,
                        clock=lambda: clock["now"])

    with caplog.at_level("INFO", logger="diloco.documents"):
        for second in range(10):
            clock["now"] = float(second)
            progress.add(50)
        progress.done()

    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # at 5 s (the next is due at 10 s), and at the end
    assert lines[0].startswith("corpus c.jsonl: tokenizing: [######--------------] 300 of")
    assert lines[-1].endswith("1000 of 1000 bytes read (100%), 0 documents, 0 skipped")


def test_the_bar_fills_with_the_fraction_clipped_to_whole():
    assert bar(0.0) == "[" + "-" * 20 + "]"
    assert bar(0.5, width=4) == "[##--]"
    assert bar(1.7, width=4) == "[####]"
