"""Every example a user may copy is valid: tickets, engine presets, training runs."""

from pathlib import Path

import pytest
import yaml

from daedalus.decisions.policy import load_policy, resolve_ticket, resolve_training
from daedalus.engines.presets import load_preset
from daedalus.errors import TicketError
from daedalus.hosts.registry import load_registry
from daedalus.schemas.engines import VllmPreset
from daedalus.schemas.training import TrainingRunSpec
from daedalus.services import load_run_spec, load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted((EXAMPLES / "tickets").glob("*.yaml")), ids=lambda p: p.name)
def test_ticket_examples_validate(path: Path) -> None:
    spec = load_spec(path)
    assert spec.gates or spec.children


def test_seed_ticket_six_has_its_sub_tickets_in_order() -> None:
    spec = load_spec(EXAMPLES / "tickets" / "6-tp4-mtp.yaml")
    assert [child.id for child in spec.with_parent()] == ["6b", "6c", "6d", "6e", "6f"]
    assert all(child.parent == "6" for child in spec.with_parent())


def _command_options(command: str) -> dict[str, str]:
    words = command.split()
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


def test_seed_tickets_carry_the_seeds_figures() -> None:
    """Thresholds, rounds, tokens, users and probes as the seed gives them (digest.en.md)."""
    four = {g.name: g for g in load_spec(EXAMPLES / "tickets" / "4-mtp-align-tax.yaml").gates}
    assert four["single-user-mtp2"].threshold == 55 and four["regression-tests"].threshold == 27
    assert _command_options(four["batch8-mtp2-vs-ar"].command)["--users"] == "8"
    six = load_spec(EXAMPLES / "tickets" / "6-tp4-mtp.yaml")
    parent = {g.name: g for g in six.gates}
    assert parent["tp4-single-user-ar"].threshold == 65 and parent["tp4-single-user-mtp3"].threshold == 75
    children = {child.id: child for child in six.with_parent()}
    [identity] = children["6d"].gates
    assert _command_options(identity.command)["--probes"] == "60" and identity.threshold == 1.0
    [ab] = children["6f"].gates
    options = _command_options(ab.command)
    assert (options["--rounds"], options["--max-tokens"], options["--users"]) == ("3", "900", "8")
    mtp1 = load_preset(options["--preset"])
    assert isinstance(mtp1, VllmPreset) and mtp1.speculative is not None
    assert mtp1.speculative.num_speculative_tokens == 1
    # 3 rounds give a distribution-free interval only up to 75%: the gate says so rather than overclaim.
    assert ab.confidence == 0.75
    sixe = {g.name: g for g in children["6e"].gates}
    assert (
        sixe["single-user-mtp3"].threshold == 75
        and sixe["mtp3-acceptance-length"].metric.value == "acceptance_length"
    )


@pytest.mark.parametrize("path", sorted((EXAMPLES / "tickets").glob("[0-9]*.yaml")), ids=lambda p: p.name)
def test_every_measure_command_names_known_presets_and_metrics(path: Path) -> None:
    """A seed ticket's `daedalus engine measure` gate names a metric it can produce and presets that exist
    (the local demo ticket's preset lives in its engine's worktree)."""
    from daedalus.engines.measure import check_metric
    from daedalus.schemas.gates import Metric

    spec = load_spec(path)
    gates = list(spec.gates) + [g for child in spec.with_parent() for g in child.gates]
    for gate in gates:
        if "engine measure" not in gate.command:
            continue
        words = gate.command.split()
        metric = Metric(words[words.index("measure") + 1])
        assert metric is gate.metric
        options = _command_options(gate.command)
        check_metric(metric, baseline="--baseline-preset" in options)
        for flag in ("--preset", "--baseline-preset"):
            if flag in options:
                load_preset(options[flag])


