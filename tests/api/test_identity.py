"""Who the API takes a caller for: a token from the store, checked on every request; 401 for anything else."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from daedalus.store import tokens
from tests.api.conftest import TOKENS, as_


async def test_a_valid_token_names_its_person_and_nothing_else_gets_in(
    api: httpx.AsyncClient, sqlite_engine: Engine
) -> None:
    whoami = await api.get("/whoami", headers=as_("wayne"))
    assert whoami.status_code == 200 and whoami.json() == {"person": "wayne"}
    assert (await api.get("/whoami", headers=as_("mallory"))).json() == {"person": "mallory"}

    [wayne] = [t for t, p in TOKENS.items() if p == "wayne"]
    [mallory] = [t for t, p in TOKENS.items() if p == "mallory"]
    forged = wayne[: len("dtk_00000001_")] + mallory.split("_", 2)[2]  # wayne's id, mallory's secret
    for bad in (forged, "wayne", wayne + "x", wayne.upper(), ""):
        for path in ("/whoami", "/tickets", "/audit"):
            answer = await api.get(path, headers={"Authorization": f"Bearer {bad}"})
            assert answer.status_code == 401, (bad, path, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
    answer = await api.get("/tickets")
    assert answer.status_code == 401 and "daedalus token create" in answer.json()["detail"]
    answer = await api.get("/tickets", headers={"Authorization": f"Bearer {forged}"})
    assert "unknown bearer token" in answer.json()["detail"]


async def test_a_revoked_token_is_refused_from_the_next_request_on(
    api: httpx.AsyncClient, sqlite_engine: Engine
) -> None:
    issued = tokens.issue(sqlite_engine, "wayne", created_by="admin")
    bearer = {"Authorization": f"Bearer {issued.token}"}
    assert (await api.get("/tickets", headers=bearer)).status_code == 200
    tokens.revoke(sqlite_engine, issued.row.token_id)
    refused = await api.get("/tickets", headers=bearer)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    refused = await api.post(
        "/decisions", headers=bearer, json={"request_id": "x", "option": "approve", "decided_by": "wayne"}
    )
    assert refused.status_code == 401
    assert (
        await api.get("/tickets", headers=as_("wayne"))
    ).status_code == 200  # wayne's other token still works
