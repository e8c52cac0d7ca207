"""Checkpoints: list them, download one, and sample its model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.http import FileResponse, HttpRequest, HttpResponse
from ninja import Router

from webapp.api import schemas
from webapp.api.access import ApiError, allow, get_checkpoint, get_run
from webapp.api.schemas import answers
from webapp.runs.export import hf_folder_zip
from webapp.runs.models import Checkpoint
from webapp.runs.sampling import SamplerBusy, sample

router = Router(tags=["checkpoints"])
SAMPLE_ARGUMENTS = ("prompt", "tokens", "temperature", "seed")
# Seconds a refused sample is told to wait: about one sample of MAX_SAMPLE_TOKENS.
SAMPLE_RETRY_AFTER_S = 5


def _checkpoint_out(checkpoint: Checkpoint) -> dict[str, Any]:
    return {"id": checkpoint.pk, "outer_step": checkpoint.outer_step,
            "versions": checkpoint.versions, "sha256": checkpoint.sha256,
            "bytes": checkpoint.bytes, "eval_loss": checkpoint.eval_loss,
            "created_at": checkpoint.created_at}


@router.get("/{run_id}/checkpoints", auth=allow("view"),
            response=answers(schemas.CheckpointList, 404))
def list_checkpoints(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The run's checkpoints, oldest first; `id` is the <n> of the URLs below."""
    run = get_run(run_id)
    return {"checkpoints": [_checkpoint_out(c) for c in run.checkpoints.order_by("created_at",
                                                                                 "id")]}


@router.get("/{run_id}/checkpoints/{checkpoint_id}/download", auth=allow("view"),
            response=answers({200: None}, 404))
def download_checkpoint(request: HttpRequest, run_id: int, checkpoint_id: int) -> FileResponse:
    """The checkpoint's file (safetensors: the global parameters, the outer momentum and
    the versions); its sha256 is in the list and in the ETag."""
    checkpoint = get_checkpoint(get_run(run_id), checkpoint_id)
    path = Path(checkpoint.path)
    try:
        handle = path.open("rb")
    except OSError:
        raise ApiError(404, "checkpoint",
                       f"The file of checkpoint {checkpoint.pk} is gone ({path}).") from None
    response = FileResponse(handle, as_attachment=True,
                            filename=f"run-{run_id}-outer-step-{checkpoint.outer_step}"
                                     ".safetensors",
                            content_type="application/octet-stream")
    response["ETag"] = f'"{checkpoint.sha256}"'
    return response


@router.get("/{run_id}/checkpoints/{checkpoint_id}/download/hf", auth=allow("view"),
            response=answers({200: None}, 404, 422))
def download_hf_folder(request: HttpRequest, run_id: int, checkpoint_id: int) -> HttpResponse:
    """A run of model.source hf: the checkpoint's global model as a zipped folder that
    `transformers` loads unchanged (config.json, model.safetensors, README.md with the
    run's config)."""
    checkpoint = get_checkpoint(get_run(run_id), checkpoint_id)
    try:
        body = hf_folder_zip(checkpoint)
    except ValueError as e:
        raise ApiError(422, "checkpoint", str(e)) from None
    response = HttpResponse(body, content_type="application/zip")
    name = f"run-{run_id}-outer-step-{checkpoint.outer_step}-hf.zip"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@router.post("/{run_id}/checkpoints/{checkpoint_id}/sample", auth=allow("view"),
             response=answers(schemas.SampleOut, 404, 503, body=True))
def sample_checkpoint(request: HttpRequest, run_id: int, checkpoint_id: int,
                      body: schemas.SampleIn) -> dict[str, Any]:
    """The text the checkpoint's model writes after `prompt` (the continuation only).
    The web app keeps the models it sampled last and runs a few samples at a time;
    one more is a 503 with Retry-After."""
    checkpoint = get_checkpoint(get_run(run_id), checkpoint_id)
    try:
        text = sample(checkpoint, body.prompt, body.tokens, body.temperature, body.seed)
    except SamplerBusy as e:
        raise ApiError(503, "checkpoint", str(e),
                       {"Retry-After": str(SAMPLE_RETRY_AFTER_S)}) from None
    except ValueError as e:
        message = str(e)
        key = next((a for a in SAMPLE_ARGUMENTS if message.startswith(a)), "checkpoint")
        raise ApiError(422, key, message) from None
    return {"text": text}
