"""train8's two host steps on their own: the drafter evaluation's speculative decoding arithmetic, and the deployment's
commit in a real git repository (retried, refused, checked)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from daedalus.engines.serving_config import TRAILER, deploy
from daedalus.errors import GitError, PresetError
from daedalus.schemas.training import DeploymentInput, DeploymentPolicy
from daedalus.training.drafter_eval import decode, ngram_proposal, target_next

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "examples" / "training" / "serving-config" / "presets" / "drafter-lane.yaml"
VOCAB = 64


def exact(sequence: list[int], k: int = 4) -> list[int]:
    out, token = [], sequence[-1]
    for _ in range(k):
        token = target_next(token, VOCAB)
        out.append(token)
    return out


def test_seed_acceptance_length_is_tokens_per_target_step() -> None:
    prompt = [7]
    # A drafter that is always right: k drafts and the target's own token each step.
    assert decode(prompt, 60, VOCAB, exact) == (60, 12)
    # One that never is (or drafts nothing): one token a step.
    assert decode(prompt, 20, VOCAB, lambda seq: [(seq[-1] + 1) % VOCAB] * 4) == (20, 20)
    assert decode(prompt, 20, VOCAB, lambda seq: []) == (20, 20)
    # Right on its first two drafts only: three tokens a step.
    assert decode(prompt, 30, VOCAB, lambda seq: [*exact(seq, 2), -1, -1]) == (30, 10)


def test_seed_ngram_baseline_looks_up_the_latest_earlier_occurrence() -> None:
    sequence = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    assert ngram_proposal(sequence, 2, longest=3, shortest=1) == [8, 5]
    assert ngram_proposal([4, 5, 6], 3, longest=3, shortest=1) == []
    # The recurrence repeats after 64 tokens: past one period, prompt lookup drafts it exactly.
    cycle = [3]
    for _ in range(70):
        cycle.append(target_next(cycle[-1], VOCAB))
    assert ngram_proposal(cycle, 4, longest=3, shortest=1) == exact(cycle)


def repo_with_preset(tmp: Path) -> Path:
    repo = tmp / "serving-config"
    (repo / "presets").mkdir(parents=True)
    shutil.copy(PRESET, repo / "presets" / "drafter-lane.yaml")
    (repo / "other.txt").write_text("someone's\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "presets"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=ops", "-c", "user.email=ops@localhost", *args],
                       check=True, capture_output=True)  # fmt: skip
    return repo


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def deployment(repo: Path, **policy: object) -> DeploymentInput:
    return DeploymentInput(
        run="train8",
        policy=DeploymentPolicy.model_validate(
            {
                "repo": repo,
                "preset": "presets/drafter-lane.yaml",
                "value": "/ckpt/{run}/step-{step}",
                **policy,
            }
        ),
        checkpoint="/ckpt/ckpt-0000030",
        step=30,
        request_id="training-train8-deployment-1",
        decided_by="wayne",
        evaluation="ckpt-0000030 (step 30): PASS",
    )


def test_seed_a_deployment_commits_the_preset_once_and_only_the_preset(tmp_path: Path) -> None:
    repo = repo_with_preset(tmp_path)
    (repo / "other.txt").write_text("someone's work in progress\n")  # not ours to commit
    done = deploy(deployment(repo))
    assert done.value == "/ckpt/train8/step-30" and done.previous == "none-deployed-yet" and not done.already
    preset = yaml.safe_load((repo / "presets" / "drafter-lane.yaml").read_text())
    assert preset["speculative"]["model"] == "/ckpt/train8/step-30"
    assert (repo / "presets" / "drafter-lane.yaml").read_text().startswith("# The serving preset")
    assert git(repo, "rev-parse", "HEAD").strip() == done.commit
    assert git(repo, "show", "--name-only", "--format=", done.commit).split() == ["presets/drafter-lane.yaml"]
    assert f"{TRAILER}: training-train8-deployment-1" in git(repo, "log", "-1", "--format=%B")
    assert git(repo, "status", "--porcelain").split() == ["M", "other.txt"]
    # A retried step finds its commit instead of committing again.
    again = deploy(deployment(repo))
    assert again.already and again.commit == done.commit
    assert len(git(repo, "log", "--format=%H").split()) == 2


def test_seed_a_deployment_refuses_what_it_must_not_touch(tmp_path: Path) -> None:
    repo = repo_with_preset(tmp_path)
    with pytest.raises(GitError, match="has main checked out, not serving"):
        deploy(deployment(repo, branch="serving"))
    preset = repo / "presets" / "drafter-lane.yaml"
    preset.write_text(preset.read_text() + "# edited by hand\n")
    with pytest.raises(GitError, match="uncommitted changes"):
        deploy(deployment(repo))
    git(repo, "checkout", "--", "presets/drafter-lane.yaml")
    with pytest.raises(PresetError, match="num_speculative_tokens"):
        deploy(deployment(repo, key="speculative.num_speculative_tokens", value="many"))
    with pytest.raises(GitError, match="not a git working tree"):
        deploy(deployment(tmp_path / "nowhere"))
    assert len(git(repo, "log", "--format=%H").split()) == 1 and git(repo, "status", "--porcelain") == ""
