"""Switch a serving preset to an approved checkpoint: one field of a preset file in a serving-config repository,
changed by a commit the host makes.

The commit carries the trailer `Daedalus-Deployment: <decision request id>`: a retried step finds its own commit
and returns it instead of committing again. It commits the preset file only (`git commit -- <file>`), so
whatever else someone has staged or changed in that working tree is neither committed nor touched, and it
refuses a preset file with uncommitted changes of its own, a branch other than the one the run names, and a
result the preset schema refuses.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from daedalus.engines.presets import parse_preset
from daedalus.errors import GitError, PresetError
from daedalus.schemas.training import DeploymentInput, DeploymentResult

TRAILER = "Daedalus-Deployment"
IDENTITY = ("-c", "user.name=daedalus", "-c", "user.email=daedalus@localhost")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise GitError(
            f"git {' '.join(args[:2])} in {repo} failed: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout.strip()


def set_dotted(data: dict[str, Any], key: str, value: str) -> str | None:
    """Set `a.b.c` in nested mappings (made where missing); the value it had, if any."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise PresetError(f"cannot set {key}: {part} is a {type(child).__name__}, not a mapping")
        node = child
    previous = node.get(last)
    node[last] = value
    return None if previous is None else str(previous)


def _header(text: str) -> str:
    """The comment lines the file starts with: kept above the rewritten fields."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def deploy(inp: DeploymentInput) -> DeploymentResult:
    """Commit the preset's change on the host (or find the commit an earlier try made)."""
    policy = inp.policy
    repo = policy.repo.expanduser()
    value = policy.filled(checkpoint=inp.checkpoint, step=inp.step, run=inp.run)
    if not (repo / ".git").exists():
        raise GitError(f"the serving-config repository {repo} is not a git working tree")
    trailer = f"{TRAILER}: {inp.request_id}"
    found = _git(repo, "log", "--format=%H", "-n", "1", "--fixed-strings", f"--grep={trailer}", "HEAD")
    if found:
        return DeploymentResult(commit=found, file=policy.preset, key=policy.key, value=value, already=True)
    if policy.branch is not None:
        current = _git(repo, "rev-parse", "--abbrev-ref", "HEAD")
        if current != policy.branch:
            raise GitError(
                f"{repo} has {current} checked out, not {policy.branch}: the deployment commits on {policy.branch}"
            )
    path = repo / policy.preset
    if _git(repo, "status", "--porcelain", "--", policy.preset):
        raise GitError(f"{policy.preset} in {repo} has uncommitted changes: commit or discard them first")
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except OSError as error:
        raise PresetError(f"cannot read the preset {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise PresetError(f"the preset {path} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise PresetError(f"the preset {path} is not a mapping of fields")
    previous = set_dotted(data, policy.key, value)
    parse_preset(data, str(path))  # the changed preset must still be one an engine accepts
    path.write_text(_header(text) + yaml.safe_dump(data, sort_keys=False))
    message = (
        f"deploy {Path(inp.checkpoint).name} of training run {inp.run} to {policy.preset}\n\n"
        f"{policy.key}: {previous!r} -> {value!r}\n"
        f"evaluation: {inp.evaluation}\n"
        f"approved by {inp.decided_by} ({inp.request_id})\n\n"
        f"{trailer}\n"
    )
    _git(repo, "add", "--", policy.preset)
    _git(repo, *IDENTITY, "commit", "--quiet", "-m", message, "--", policy.preset)
    commit = _git(repo, "rev-parse", "HEAD")
    return DeploymentResult(commit=commit, file=policy.preset, key=policy.key, value=value, previous=previous)
