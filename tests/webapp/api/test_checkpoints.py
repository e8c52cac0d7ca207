"""Checkpoints through the API (webapp/api/checkpoints.py): the list, the download and
a sample of the model."""

import contextlib
import hashlib
from pathlib import Path

import pytest

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
