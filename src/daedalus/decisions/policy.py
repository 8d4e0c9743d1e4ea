"""The server's policy (`policy.yaml`, path from `DAEDALUS_POLICY_FILE`): who is who, who may operate which
host, and the standing delegations. Authority lives here, never in a filed spec.

Filing resolves it for one ticket or training run (`resolve_ticket`, `resolve_training`): the spec's approval is
checked (it may tighten, never loosen), filled in from the policy, and the dispatch rule the workflow follows is
handed to it in its input (a workflow cannot read files). Answering checks it again (`Policy` is an
`AuthorityPolicy`), so a person the policy no longer names cannot decide.

Roles:
    filer     may file tickets and start training runs
    lead      a filer the deciders may delegate to (the seed's lead agent)
    decider   may answer any decision, except the dispatch of what they filed themselves
    operator  may run things on the hosts whose `operators` name them without a dispatch decision
A decider or an operator of the ticket's host may also terminate a wedged ticket.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from daedalus.decisions.commands import tree_commands
from daedalus.decisions.schemas import (
    PERSON_PATTERN,
    Decision,
    DecisionKind,
    DecisionRequest,
    Delegation,
    DispatchRule,
)
from daedalus.errors import NotAllowed, PolicyFileError
from daedalus.hosts.registry import Registry, load_registry
from daedalus.schemas._base import SpecModel
from daedalus.schemas.limits import HOST_PATTERN, LIST_ITEMS, Line
from daedalus.schemas.ticket import ApprovalPolicy, TicketSpec
from daedalus.schemas.training import TrainingRunSpec


class Role(StrEnum):
    FILER = "filer"
    LEAD = "lead"
    DECIDER = "decider"
    OPERATOR = "operator"


class Person(SpecModel):
    roles: list[Role] = Field(min_length=1, max_length=len(Role))
    description: Line = ""


class HostRule(SpecModel):
    operators: list[str] = Field(default_factory=list, max_length=LIST_ITEMS)
    training_dirs: list[Path] = Field(
        default_factory=list,
        max_length=LIST_ITEMS,
        description="where training runs on this host may keep checkpoints, state and artifacts (absolute, or "
        "relative to the policy file); empty: only the host's operators start runs there",
    )

    @field_validator("training_dirs")
    @classmethod
    def _absolute(cls, paths: list[Path], info: ValidationInfo) -> list[Path]:
        base: Path | None = (info.context or {}).get("base")
        relative = [str(p) for p in paths if not p.is_absolute()]
        if relative and base is None:
            raise ValueError(f"training_dirs must be absolute paths: {relative}")
        return [Path(os.path.normpath(p if p.is_absolute() or base is None else base / p)) for p in paths]


class StandingDelegation(SpecModel):
    """A decider lets `delegate` decide one kind of decision on every ticket ("the lead may dispatch for me")."""

    granted_by: str = Field(pattern=PERSON_PATTERN)
    delegate: str = Field(pattern=PERSON_PATTERN)
    kind: DecisionKind = DecisionKind.DISPATCH


class Policy(SpecModel):
    people: dict[str, Person] = Field(min_length=1, max_length=1000)
    hosts: dict[str, HostRule] = Field(default_factory=dict, max_length=1000)
    delegations: list[StandingDelegation] = Field(default_factory=list, max_length=LIST_ITEMS)

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        bad = [name for name in self.people if not re.fullmatch(PERSON_PATTERN, name)]
        if bad:
            raise ValueError(f"people: {bad} are not valid names (lower case, e.g. `wayne`, `alice.b`)")
        bad_hosts = [name for name in self.hosts if not re.fullmatch(HOST_PATTERN, name)]
        if bad_hosts:
            raise ValueError(f"hosts: {bad_hosts} are not valid host names")
        if not self.with_role(Role.DECIDER):
            raise ValueError("people: nobody has the `decider` role, so no dispatch could ever be approved")
        for host, rule in self.hosts.items():
            for person in rule.operators:
                self._require_person(person, f"hosts.{host}.operators")
                if Role.OPERATOR not in self.people[person].roles:
                    raise ValueError(
                        f"hosts.{host}.operators names {person}, who lacks the `operator` role; add it to "
                        f"people.{person}.roles or remove them from the host"
                    )
        for number, grant in enumerate(self.delegations):
            where = f"delegations[{number}]"
            self._require_person(grant.granted_by, f"{where}.granted_by")
            self._require_person(grant.delegate, f"{where}.delegate")
            if Role.DECIDER not in self.people[grant.granted_by].roles:
                raise ValueError(
                    f"{where}: {grant.granted_by} is not a decider, so has no {grant.kind.value} decisions to "
                    f"delegate"
                )
        return self

    def _require_person(self, person: str, where: str) -> None:
        if person not in self.people:
            raise ValueError(f"{where} names unknown person {person!r}; people: {sorted(self.people)}")

    # ---- questions about people ------------------------------------------------------------------------

    def with_role(self, role: Role) -> list[str]:
        return sorted(name for name, person in self.people.items() if role in person.roles)

    def has_role(self, person: str, role: Role) -> bool:
        found = self.people.get(person.lower())
        return found is not None and role in found.roles

    def operates(self, person: str, host: str) -> bool:
        rule = self.hosts.get(host)
        return rule is not None and person.lower() in rule.operators

    def delegates_of(self, deciders: Iterable[str], kind: DecisionKind) -> list[str]:
        """The standing delegates of `deciders` for one kind of decision."""
        named = set(deciders)
        return sorted({g.delegate for g in self.delegations if g.kind is kind and g.granted_by in named})

    def may_terminate(self, person: str, host: str) -> bool:
        return self.has_role(person, Role.DECIDER) or self.operates(person, host)

    def may_stop(self, person: str, host: str, started_by: str) -> bool:
        """A training run: its starter may stop it, as may anyone who may terminate things on its host."""
        return person.lower() == started_by.lower() or self.may_terminate(person, host)

    def require_hosts(self, hosts: Registry) -> None:
        """Every host the policy names is in the host registry."""
        unknown = sorted(set(self.hosts) - set(hosts.names))
        if unknown:
            raise PolicyFileError(
                f"the policy names hosts the host registry does not declare: {unknown}; hosts.yaml declares "
                f"{hosts.names} (fix the policy's `hosts:`, or add the hosts to hosts.yaml)"
            )

    def delegation_refusal(self, delegation: Delegation) -> str | None:
        """Why the policy would never honour `delegation` (a delegate it would still refuse), or None. Asked
        before the delegation is sent, so that nothing is recorded that would not take effect."""
        delegate = delegation.delegate.lower()
        if delegation.kind is DecisionKind.DISPATCH:
            standing = sorted(g.delegate for g in self.delegations if g.kind is DecisionKind.DISPATCH)
            return (
                f"under the server's policy a delegation made at run time never lets {delegate} approve a "
                f"dispatch: what runs on a host is the policy's to say (standing dispatch delegates: "
                f"{standing or 'none'}); delegate escalations instead (--kind escalation), or ask an "
                f"administrator for a standing delegation in policy.yaml (delegations: - {{granted_by: "
                f"{delegation.granted_by}, delegate: {delegate}, kind: dispatch}})"
            )
        if delegate not in self.people:
            return (
                f"{delegate} is not in the server's policy, which would refuse their answer; delegate to one of "
                f"{sorted(self.people)}, or ask an administrator to add {delegate} to policy.yaml"
            )
        return None

    # ---- AuthorityPolicy: checked when a decision is answered --------------------------------------------

    def __call__(self, request: DecisionRequest, decision: Decision, /) -> str | None:
        """The request's own rules allowed `decision`; the policy as it stands now must too."""
        who = decision.decided_by.lower()
        if self.has_role(who, Role.DECIDER):
            return None
        # A delegate acts for the decider who delegated: never for someone this request excludes (a filer's
        # standing delegate approving the filer's own dispatch would be the filer approving it).
        granting = [decider for decider in request.deciders if decider not in request.excluded]
        if who in self.delegates_of(granting, request.kind):
            return None
        for_excluded = [d for d in request.excluded if who in self.delegates_of([d], request.kind)]
        if for_excluded:
            return (
                f"{decision.decided_by} decides {request.kind.value} decisions for {', '.join(for_excluded)}, who "
                f"may not decide this one ({request.subject_label} is theirs); ask someone else with authority"
            )
        if request.kind is DecisionKind.DISPATCH:
            # What runs on a host is the policy's to say: a delegation made at run time (by whoever could
            # reach the `delegate` update) never makes someone an approver of a dispatch.
            return (
                f"the server's policy gives {decision.decided_by} no authority over dispatch decisions (not a "
                f"decider in the policy, and no standing delegate of this request's deciders)"
            )
        if who in request.delegates and who in self.people:
            return None  # delegated on this subject by one of its deciders
        return (
            f"the server's policy gives {decision.decided_by} no authority over {request.kind.value} decisions "
            f"(not a decider in the policy, and no decider of this request delegated them to them)"
        )


