"""`daedalus token create|list|revoke`: API bearer tokens, kept hashed in the store.

Whoever can write the store (DAEDALUS_DATABASE_URL) administers tokens; a token is printed once, at creation.
"""

from __future__ import annotations

import getpass
from collections.abc import Collection
from typing import Annotated

import typer
from rich.table import Table

from daedalus.cli._common import console, fail, parse_duration, policy, store
from daedalus.errors import TokenError
from daedalus.escaping import for_terminal as shown
from daedalus.store import tokens

app = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)


@app.command()
def create(
    person: Annotated[str, typer.Option(help="the Daedalus person the token acts as")],
    expires_in: Annotated[
        str | None, typer.Option(help="a duration like 90d or 12h; none = until revoked")
    ] = None,
) -> None:
    """Issue a token for PERSON and print it once; only its salted hash is stored. Under a policy
    (DAEDALUS_POLICY_FILE), only for a person it names: anyone else's token could do nothing but be refused."""
    known = policy()
    if known is not None and person.lower() not in known.people:
        fail(
            f"{person} is not in the server's policy ({known_people(known.people)}), so a token for them would be "
            f"refused at every action; add {person} to policy.yaml's people first, or check the spelling"
        )
    lifetime = None
    if expires_in is not None:
        lifetime = parse_duration(expires_in)
        if lifetime is None:
            fail(f"--expires-in {expires_in!r} is not a duration like 30m, 12h or 90d")
    try:
        issued = tokens.issue(store(), person, created_by=getpass.getuser(), expires_in=lifetime)
    except TokenError as error:
        fail(str(error))
    row = issued.row
    until = f"until {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else "until revoked"
    console.print(
        f"API token {row.token_id} for {shown(row.person)} ({until}); shown only now, keep it secret:"
    )
    console.print(issued.token, markup=False, highlight=False, soft_wrap=True)  # one line, never wrapped
    console.print(
        f"{shown(row.person)} sets DAEDALUS_API_URL=<the API> and DAEDALUS_API_TOKEN=<this token>; "
        f"`daedalus token revoke {row.token_id}` withdraws it"
    )


def known_people(people: Collection[str]) -> str:
    names = sorted(people)
    return "people: " + ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")


@app.command("list")
def list_(person: Annotated[str | None, typer.Option(help="only this person's tokens")] = None) -> None:
    """Every token's id, person and dates (never the token: the store does not have it)."""
    table = Table("id", "person", "created", "by", "expires", "revoked")
    for row in tokens.listed(store(), person):
        table.add_row(
            row.token_id,
            shown(row.person),
            f"{row.created_at:%Y-%m-%d %H:%M}",
            shown(row.created_by),
            f"{row.expires_at:%Y-%m-%d %H:%M}" if row.expires_at else "-",
            f"{row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "-",
        )
    console.print(table)


@app.command()
def revoke(token_id: Annotated[str, typer.Argument(help="the id `daedalus token list` shows")]) -> None:
    """Withdraw a token at once: the API answers 401 to it from the next request on."""
    try:
        row = tokens.revoke(store(), token_id)
    except TokenError as error:
        fail(str(error))
    console.print(
        f"API token {row.token_id} of {shown(row.person)} revoked at {row.revoked_at:%Y-%m-%d %H:%M:%S} UTC"
    )
