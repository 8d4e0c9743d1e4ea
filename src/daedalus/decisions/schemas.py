"""Decisions on the wire: what is asked (a request about a typed subject), what may be answered, the answer.

Pydantic models only, safe inside workflows. Each question has its option enum; a request carries the enum's
values, and the desk turns a validated answer back into a member of that enum, so no code path ever meets an
option it does not know.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from daedalus.ids import (
    campaign_workflow_id,
    question_subject_key,
    question_workflow_id,
    ticket_workflow_id,
    training_workflow_id,
)
from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.limits import Note

PERSON_PATTERN = r"^[a-z][a-z0-9_.-]{0,31}$"


class DecisionKind(StrEnum):
    DISPATCH = "dispatch"
    ESCALATION = "escalation"
    DEPLOYMENT = "deployment"
    QUESTION = "question"
    """A question for the deciders that belongs to no ticket (daedalus.decisions.questions)."""


class Channel(StrEnum):
    """Where an answer came from. Every channel reaches the same `decide` update."""

    CLI = "cli"
    API = "api"
    SLACK = "slack"
    BOT = "bot"
    POLICY = "policy"
    CONSOLE = "console"
    """The decider's console the API serves (a browser session signed in with an API token)."""


class DispatchOption(StrEnum):
    """May the agent start on the ticket?"""

    APPROVE = "approve"
    REJECT = "reject"


class TicketEscalationOption(StrEnum):
    """A ticket could not decide on its own (attempts used up, the same failure twice, undecided gates)."""

    RETRY = "retry"
    ACCEPT = "accept"
    EXCEPTION = "close-under-exception"
    FAIL = "fail"
    STOP = "stop"


TICKET_ESCALATION_MEANING = (
    "retry = one more attempt with the evidence; accept = close as passed on your authority; "
    "close-under-exception = close under the brief's exception; fail = close as failed; "
    "stop = stopped by the rules"
)


class HostProblemOption(StrEnum):
    """A ticket's host could not run its step (no worker, a broken environment, GPUs not leased): nothing was
    measured, so there is nothing to accept or to close under an exception."""

    RETRY = "retry"
    FAIL = "fail"
    STOP = "stop"


HOST_PROBLEM_MEANING = (
    "retry = run the step again once the host works (no attempt is spent); fail = close as failed; "
    "stop = stopped by the rules"
)


class TrainingEscalationOption(StrEnum):
    """A training run died too often: restart it from its last checkpoint, or stop it."""

    RESTART = "restart"
    STOP = "stop"


class DeploymentOption(StrEnum):
    """A training run's checkpoint cleared its evaluation's bar: switch the serving preset to it, or not."""

    DEPLOY = "deploy"
    SKIP = "skip"


class CampaignProposalOption(StrEnum):
    """A campaign proposes the Pareto-best preset: adopt it, or not."""

    ADOPT = "adopt"
    REJECT = "reject"


class TicketSubject(Model):
    kind: Literal["ticket"] = "ticket"
    ticket_id: str

    @property
    def workflow_id(self) -> str:
        return ticket_workflow_id(self.ticket_id)

    @property
    def label(self) -> str:
        return f"ticket {self.ticket_id}"


class TrainingRunSubject(Model):
    kind: Literal["training_run"] = "training_run"
    run: str

    @property
    def workflow_id(self) -> str:
        return training_workflow_id(self.run)

    @property
    def label(self) -> str:
        return f"training run {self.run}"


class CampaignSubject(Model):
    kind: Literal["campaign"] = "campaign"
    campaign: str

    @property
    def workflow_id(self) -> str:
        return campaign_workflow_id(self.campaign)

    @property
    def label(self) -> str:
        return f"campaign {self.campaign}"


class QuestionSubject(Model):
    """A question that belongs to no ticket: its own subject kind. Its audit trail is keyed `question:<id>`,
    which no ticket, run or campaign id can be (theirs are slugs, without a colon)."""

    kind: Literal["question"] = "question"
    question: str

    @property
    def workflow_id(self) -> str:
        return question_workflow_id(self.question)

    @property
    def audit_key(self) -> str:
        return question_subject_key(self.question)

    @property
    def label(self) -> str:
        return f"question {self.question}"


DecisionSubject = Annotated[
    TicketSubject | TrainingRunSubject | CampaignSubject | QuestionSubject, Field(discriminator="kind")
]
"""What a decision is about; its workflow answers the `decide` update."""


class DecisionRequest(Model):
    """A question for a person: options, evidence, who may answer, and until when."""

    id: str
    ticket_id: str = Field(
        description="the ticket the request concerns (a training run's: its hunting ticket)"
    )
    kind: DecisionKind
    question: str
    options: list[str] = Field(min_length=1)
    evidence: list[str] = Field(default_factory=list)
    deciders: list[str]
    delegates: list[str] = Field(default_factory=list)
    requested_at: datetime
    reminders_sent: int = 0
    subject: DecisionSubject | None = Field(
        default=None, description="whose workflow asked; None only in requests made before subjects existed"
    )
    excluded: list[str] = Field(
        default_factory=list,
        description="who may not answer even when named above: the filer, for their own ticket's dispatch",
    )

    @property
    def allowed(self) -> list[str]:
        """Who may answer: the deciders, then their delegates for this kind, never the excluded."""
        named = [*self.deciders, *(d for d in self.delegates if d not in self.deciders)]
        return [person for person in named if person not in self.excluded]

    @property
    def subject_label(self) -> str:
        return self.subject.label if self.subject is not None else f"ticket {self.ticket_id}"


class Decision(SpecModel):
    """An answer to a DecisionRequest, from any channel (CLI, HTTP, Slack, bot); bounded where it enters."""

    request_id: str = Field(min_length=1, max_length=200)
    option: str = Field(
        min_length=1, max_length=64, description="one of the request's options; the `decide` validator checks"
    )
    decided_by: str = Field(min_length=1, pattern=PERSON_PATTERN)
    channel: Channel = Channel.CLI
    note: Note = ""
    lesson: bool = Field(
        default=False,
        description="the decider marks the note as a lesson for later agents on this engine or host; an "
        "unmarked note stays a decision note",
    )


class Delegation(SpecModel):
    """A decider lets `delegate` decide one kind of decision ("the lead may dispatch on my behalf")."""

    granted_by: str = Field(pattern=PERSON_PATTERN)
    delegate: str = Field(pattern=PERSON_PATTERN)
    kind: DecisionKind = DecisionKind.ESCALATION
    channel: Channel = Channel.CLI


class DispatchRule(Model):
    """The server's policy for one subject's dispatch, resolved when it is filed (a workflow cannot read the
    policy file): whether it waits for a dispatch decision before anything runs on a host, who may not answer
    it, and the commands the request shows."""

    required: bool
    excluded: list[str] = Field(default_factory=list, description="who may not approve it: the filer")
    commands: list[str] = Field(
        default_factory=list, description="what will run on the host, shown in the request's evidence"
    )
    reason: str = Field(default="", description="why approval is (not) required, from the policy")
    covered: bool = Field(
        default=False,
        description="approved as part of an ancestor's dispatch, whose evidence listed its commands",
    )


class DeskState(Model):
    """The decision desk's part of a workflow's state: carried across continue-as-new."""

    pending: DecisionRequest | None = None
    decisions: list[Decision] = Field(default_factory=list)
    requests_made: int = 0
    delegates: dict[str, list[str]] = Field(
        default_factory=dict, description="decision kind -> people who may decide it for the deciders"
    )
