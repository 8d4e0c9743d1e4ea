"""The CLI a decider lives in, as a person runs it (real processes, the session's dev server, a worker process, a
SQLite store, a policy): `ticket show` with everything a decision needs, `delegate` that does what it says or
refuses up front, `decide --lesson`, tokens only for people the policy knows, the report printed with --html,
and the decider's commands starting without the API server, the report's plotting or the engines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from daedalus.store.database import make_engine
from tests.cli.test_policy_cli import host, policy_env
from tests.cli.test_ticket_cli import daedalus, wait_for_output, write_spec
from tests.ticket_helpers import events, kinds

__all__ = ["host", "policy_env"]  # the fixtures this module uses

HEAVY = (
    "fastapi",
    "starlette",
    "matplotlib",
    "scipy",
    "numpy",
    "uvicorn",
    "daedalus.report",
    "daedalus.api.app",
)


def test_a_decider_reads_the_evidence_delegates_honestly_and_marks_a_lesson(
    policy_env: dict[str, str], host: str, tmp_path: Path
) -> None:
    ticket_id = f"d{host[-8:]}"
    spec = write_spec(tmp_path, host, ticket_id, approval={})
    filed = daedalus(policy_env, "ticket", "create", "-f", str(spec), "--as", "bob")
    assert filed.returncode == 0, filed.stderr
    shown = wait_for_output(policy_env, ["ticket", "show", ticket_id], "waiting for a decision")
    # What a dispatch will run, where, and what the request's evidence says: no need to ask the API.
    repo = tmp_path / "repo"
    assert (
        f"ticket {ticket_id} on {host}: scripted agent applies a 5-line patch in a private checkout of {repo}"
        in (shown)
    ), shown
    assert "gate decode (in a private checkout of" in shown and "emit_samples.py speed.txt" in shown
    assert "runs ticket" in shown  # the request's evidence, line by line
    assert "may decide: ['wayne']; may not: ['bob']" in shown, shown
    request = f"{ticket_id}-dispatch-1"

    # A run-time dispatch delegation would never be honoured under the policy: refused, nothing written.
    refused = daedalus(
        policy_env, "delegate", ticket_id, "--to", "olga", "--as", "wayne", "--kind", "dispatch"
    )
    assert refused.returncode == 2
    assert "a delegation made at run time never lets olga approve a dispatch" in refused.stderr, (
        refused.stderr
    )
    stranger = daedalus(policy_env, "delegate", ticket_id, "--to", "nobody", "--as", "wayne")
    assert stranger.returncode == 2 and "nobody is not in the server's policy" in stranger.stderr
    store = make_engine(f"sqlite:///{Path(policy_env['DAEDALUS_HOME']) / 'daedalus.db'}")
    try:
        assert "delegated" not in kinds(events(store, ticket_id))
        # The default is what a delegation can do: escalations.
        delegated = daedalus(policy_env, "delegate", ticket_id, "--to", "olga", "--as", "wayne")
        assert delegated.returncode == 0, delegated.stderr
        assert f"ticket {ticket_id}: escalation decisions may now also be made by olga" in delegated.stdout
        assert "delegated" in kinds(events(store, ticket_id))

        lonely = daedalus(policy_env, "decide", request, "approve", "--as", "wayne", "--lesson")
        assert lonely.returncode == 2 and "there is no note" in lonely.stderr
        approved = daedalus(
            policy_env, "decide", request, "approve", "--as", "wayne", "--note", "the toy engine reads speed.txt",
            "--lesson",
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        assert "the note is recorded as a lesson" in approved.stdout
        wait_for_output(policy_env, ["ticket", "show", ticket_id], "[passed]")
        lessons = daedalus(policy_env, "lessons", "list", "--engine", "toy")
        assert f"wayne on the dispatch of ticket {ticket_id}: the toy engine reads speed.txt" in " ".join(
            lessons.stdout.split()
        ), lessons.stdout
    finally:
        store.dispose()


def test_tokens_only_for_people_the_policy_knows(policy_env: dict[str, str]) -> None:
    refused = daedalus(policy_env, "token", "create", "--person", "mallory")
    assert refused.returncode == 2
    assert "mallory is not in the server's policy (people: bob, olga, wayne)" in refused.stderr, (
        refused.stderr
    )
    issued = daedalus(policy_env, "token", "create", "--person", "wayne")
    assert issued.returncode == 0 and "dtk_" in issued.stdout, issued.stderr


def test_report_with_html_still_prints_the_markdown(policy_env: dict[str, str], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    made = daedalus(policy_env, "report", "--since", "1h", "--html", str(page))
    assert made.returncode == 0, made.stderr
    assert page.read_text().startswith("<!doctype html>") or "<html" in page.read_text()
    assert f"HTML report written to {page}" in made.stdout
    assert "Tickets" in made.stdout and "Decisions" in made.stdout, made.stdout


def test_the_deciders_commands_load_nothing_they_do_not_use() -> None:
    """`decide`, `ticket`, `hosts` and `delegate` build their commands without FastAPI, the report's plotting
    libraries or the engines: each of those costs seconds of start-up on a busy machine."""
    for command in ("decide", "ticket", "hosts", "delegate"):
        probe = (
            "import sys\n"
            "from daedalus.cli import build\n"
            f"build({command!r})\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        )
        loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert loaded.stdout.strip() == "[]", (command, loaded.stdout, loaded.stderr)
