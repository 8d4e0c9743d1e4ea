"""The CLI against a shared stack: ticket commands go through its authenticated HTTP API with your token.

With DAEDALUS_API_URL set, `ticket create|list|show|amend|cancel|terminate`, `decide`, `delegate`, `audit`,
`question`, `rulings` and `train` are sent to that API (cli/clients.py's SharedStack) with DAEDALUS_API_TOKEN, and act as the token's person: `--as` may only repeat it. Without it,
the CLI talks to Temporal and the store directly and trusts the local user's `--as`: that is the embedded,
single-user stack of `daedalus up` and the demo, where whoever runs the CLI owns the whole stack anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daedalus.cli._common import fail, settings

if TYPE_CHECKING:  # httpx is imported only against a shared stack: the local one never sends a request
    import httpx

REQUEST_TIMEOUT_S = 60.0
"""Above the API's own wait on Temporal (DAEDALUS_API_UPDATE_TIMEOUT_S, twice for a decision)."""


class Remote:
    """A shared stack's API, called as the token's person; every refusal ends the command with its reason."""

    def __init__(self, url: str, token: str) -> None:
        import httpx

        self.url = url
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=REQUEST_TIMEOUT_S
        )

    def call(self, method: str, path: str, **request: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **request)
        except httpx.HTTPError as error:
            fail(f"cannot reach the Daedalus API at {self.url} ({error}); check DAEDALUS_API_URL")
        if response.status_code == 401:
            fail(f"the API at {self.url} refused your token (DAEDALUS_API_TOKEN): {_detail(response)}")
        if response.is_error:
            fail(_detail(response))
        try:
            return response.json()
        except ValueError:
            fail(
                f"the API at {self.url} answered {method} {path} with something that is not JSON "
                f"({response.text[:200]!r}); check that DAEDALUS_API_URL points at a Daedalus API"
            )

    def person(self) -> str:
        """Whom the API takes this token for."""
        person: str = self.call("GET", "/whoami")["person"]
        return person

    def acting_as(self, claimed: str | None) -> str:
        """The token's person; `--as` naming anyone else is refused before anything is sent."""
        person = self.person()
        if claimed is not None and claimed.lower() != person:
            fail(
                f"--as {claimed} does not match your API token, which belongs to {person}; against a shared "
                f"stack you act only as your token's person (drop --as, or use {claimed}'s own token)"
            )
        return person


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    return str(detail) if detail else f"HTTP {response.status_code}: {response.text[:500]}"


def local_person(who: str | None, flag: str = "--as") -> str:
    """The local stack trusts the local user's word for who acts, but wants it said."""
    if who is None:
        fail(
            f"say who acts with {flag} <person> (or set DAEDALUS_API_URL and DAEDALUS_API_TOKEN for a shared stack)"
        )
    return who


def shared_stack() -> Remote | None:
    """The shared stack's API when DAEDALUS_API_URL is set; None for the local, embedded stack."""
    api = settings().api
    if api.url is None:
        return None
    if api.token is None:
        fail(
            f"DAEDALUS_API_URL is {api.url} but DAEDALUS_API_TOKEN is not set; ask your Daedalus admin for a "
            f"token (`daedalus token create --person <you>`) and set it, or unset DAEDALUS_API_URL to use "
            f"a local stack"
        )
    return Remote(api.url, api.token.get_secret_value())
