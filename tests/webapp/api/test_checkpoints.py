"""Checkpoints through the API (webapp/api/checkpoints.py): the list, the download and
a sample of the model."""

import contextlib
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from diloco.data import load_corpus
from diloco.evaluation import Evaluator
from diloco.island import initial_model
from syncd.checkpoint import save
from syncd.environment import data_dir
from tests.diloco.test_hf import TINY_LLAMA
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint
from webapp.runs.sampling import MAX_CONCURRENT_SAMPLES, SAMPLER

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def checkpoints_of(run) -> str:
    return f"/api/runs/{run.pk}/checkpoints"


def test_it_lists_the_runs_checkpoints(viewer_api, running, checkpoint):
    response = viewer_api.get(checkpoints_of(running))

    assert response.status_code == 200
    [listed] = response.json()["checkpoints"]
    assert listed["id"] == checkpoint.pk
    assert (listed["outer_step"], listed["versions"]) == (3, {"0": 3, "1": 4})
    assert (listed["sha256"], listed["bytes"]) == (checkpoint.sha256, checkpoint.bytes)
    assert listed["eval_loss"] is None
    assert "path" not in listed


def test_it_downloads_a_checkpoints_file(viewer_api, running, checkpoint):
    response = viewer_api.get(f"{checkpoints_of(running)}/{checkpoint.pk}/download")

    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == checkpoint.sha256
    assert response["Content-Disposition"] == (
        f'attachment; filename="run-{running.pk}-outer-step-3.safetensors"')
    assert response["ETag"] == f'"{checkpoint.sha256}"'


def test_a_checkpoint_of_another_run_is_a_404(viewer_api, draft, checkpoint):
    response = viewer_api.get(f"{checkpoints_of(draft)}/{checkpoint.pk}/download")

    assert response.status_code == 404
    assert response.json() == {"errors": {"checkpoint": [
        f"Run {draft.pk} has no checkpoint {checkpoint.pk}."]}}


def test_a_checkpoint_whose_file_is_gone_is_a_404(viewer_api, running, checkpoint):
    Path(checkpoint.path).unlink()

    response = viewer_api.get(f"{checkpoints_of(running)}/{checkpoint.pk}/download")

    assert response.status_code == 404
    assert "gone" in response.json()["errors"]["checkpoint"][0]


def test_it_samples_the_checkpoints_model(viewer_api, running, checkpoint):
    url = f"{checkpoints_of(running)}/{checkpoint.pk}/sample"

    first = viewer_api.post(url, {"prompt": "def main(", "tokens": 12, "seed": 3})
    again = viewer_api.post(url, {"prompt": "def main(", "tokens": 12, "seed": 3})

    assert first.status_code == 200
    text = first.json()["text"]
    assert isinstance(text, str) and 0 < len(text.encode("utf-8", "replace")) <= 12 * 3
    assert again.json() == first.json()


@pytest.mark.parametrize("body, key, start", [
    ({"prompt": ""}, "prompt", "prompt must be some text"),
    ({"prompt": "x" * 2001}, "prompt", "prompt must be at most 2000 characters"),
    ({"prompt": "x", "tokens": 0}, "tokens", "tokens must be between 1 and 500"),
    ({"prompt": "x", "tokens": 501}, "tokens", "tokens must be between 1 and 500"),
    ({"prompt": "x", "tokens": 1.5}, "tokens", "Input should be a valid integer"),
    ({"prompt": "x", "temperature": 0}, "temperature", "temperature must be above 0"),
    ({"tokens": 5}, "prompt", "This field is required."),
    ({"prompt": "x", "length": 5}, "length", "Unknown field; expected prompt, tokens, "),
])
def test_it_explains_a_bad_sample_request(viewer_api, running, checkpoint, body, key, start):
    response = viewer_api.post(f"{checkpoints_of(running)}/{checkpoint.pk}/sample", body)

    assert response.status_code == 422
    errors = response.json()["errors"]
    assert list(errors) == [key]
    assert errors[key][0].startswith(start)


def test_a_checkpoint_that_does_not_verify_cannot_be_sampled(viewer_api, running, checkpoint):
    Checkpoint.objects.filter(pk=checkpoint.pk).update(sha256="0" * 64)

    response = viewer_api.post(f"{checkpoints_of(running)}/{checkpoint.pk}/sample",
                               {"prompt": "x", "tokens": 1})

    assert response.status_code == 422
    assert response.json()["errors"]["checkpoint"][0].startswith(
        "The checkpoint could not be loaded")


def test_a_sample_while_the_sampler_is_busy_is_a_503_with_retry_after(viewer_api, running,
                                                                     checkpoint):
    url = f"{checkpoints_of(running)}/{checkpoint.pk}/sample"
    with contextlib.ExitStack() as under_way:
        for _ in range(MAX_CONCURRENT_SAMPLES):
            under_way.enter_context(SAMPLER.slot())
        response = viewer_api.post(url, {"prompt": "x", "tokens": 1})

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["errors"]["checkpoint"][0].startswith("The sampler is busy")
    assert viewer_api.post(url, {"prompt": "x", "tokens": 1}).status_code == 200


def test_a_checkpoint_of_an_hf_run_downloads_as_a_folder_transformers_loads(
        viewer_api, operator, tmp_path, text_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = {"source": "hf", "hf_config": json.dumps(TINY_LLAMA), "block_size": 16}
    run = create_run(name="llama", mode="decoupled", user=operator, config={
        "model": model, "data": {"path": text_path}, "eval": {"tokens": 256},
        "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-east"}]})
    config = run.run_config()
    params = initial_model(config).state_dict()
    evaluator = Evaluator(config, load_corpus(text_path, config.data.eval_fraction, data_dir()),
                          "validation")
    path = tmp_path / "checkpoint.safetensors"
    sha256, size = save(path, params, {}, [3, 4], 1024)
    checkpoint = Checkpoint.objects.create(run=run, versions={"0": 3, "1": 4}, outer_step=3,
                                           path=str(path), sha256=sha256, bytes=size,
                                           eval_loss=evaluator(params))

    response = viewer_api.get(f"{checkpoints_of(run)}/{checkpoint.pk}/download/hf")

    assert response.status_code == 200
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(tmp_path / "folder")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "folder", local_files_only=True)
    losses = [loaded(input_ids=torch.cat([x, y[:, -1:]], 1),
                     labels=torch.cat([x, y[:, -1:]], 1)).loss.item()
              for x, y in evaluator.batches]
    assert sum(losses) / len(losses) == pytest.approx(checkpoint.eval_loss, abs=1e-4)
    assert '"hf_config"' in (tmp_path / "folder" / "README.md").read_text()
    # A bytes run's tokenizer: each byte its value, as the run's splits hold them.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "folder", local_files_only=True)
    assert tokenizer("é\n x")["input_ids"] == list("é\n x".encode())


def test_a_builtin_checkpoint_is_no_transformers_folder(viewer_api, running, checkpoint):
    response = viewer_api.get(f"{checkpoints_of(running)}/{checkpoint.pk}/download/hf")

    assert response.status_code == 422
    assert "model.source hf" in response.json()["errors"]["checkpoint"][0]
