"""The prompt every coding agent gets: spec, constraints, allowed paths, lessons, and the last failure."""

from __future__ import annotations

from daedalus.schemas.agents import AgentTask

CLAIM_SUCCESS = "RESULT: success"
CLAIM_FAILURE = "RESULT: failure"
TRAP_PREFIX = "TRAP:"


def build_prompt(task: AgentTask) -> str:
    parts = [
        f"# Ticket {task.ticket_id}, attempt {task.attempt}" + (f": {task.title}" if task.title else ""),
        "You are working in a git worktree of the engine repository, on branch "
        f"`{task.branch}` (base commit {task.base_commit[:12]}). Work only inside this worktree.",
    ]
    if task.spec.strip():
        parts += ["## Spec", task.spec.strip()]
    if task.brief.strip() and task.brief.strip() != task.spec.strip():
        parts += [
            "## Brief from the lead (on a retry: why the previous attempt failed, with evidence)",
            task.brief.strip(),
        ]
    if task.constraints:
        parts += ["## Constraints", *[f"- {c}" for c in task.constraints]]
    allowed = ", ".join(task.allowed_paths)
    parts += ["## Allowed paths", f"Change only files under: {allowed}. Changes elsewhere void the attempt."]
    if task.lessons:
        parts += [
            f"## Lessons recorded for {task.engine or 'this engine'}",
            *[f"- {x}" for x in task.lessons],
        ]
    parts += [
        "## When you are done",
        "Commit your change on the current branch with `git add` and `git commit` (no push). "
        "Only a commit counts; your own verdict is recorded but does not decide. "
        f"If you tripped over something the next person on this engine should know, say it on its own line "
        f"starting with `{TRAP_PREFIX}`; it is recorded as a lesson. "
        f"End your final message with `{CLAIM_SUCCESS}` or `{CLAIM_FAILURE}`.",
    ]
    return "\n\n".join(parts) + "\n"


def claimed_success(final_text: str | None) -> bool | None:
    """The agent's own verdict, from the last line that states one."""
    if not final_text:
        return None
    for line in reversed(final_text.strip().splitlines()):
        if CLAIM_SUCCESS.lower() in line.lower():
            return True
        if CLAIM_FAILURE.lower() in line.lower():
            return False
    return None


def reported_traps(final_text: str | None) -> list[str]:
    """The traps an agent reported in its final message, one per `TRAP:` line (recorded as lessons)."""
    if not final_text:
        return []
    traps = []
    for line in final_text.splitlines():
        text = line.strip().lstrip("-* ")
        if text.upper().startswith(TRAP_PREFIX):
            trap = " ".join(text[len(TRAP_PREFIX) :].split())
            if trap and trap not in traps:
                traps.append(trap)
    return traps
