"""The server's policy file: loading it (clear errors for a bad one), and resolving a filing against it (a spec
may tighten its approval, never loosen it). The workflows that follow the resolved rule are tested on the dev
server in tests/workflows/test_policy_dispatch.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from daedalus.decisions.authority import refusal
from daedalus.decisions.policy import Policy, Role, load_policy, resolve_ticket, resolve_training
from daedalus.decisions.schemas import Decision, DecisionKind, DecisionRequest, DispatchOption
from daedalus.errors import NotAllowed, PolicyFileError
from daedalus.hosts.registry import load_registry
from daedalus.schemas.ticket import TicketSpec
from daedalus.schemas.training import TrainingRunSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

POLICY: dict[str, Any] = {
    "people": {
        "wayne": {"roles": ["decider", "filer"]},
        "lead": {"roles": ["lead"]},
        "alice": {"roles": ["filer", "operator"]},
        "bob": {"roles": ["filer"]},
        "mallory": {"roles": ["filer"]},
        "viewer": {"roles": ["decider"]},
    },
    "hosts": {
        "local": {"operators": ["alice"], "training_dirs": ["/srv/training"]},
        "mavis": {"operators": []},
    },
    "delegations": [{"granted_by": "wayne", "delegate": "lead", "kind": "dispatch"}],
}


def policy(**changes: Any) -> Policy:
    return Policy.model_validate({**POLICY, **changes})


def gate_only(**changes: Any) -> TicketSpec:
    return TicketSpec.model_validate(
        {
            "id": "g1",
            "title": "measure",
            "host": "local",
            "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 1, "command": "nproc"}],
            **changes,
        }
    )


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_demo_policy_loads_against_the_demo_hosts() -> None:
    loaded = load_policy(EXAMPLES / "policy.yaml", load_registry(EXAMPLES / "hosts.yaml"))
    assert loaded.with_role(Role.DECIDER) == ["wayne"]
    assert loaded.delegates_of(["wayne"], DecisionKind.DISPATCH) == ["lead"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"delegations": [{"granted_by": "wayne", "delegate": "nobody"}]},
            "delegations[0].delegate names unknown person 'nobody'",
        ),
        (
            {"delegations": [{"granted_by": "bob", "delegate": "lead"}]},
            "delegations[0]: bob is not a decider",
        ),
        (
            {"hosts": {"local": {"operators": ["bob"]}}},
            "hosts.local.operators names bob, who lacks the `operator`",
        ),
        (
            {"hosts": {"local": {"operators": ["ghost"]}}},
            "hosts.local.operators names unknown person 'ghost'",
        ),
        ({"people": {"bob": {"roles": ["filer"]}}}, "nobody has the `decider` role"),
        ({"people": {"Bob Smith": {"roles": ["decider"]}}}, "are not valid names"),
        ({"people": {"bob": {"roles": ["king"]}}}, "people.bob.roles.0"),
    ],
)
def test_a_bad_policy_names_what_is_wrong(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyFileError) as caught:
        load_policy(write(tmp_path, {**POLICY, **changes}))
    assert message in str(caught.value)


def test_a_policy_naming_a_host_the_registry_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match=r"does not declare: \['nowhere'\]"):
        load_policy(
            write(tmp_path, {**POLICY, "hosts": {"nowhere": {}}}), load_registry(EXAMPLES / "hosts.yaml")
        )
    with pytest.raises(PolicyFileError, match="DAEDALUS_POLICY_FILE"):
        load_policy(tmp_path / "missing.yaml")


def test_a_gate_only_ticket_waits_for_someone_else_unless_its_filer_operates_the_host() -> None:
    spec, rule = resolve_ticket(policy(), gate_only(), "bob")
    assert rule.required and rule.excluded == ["bob"]
    assert rule.commands == [
        "ticket g1 on local: gate decode (in an empty directory of the attempt; no network, no secrets, no GPU but those leased to it): nproc"
    ]
    # Deciders the spec did not choose come from the policy, with their standing delegates.
    assert spec.approval.deciders == ["viewer", "wayne"]
    assert spec.approval.delegates == {"dispatch": ["lead"]}
    _, operated = resolve_ticket(policy(), gate_only(), "alice")
    assert not operated.required and operated.excluded == []
    _, elsewhere = resolve_ticket(policy(), gate_only(host="mavis"), "alice")
    assert elsewhere.required and elsewhere.excluded == ["alice"]


@pytest.mark.parametrize(
    ("approval", "filer", "message"),
    [
        (
            {"dispatch_requires_approval": False},
            "bob",
            "approval.dispatch_requires_approval: false would let bob run commands on local without a "
            "dispatch decision",
        ),
        ({"deciders": ["mallory"]}, "mallory", "approval.deciders names ['mallory'], who are not deciders"),
        (
            {"delegates": {"dispatch": ["mallory"]}},
            "mallory",
            "approval.delegates.dispatch names ['mallory'], to whom no decider of this spec delegated",
        ),
        ({"deciders": ["viewer"], "delegates": {"dispatch": ["lead"]}}, "bob", "no decider of this spec"),
    ],
)
def test_a_spec_cannot_loosen_its_approval(approval: dict[str, Any], filer: str, message: str) -> None:
    with pytest.raises(NotAllowed) as caught:
        resolve_ticket(policy(), gate_only(approval=approval), filer)
    assert message in str(caught.value)


def test_a_spec_may_tighten_its_approval() -> None:
    # An operator may still ask for a dispatch decision, and choose deciders among the policy's.
    agent = {"name": "scripted", "patch": "x"}
    engine = {"name": "e", "kind": "repo", "repo": "/tmp/r"}
    spec, rule = resolve_ticket(
        policy(), gate_only(agent=agent, engine=engine, approval={"deciders": ["wayne"]}), "alice"
    )
    assert rule.required and spec.approval.deciders == ["wayne"]
    assert rule.commands[0] == (
        "ticket g1 on local: scripted agent applies a 1-line patch in a private checkout of /tmp/r at HEAD, "
        "no network"
    )
    assert rule.commands[1].startswith(
        "ticket g1 on local: gate decode (in a private checkout of /tmp/r at HEAD; no network, no secrets, no GPU but "
        "those leased to it): "
    )


def test_only_filers_may_file_and_someone_other_than_the_filer_must_be_able_to_approve() -> None:
    with pytest.raises(NotAllowed, match="viewer may not file tickets: viewer has no `filer` or `lead` role"):
        resolve_ticket(policy(), gate_only(), "viewer")
    with pytest.raises(NotAllowed, match="stranger is not in the policy"):
        resolve_ticket(policy(), gate_only(), "stranger")
    alone = policy(delegations=[])
    with pytest.raises(
        NotAllowed,
        match=r"nobody but its filer wayne \(or someone acting for wayne\) could approve its dispatch",
    ):
        resolve_ticket(alone, gate_only(approval={"deciders": ["wayne"]}), "wayne")


def test_a_training_run_on_a_host_its_starter_does_not_operate_waits_for_a_dispatch() -> None:
    fields = {
        "name": "drafter",
        "host": "local",
        "command": ["python", "train.py"],
        "checkpoints": {"directory": "/srv/training/drafter"},
    }
    run = TrainingRunSpec.model_validate(fields)
    _, rule = resolve_training(policy(), run, "bob")
    assert rule.required and rule.excluded == ["bob"] and "python train.py" in rule.commands[0]
    _, operated = resolve_training(policy(), run, "alice")
    assert not operated.required
    loose = TrainingRunSpec.model_validate({**fields, "approval": {"deciders": ["bob"]}})
    with pytest.raises(NotAllowed, match=r"training run drafter: approval.deciders names \['bob'\]"):
        resolve_training(policy(), loose, "bob")


def test_a_training_run_writes_and_prunes_only_where_its_host_lets_it() -> None:
    """The attack: a run whose checkpoints are someone else's directory, with a marker every directory has;
    after approval the pruning would delete all its subdirectories but the newest."""
    fields: dict[str, Any] = {"name": "drafter", "host": "local", "command": ["python", "train.py"]}
    for directory, why in (
        ("/home/carol/models", "outside the directories host local lets training runs write"),
        ("/srv/training/../../home/carol", "outside the directories"),
        ("ckpt", "is relative"),
    ):
        run = TrainingRunSpec.model_validate({**fields, "checkpoints": {"directory": directory}})
        with pytest.raises(NotAllowed, match=why):
            resolve_training(policy(), run, "bob")
    stray = TrainingRunSpec.model_validate(
        {**fields, "checkpoints": {"directory": "/srv/training/d"}, "state_dir": "/var/lib/carol"}
    )
    with pytest.raises(NotAllowed, match="state_dir /var/lib/carol is outside"):
        resolve_training(policy(), stray, "bob")
    with pytest.raises(NotAllowed, match="mavis declares no training_dirs"):
        resolve_training(policy(), TrainingRunSpec.model_validate(
            {**fields, "host": "mavis", "checkpoints": {"directory": "/srv/training/d"}}), "bob")  # fmt: skip
    for marker in (".", "..", "a/b", ""):
        with pytest.raises(ValidationError, match="marker"):
            TrainingRunSpec.model_validate(
                {**fields, "checkpoints": {"directory": "/srv/x", "marker": marker}}
            )
    run = TrainingRunSpec.model_validate(
        {**fields, "env": {"HF_HOME": "/srv/hf"}, "checkpoints": {"directory": "/srv/training/d", "keep": 1}}
    )
    _, rule = resolve_training(policy(), run, "bob")
    shown = "\n".join(rule.commands)
    assert "with environment variables: HF_HOME" in shown
    assert "checkpoints under /srv/training/d" in shown and "beyond the newest 1" in shown
    assert "state" in shown and "artifacts" in shown


def test_answering_checks_the_excluded_filer_and_the_policy_as_it_stands() -> None:
    request = DecisionRequest(
        id="g1-dispatch-1",
        ticket_id="g1",
        kind=DecisionKind.DISPATCH,
        question="Dispatch?",
        options=[o.value for o in DispatchOption],
        deciders=["viewer", "wayne"],
        delegates=["lead", "wayne"],
        requested_at="2026-12-01T00:00:00Z",
        excluded=["wayne"],
    )
    assert request.allowed == ["viewer", "lead"]

    def answer(who: str) -> str | None:
        return refusal(request, Decision(request_id=request.id, option="approve", decided_by=who), policy())

    assert answer("wayne") == (
        "wayne filed ticket g1 and may not decide its dispatch; ask someone else with authority: ['viewer', 'lead']"
    )
    assert answer("viewer") is None
    # The lead is wayne's standing delegate: approving wayne's own dispatch would be wayne approving it.
    assert answer("lead") == (
        "lead decides dispatch decisions for wayne, who may not decide this one (ticket g1 is theirs); ask "
        "someone else with authority"
    )
    # The policy changed since filing: the lead is no longer in it.
    people = {name: person for name, person in POLICY["people"].items() if name != "lead"}
    withdrawn = policy(people=people, delegations=[])
    decision = Decision(request_id=request.id, option="approve", decided_by="lead")
    assert "gives lead no authority over dispatch decisions" in (refusal(request, decision, withdrawn) or "")


def test_a_run_time_delegate_may_answer_an_escalation_but_never_approve_a_dispatch() -> None:
    """Whoever reached the `delegate` update cannot make someone an approver of what runs on a host: a dispatch
    takes a decider of the policy or a standing delegate; an escalation may be delegated on the subject."""

    def answer(kind: DecisionKind, options: list[str]) -> str | None:
        request = DecisionRequest(
            id=f"g1-{kind.value}-1",
            ticket_id="g1",
            kind=kind,
            question="?",
            options=options,
            deciders=["wayne"],
            delegates=["bob"],
            requested_at="2026-12-01T00:00:00Z",
        )
        return refusal(
            request, Decision(request_id=request.id, option=options[0], decided_by="bob"), policy()
        )

    assert "gives bob no authority over dispatch decisions" in (
        answer(DecisionKind.DISPATCH, [o.value for o in DispatchOption]) or ""
    )
    assert answer(DecisionKind.ESCALATION, ["retry", "stop"]) is None