@pytest.mark.parametrize("path", sorted((EXAMPLES / "presets").glob("*.yaml")), ids=lambda p: p.name)
def test_preset_examples_validate(path: Path) -> None:
    assert load_preset(path).name == path.stem


@pytest.mark.parametrize("path", sorted((EXAMPLES / "training").glob("*.yaml")), ids=lambda p: p.name)
def test_training_examples_validate(path: Path) -> None:
    TrainingRunSpec.model_validate(yaml.safe_load(path.read_text()))


def test_the_example_policy_lets_every_example_be_filed_and_approved_by_someone_else() -> None:
    """The lead files the example tickets and starts the example runs: each waits for a dispatch that someone
    other than its filer may approve (wayne; never the lead, who may otherwise approve dispatches for wayne)."""
    policy = load_policy(EXAMPLES / "policy.yaml", load_registry(EXAMPLES / "hosts.yaml"))
    for path in sorted((EXAMPLES / "tickets").glob("*.yaml")):
        spec, rule = resolve_ticket(policy, load_spec(path), "lead")
        assert rule.required and rule.excluded == ["lead"] and spec.approval.deciders == ["wayne"], path.name
    registry = load_registry(EXAMPLES / "hosts.yaml")
    started = []
    for path in sorted((EXAMPLES / "training").glob("*.yaml")):
        spec = load_run_spec(path, base=EXAMPLES.parent)  # as `daedalus train start` run in the checkout
        if spec.host not in registry.names:
            continue  # h200-leak: bench/gpu.py's, with its own host registry and policy
        run, rule = resolve_training(policy, spec, "lead")
        assert rule.required and rule.excluded == ["lead"] and run.approval.deciders == ["wayne"], path.name
        assert any("Daedalus deletes complete checkpoints" in line for line in rule.commands), rule.commands
        started.append(path.name)
    assert started == ["drafter-27b.yaml", "local-leak.yaml", "local-train8.yaml"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("id: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        (
            "id: '4'\ntitle: t\nhost: mavis\ncolour: blue\ngates: []\n",
            "colour: Extra inputs are not permitted",
        ),
        (
            "id: '4'\ntitle: t\nhost: mavis\ngates:\n  - {name: g, metric: tokens_per_joule, threshold: 1, command: x}\n",
            "gates.0.metric",
        ),
        ("id: 'bad id!'\ntitle: t\nhost: mavis\n", "id: String should match pattern"),
    ],
)
def test_bad_spec_files_are_refused_with_the_field_path(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "ticket.yaml"
    path.write_text(text)
    with pytest.raises(TicketError, match=words.replace("[", r"\[")):
        load_spec(path)


def test_the_demo_tickets_patch_applies_and_gives_presets_its_gates_can_launch(tmp_path: Path) -> None:
    """What `make demo` runs: the scripted agent's patch applies to the demo's serving-config repo, and every
    preset its gates name is valid after it (a broken patch or preset would only show minutes into the demo)."""
    import shutil
    import subprocess

    from daedalus.schemas.engines import LlamaCppPreset

    spec = load_spec(EXAMPLES / "tickets" / "local-4.yaml")
    assert spec.agent is not None and spec.agent.patch
    repo = tmp_path / "serving-config"
    shutil.copytree(EXAMPLES / "demo" / "serving-config", repo)
    (tmp_path / "spec.patch").write_text(spec.agent.patch)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "apply", "--check", str(tmp_path / "spec.patch")], cwd=repo, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "spec.patch")], cwd=repo, check=True)
    for gate in spec.gates:
        options = _command_options(gate.command)
        assert gate.kind.value == "ab" or gate.metric.value == "temp0_identity", gate.name
        candidate, baseline = (
            load_preset(repo / options[flag]) for flag in ("--preset", "--baseline-preset")
        )
        assert isinstance(candidate, LlamaCppPreset) and isinstance(baseline, LlamaCppPreset)
        assert candidate.draft is not None and baseline.draft is None, "speculative vs plain decoding"