def load_policy(path: Path, hosts: Registry | None = None) -> Policy:
    """Read and check `policy.yaml`; every problem names its field. With `hosts`, its host names are checked."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise PolicyFileError(
            f"cannot read the policy {path}: {error.strerror}; set DAEDALUS_POLICY_FILE to your policy.yaml "
            f"(examples/policy.yaml is the demo's)"
        ) from error
    except yaml.YAMLError as error:
        raise PolicyFileError(f"the policy {path} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise PolicyFileError(
            f"the policy {path} must be a mapping with `people:`, `hosts:` and `delegations:`"
        )
    try:
        # a relative path in the policy (a host's training_dirs) is relative to the policy file
        policy = Policy.model_validate(data, context={"base": path.resolve().parent})
    except ValidationError as error:
        lines = [f"the policy {path} is not valid ({error.error_count()} problem(s)):"]
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            lines.append(f"  - {where}: {problem['msg'].removeprefix('Value error, ')}")
        raise PolicyFileError("\n".join(lines)) from error
    if hosts is not None:
        policy.require_hosts(hosts)
    return policy


def configured_policy(policy_file: Path | None, hosts_file: Path) -> Policy | None:
    """The policy `DAEDALUS_POLICY_FILE` names, checked against the host registry; None when none is set."""
    if policy_file is None:
        return None
    return load_policy(policy_file, load_registry(hosts_file))


# ---- resolving a filing ------------------------------------------------------------------------------------


def resolve_ticket(policy: Policy, spec: TicketSpec, filer: str) -> tuple[TicketSpec, DispatchRule]:
    """The spec as the policy lets it run (its approval filled in from the policy, every sub-ticket's too) and
    the dispatch rule of its tree; a NotAllowed when the filer may not file it as written."""
    filer = filer.lower()
    _require_filer(policy, filer, "file tickets")
    tree = spec.tree()
    operator = all(policy.operates(filer, ticket.host) for ticket in tree)
    for ticket in tree:
        _refuse_loosening(policy, ticket.approval, filer, operator, f"ticket {ticket.id}", ticket.host)
    resolved = _with_approval(policy, spec)
    commands = tree_commands(spec)
    hosts = sorted({ticket.host for ticket in tree})
    if operator:
        # The filer may run things on these hosts; the spec may still ask for a dispatch decision (as before).
        asked = spec.agent is not None and spec.approval.dispatch_requires_approval
        reason = f"{filer} operates {', '.join(hosts)}"
        return resolved, DispatchRule(required=asked, commands=commands, reason=reason)
    _require_someone_else(policy, resolved.approval, filer, f"ticket {spec.id}")
    reason = f"{filer} does not operate {', '.join(hosts)}: a dispatch decision by someone else is required"
    resolved = _tree_without_delegates_of(policy, resolved, filer)
    return resolved, DispatchRule(required=True, excluded=[filer], commands=commands, reason=reason)


def resolve_training(
    policy: Policy, spec: TrainingRunSpec, starter: str
) -> tuple[TrainingRunSpec, DispatchRule]:
    """A training run as the policy lets it start: an operator of its host starts it at once, anyone else's
    run waits for a dispatch decision by someone with authority."""
    starter = starter.lower()
    _require_filer(policy, starter, "start training runs")
    operator = policy.operates(starter, spec.host)
    _refuse_loosening(policy, spec.approval, starter, operator, f"training run {spec.name}", spec.host)
    approval = _effective_approval(policy, spec.approval)
    resolved = spec.model_copy(update={"approval": approval})
    _require_training_dirs(policy, spec, operator)
    commands = spec.effects()
    if operator:
        return resolved, DispatchRule(
            required=False, commands=commands, reason=f"{starter} operates {spec.host}"
        )
    _require_someone_else(policy, approval, starter, f"training run {spec.name}")
    reason = f"{starter} does not operate {spec.host}: a dispatch decision by someone else is required"
    resolved = resolved.model_copy(update={"approval": _without_delegates_of(policy, approval, starter)})
    return resolved, DispatchRule(required=True, excluded=[starter], commands=commands, reason=reason)


def _require_training_dirs(policy: Policy, spec: TrainingRunSpec, operator: bool) -> None:
    """Where a run writes and prunes stays inside the host's `training_dirs`; a host that declares none takes
    runs from its operators only."""
    rule = policy.hosts.get(spec.host)
    allowed = rule.training_dirs if rule is not None else []
    if not allowed:
        if operator:
            return
        raise NotAllowed(
            f"training run {spec.name}: host {spec.host} declares no training_dirs in the policy, so only its "
            f"operators start runs there; ask for training_dirs under hosts.{spec.host} in policy.yaml"
        )
    written = {"checkpoints.directory": spec.checkpoints.directory}
    if spec.state_dir is not None:
        written["state_dir"] = spec.state_dir
    if spec.artifact_dir is not None:
        written["artifact_dir"] = spec.artifact_dir
    for field, path in written.items():
        if not path.is_absolute():
            raise NotAllowed(
                f"training run {spec.name}: {field} {path} is relative; give an absolute path under "
                f"{', '.join(map(str, allowed))}"
            )
        normal = Path(os.path.normpath(path))
        if not any(normal.is_relative_to(root) for root in allowed):
            raise NotAllowed(
                f"training run {spec.name}: {field} {path} is outside the directories host {spec.host} lets "
                f"training runs write ({', '.join(map(str, allowed))}); move it under one of them"
            )


def _require_filer(policy: Policy, person: str, action: str) -> None:
    if not (policy.has_role(person, Role.FILER) or policy.has_role(person, Role.LEAD)):
        known = "has no `filer` or `lead` role" if person in policy.people else "is not in the policy"
        raise NotAllowed(
            f"{person} may not {action}: {person} {known}; if you are not {person}, say who you are with "
            f"--as <you>; else ask an administrator to add {person} to policy.yaml (people.{person}.roles: "
            f"[filer])"
        )


def _refuse_loosening(
    policy: Policy, approval: ApprovalPolicy, filer: str, operator: bool, label: str, host: str
) -> None:
    """A spec may tighten its approval, never loosen it past the policy."""
    if not approval.dispatch_requires_approval and not operator:
        raise NotAllowed(
            f"{label}: approval.dispatch_requires_approval: false would let {filer} run commands on {host} "
            f"without a dispatch decision, and the policy does not make {filer} an operator of {host}; remove "
            f"the line (someone with authority will approve the dispatch), or ask for {filer} to be added to "
            f"the host's operators in policy.yaml"
        )
    deciders = policy.with_role(Role.DECIDER)
    if "deciders" in approval.model_fields_set:
        strangers = [person for person in approval.deciders if person not in deciders]
        if strangers:
            raise NotAllowed(
                f"{label}: approval.deciders names {strangers}, who are not deciders in the policy; a spec may "
                f"only choose among the deciders: {deciders}"
            )
    for kind, people in approval.delegates.items():
        named = _effective_deciders(policy, approval)
        standing = policy.delegates_of(named, DecisionKind(kind))
        strangers = [person for person in people if person not in standing and person not in deciders]
        if strangers:
            raise NotAllowed(
                f"{label}: approval.delegates.{kind} names {strangers}, to whom no decider of this spec "
                f"delegated {kind} decisions in the policy; a spec may only name standing delegates "
                f"({standing or 'none'}) or deciders"
            )


def _effective_deciders(policy: Policy, approval: ApprovalPolicy) -> list[str]:
    """The spec's deciders when it chose them, else every decider of the policy."""
    if "deciders" in approval.model_fields_set:
        return list(approval.deciders)
    return policy.with_role(Role.DECIDER)


def _effective_approval(policy: Policy, approval: ApprovalPolicy) -> ApprovalPolicy:
    deciders = _effective_deciders(policy, approval)
    delegates = {
        kind.value: sorted({*approval.delegates.get(kind.value, []), *policy.delegates_of(deciders, kind)})
        for kind in DecisionKind
    }
    return approval.model_copy(
        update={"deciders": deciders, "delegates": {k: v for k, v in delegates.items() if v}}
    )


def _without_delegates_of(policy: Policy, approval: ApprovalPolicy, filer: str) -> ApprovalPolicy:
    """The dispatch delegates, less those who would only act for the filer (who may not decide the dispatch)."""
    others = [person for person in approval.deciders if person != filer]
    acting_for_others = {*policy.delegates_of(others, DecisionKind.DISPATCH), *policy.with_role(Role.DECIDER)}
    dispatch = DecisionKind.DISPATCH.value
    kept = [p for p in approval.delegates.get(dispatch, []) if p in acting_for_others and p != filer]
    delegates = {kind: people for kind, people in approval.delegates.items() if kind != dispatch}
    if kept:
        delegates[dispatch] = kept
    return approval.model_copy(update={"delegates": delegates})


def _tree_without_delegates_of(policy: Policy, spec: TicketSpec, filer: str) -> TicketSpec:
    return spec.model_copy(
        update={
            "approval": _without_delegates_of(policy, spec.approval, filer),
            "children": [_tree_without_delegates_of(policy, child, filer) for child in spec.children],
        }
    )


def _with_approval(policy: Policy, spec: TicketSpec) -> TicketSpec:
    return spec.model_copy(
        update={
            "approval": _effective_approval(policy, spec.approval),
            "children": [_with_approval(policy, child) for child in spec.children],
        }
    )


def _require_someone_else(policy: Policy, approval: ApprovalPolicy, filer: str, label: str) -> None:
    """Someone other than the filer can approve: another decider, or a standing delegate of one (the filer's
    own delegates act for the filer, so they do not count)."""
    deciders = [person for person in approval.deciders if person != filer]
    others = [*deciders, *policy.delegates_of(deciders, DecisionKind.DISPATCH)]
    others += [
        person
        for person in approval.delegates.get(DecisionKind.DISPATCH.value, [])
        if person in policy.with_role(Role.DECIDER) and person != filer
    ]
    if not others:
        raise NotAllowed(
            f"{label}: nobody but its filer {filer} (or someone acting for {filer}) could approve its dispatch; "
            f"name another decider in approval.deciders (deciders: {policy.with_role(Role.DECIDER)})"
        )
