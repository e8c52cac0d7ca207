"""syncd's corpus of a run, prepared in a thread of its own (syncd/corpus.py): the loop
that serves every run goes on ticking while a `train` tokenizer is trained."""

import json
import threading
from pathlib import Path

import pytest

from diloco import data
from diloco.config_parse import parse_config
from syncd import checkpoint
from syncd.corpus import RunCorpus
from tests.syncd.runs import CONFIG, heartbeat_all, make_run_sync
from webapp.runs.models import Checkpoint


def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}: the islands train on. "
                                                f"ü{i % 13}"}) + "\n" for i in range(2000)))
    return path


@pytest.fixture
def held(monkeypatch):
    """Preparation that waits until `release` is set, having set `preparing`."""
    gate = {"preparing": threading.Event(), "release": threading.Event()}
    real = data.load_corpus

    def slow(*args, **kwargs):
        gate["preparing"].set()
        assert gate["release"].wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr("diloco.data.load_corpus", slow)
    return gate


def test_the_corpus_is_prepared_in_a_thread_and_read_once_ready(tmp_path, held):
    config = parse_config({"data": {"path": str(jsonl(tmp_path)), "tokenizer": "train",
                                    "vocab_size": 300}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")
    assert not corpus.ready()

    corpus.start()
    assert held["preparing"].wait(10) and not corpus.ready()
    held["release"].set()

    assert corpus.get().meta["tokenizer"]["vocab_size"] == 300
    assert corpus.ready()


def test_reading_a_corpus_that_failed_raises_its_error(tmp_path):
    config = parse_config({"data": {"path": str(tmp_path / "missing.jsonl"),
                                    "tokenizer": "train"}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")

    with pytest.raises(Exception, match=r"missing\.jsonl"):
        corpus.get()
    assert corpus.ready()


@pytest.mark.integration
@pytest.mark.django_db
def test_syncd_ticks_on_while_a_train_tokenizers_corpus_is_prepared_and_checkpoints_after(
        redis_url, tmp_path, monkeypatch, held):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    config = {**CONFIG, "data": {"path": str(jsonl(tmp_path)), "tokenizer": "train",
                                 "vocab_size": 300}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    assert held["preparing"].wait(10)  # syncd began preparing it when it took the run
    sync.recovery.ask_for_checkpoint()

    sync.tick()  # returns: the checkpoint waits for the corpus, the loop does not

    run = sync.recorder.run_id
    assert not Checkpoint.objects.filter(run_id=run).exists()
    held["release"].set()
    sync.recovery.corpus.get()
    sync.tick()
    saved = Checkpoint.objects.get(run_id=run)
    tokenizer = checkpoint.load_tokenizer(Path(saved.path), saved.sha256)
    assert tokenizer == sync.recovery.corpus.get().tokenizer_json()
