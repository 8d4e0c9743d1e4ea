"""The chaos bench's checks, made from the store, Temporal's results and the processes' own logs once the run
settled: audit sequences per trail, duplicate agent/trainer starts, orphan processes, answers applied once."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import psutil
from sqlalchemy import Engine
from sqlmodel import col, select

from chaos_decider import Sent
from daedalus.processes import STEP_TOKEN_ENV
from daedalus.schemas.ticket import TicketState
from daedalus.store.database import session_scope
from daedalus.store.tables import AuditEventRow, DecisionRow


def audit_sequences(
    engine: Engine, subjects: list[str], final_seq: dict[str, int]
) -> tuple[int, int, list[str]]:
    """(gaps, duplicates, what) over every trail of `subjects`: one trail per (subject, first run id)."""
    with session_scope(engine) as session:
        rows = session.exec(select(AuditEventRow).where(col(AuditEventRow.ticket_id).in_(subjects))).all()
    trails: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        trails.setdefault((row.ticket_id, row.run_id), []).append(row.seq)
    gaps = duplicates = 0
    what: list[str] = []
    for (subject, run_id), seqs in trails.items():
        counts = Counter(seqs)
        top = max(max(seqs), final_seq.get(subject, 0))
        missing = [n for n in range(1, top + 1) if n not in counts]
        doubled = [n for n, c in counts.items() if c > 1]
        gaps += len(missing)
        duplicates += sum(counts[n] - 1 for n in doubled)
        if missing or doubled:
            what.append(f"{subject} ({run_id[:8]}): missing {missing}, doubled {doubled}")
    for subject in subjects:
        if not any(s == subject for s, _ in trails):
            gaps += final_seq.get(subject, 0)
            what.append(f"{subject}: no events in the store")
    return gaps, duplicates, what


def start_log(starts: Path, name: str) -> list[str]:
    path = starts / name
    return path.read_text().split() if path.exists() else []


def duplicate_starts(starts: Path) -> tuple[int, list[str]]:
    """Agents started twice for one attempt (worktree path) and trainers twice for one incarnation."""
    found: list[str] = []
    count = 0
    for log in ("agent-starts.log", "trainer-starts.log"):
        lines = start_log(starts, log)
        for key, n in Counter(lines).items():
            if n > 1:
                count += n - 1
                found.append(f"{Path(key).parent.name}/{Path(key).name} started {n} times")
    return count, found


def orphans(tmp: Path) -> list[str]:
    """Processes of this run still alive carrying a step token, or a trainer keeper of this run."""
    home = f"DAEDALUS_HOME={tmp / 'home'}".encode()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            with open(f"/proc/{proc.pid}/environ", "rb") as handle:
                environ = b"\0" + handle.read()
            stepped = f"\0{STEP_TOKEN_ENV}=".encode() in environ
            keeper = b"\0DAEDALUS_TRAINING_INCARNATION=" in environ
            ours = home in environ or str(proc.cwd()).startswith(str(tmp))
        except (OSError, psutil.Error):
            continue
        if (stepped or keeper) and ours:
            found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:120]}")
    return found


def decisions_applied(
    engine: Engine, sent_answers: Iterable[Sent], states: dict[str, TicketState]
) -> tuple[int, list[str]]:
    """Answers applied exactly once, seen in the store's events and rows and in Temporal's own state."""
    with session_scope(engine) as session:
        decided = session.exec(select(AuditEventRow).where(AuditEventRow.kind == "decided")).all()
        rows = {r.request_id: r for r in session.exec(select(DecisionRow)).all()}
    events_per_request = Counter(e.detail.get("request") for e in decided)
    in_temporal: Counter[str] = Counter()
    for state in states.values():
        in_temporal.update(d.note for d in state.decisions)
    applied, problems = 0, []
    for sent in sent_answers:
        note = sent.note
        row = rows.get(sent.request_id)
        events = events_per_request[sent.request_id]
        # A training run's status does not list its answers: for its requests, the store is the witness.
        seen = 1 if sent.request_id.startswith("training-") else in_temporal[note]
        if events == 1 and row is not None and row.note == note and seen == 1:
            applied += 1
        else:
            problems.append(
                f"{sent.request_id} ({sent.option}, {sent.decision_id}): {events} decided events, "
                f"row note {row.note if row else None!r}, {seen}x in Temporal, posts {sent.statuses}"
            )
    return applied, problems


def audit_verify(env: dict[str, str]) -> bool:
    """`daedalus audit verify`: every trail's hash chain recomputed."""
    daedalus = str(Path(sys.executable).parent / "daedalus")
    done = subprocess.run([daedalus, "audit", "verify"], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:])
    return done.returncode == 0
