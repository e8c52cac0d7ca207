"""API tokens: make one for yourself (shown once), list yours, revoke one."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from webapp.api import schemas
from webapp.api.access import ApiError, allow
from webapp.api.schemas import answers
from webapp.runs.api_token import ApiToken

router = Router(tags=["tokens"])


def _token_out(row: ApiToken) -> dict[str, Any]:
    return {"id": row.pk, "name": row.name, "hint": row.hint, "created_at": row.created_at,
            "last_used_at": row.last_used_at}


@router.get("", auth=allow("view"), response=answers(schemas.TokenList))
def list_tokens(request: HttpRequest) -> dict[str, Any]:
    """Your tokens, newest first, each with its first characters (never the token)."""
    return {"tokens": [_token_out(row) for row in request.auth.api_tokens.all()]}


@router.post("", auth=allow("view"), response=answers({201: schemas.NewToken}, body=True))
def create_token(request: HttpRequest, body: schemas.TokenIn) -> Status:
    """Make a token that acts as you; the answer is the only time it is shown."""
    row, token = ApiToken.issue(request.auth, body.name.strip())
    return Status(201, {**_token_out(row), "token": token})


@router.delete("/{token_id}", auth=allow("view"), response=answers({204: None}, 404))
def revoke_token(request: HttpRequest, token_id: int) -> Status:
    """Revoke one of your tokens; it stops working at once."""
    deleted, _ = request.auth.api_tokens.filter(pk=token_id).delete()
    if not deleted:
        raise ApiError(404, "token", f"You have no token with id {token_id}.")
    return Status(204, None)
