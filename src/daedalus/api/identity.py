"""/whoami: the person the bearer token belongs to (the CLI checks `--as` against it before acting)."""

from __future__ import annotations

from fastapi import APIRouter

from daedalus.api.context import Caller
from daedalus.api.models import Identity

router = APIRouter(tags=["identity"])


@router.get("/whoami", response_model=Identity)
async def whoami(caller: Caller) -> Identity:
    """Who the API takes you for."""
    return Identity(person=caller)
