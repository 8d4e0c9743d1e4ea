"""Every error Daedalus raises on purpose, under one root, and its one mapping to Temporal.

The tree says what kind of trouble it is, and so what a person does about it:

    DaedalusError                     root; `retryable` is stated once per class
    ├── InputError                    what was filed or asked is wrong: fix it and file again
    │   ├── TicketError               a request refused at the client (CLI, API, Slack, demo)
    │   │   ├── UnknownRequest        a decision for a request no ticket, training run or campaign asked
    │   │   └── NotAllowed            the server's policy gives the person no authority for what they asked
    │   ├── TrainingInputError        a training run that cannot start as filed
    │   ├── PresetError               a preset file is missing or invalid (also an EngineError)
    │   ├── UnsupportedMetric         a gate metric no engine measurement produces (also an EngineError)
    │   └── BadButton                 a Slack button value Daedalus did not make
    ├── SetupError                    this machine lacks something or is set up wrong: fix the host
    │   ├── BadSettings               a DAEDALUS_* variable holds a bad value (the message names it)
    │   ├── DevServerError            the embedded Temporal dev server cannot start
    │   ├── GitError                  a git command failed (missing checkout, unknown commit)
    │   ├── AgentConfigError          a coding agent cannot start as configured (binary, key, model)
    │   ├── LeadUnavailable           the lead agent has no provider to ask
    │   ├── RegistryError             hosts.yaml is missing or invalid, or lacks what is asked of it
    │   ├── PolicyFileError           policy.yaml is missing or invalid
    │   ├── EngineRepoUnavailable     an engine repo cannot be reached from the host, or lacks the commit
    │   ├── BundleError               an offline host bundle cannot be built or installed
    │   └── SandboxError              the agent sandbox cannot be set up as asked
    │       └── SandboxUnavailable    bubblewrap is not installed (`make system`)
    ├── EngineError                   an engine could not be built, started or measured
    │   ├── BuildError                CMake failed
    │   ├── ServerDied                the engine's server process exited
    │   ├── MetricsUnavailable        the server's /metrics could not be read
    │   ├── ApiError                  an OpenAI-compatible request was refused or unreadable
    │   └── GpuUnavailable            the measurement needs a GPU (CUDA torch or NVML) this host lacks
    ├── LeaseError                    a GPU lease was refused, lost, or its keeper cannot be reached
    │   ├── LeaseRefused              the keeper refused it (no such GPU, a standing constraint, a tenant)
    │   └── LeaseLost                 it expired or was revoked while held
    ├── AgentError                    a coding agent misbehaved or its provider gave up
    │   ├── AgentViolation            it did something it must not
    │   │   ├── TreeRefused           its worktree holds what no commit may (a nested repository, a huge file)
    │   │   └── OutsideAllowed        its change touches paths the spec does not allow
    │   ├── BudgetExceeded            it spent its budget
    │   ├── ApiFailure                its provider's API failed for good (after the SDK's own retries)
    │   └── ToolError                 one tool call was wrong; the message goes back to the model
    │       ├── PathEscape            a path outside the worktree
    │       └── ForbiddenCommand      a command on the deny list
    ├── TransientError                a dependency was briefly away (network, rate limit): Temporal retries
    │   └── SlackUnavailable          Slack could not be reached or asked us to slow down
    └── TicketCancelled               a ticket's cancel request interrupting its current step (workflow-side)

`maps_errors` turns a `DaedalusError` raised by an activity into Temporal's `ApplicationError`, whose `type` is
the class's name and whose `non_retryable` is `not retryable`; every activity is wrapped in it. Workflows refer
to a type by `SomeError.type_name` and find one in an activity's failure with `SomeError.failure_in(error)`.

This module imports nothing with side effects, so workflows (inside Temporal's sandbox) may import it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ClassVar, ParamSpec, TypeVar

# Temporal's failure types are imported where used: a CLI command that only reads does not pay for them.
if TYPE_CHECKING:
    from temporalio.exceptions import ApplicationError

__all__ = [
    "AgentConfigError",
    "AgentError",
    "AgentViolation",
    "ApiError",
    "ApiFailure",
    "BadButton",
    "BadSettings",
    "BrokenInvariant",
    "BudgetExceeded",
    "BuildError",
    "BundleError",
    "CampaignRefused",
    "DaedalusError",
    "DevServerError",
    "EngineError",
    "EngineRepoUnavailable",
    "EngineSetupError",
    "ForbiddenCommand",
    "GitError",
    "GpuUnavailable",
    "InputError",
    "LeadUnavailable",
    "LeaseError",
    "LeaseLost",
    "LeaseRefused",
    "MetricsUnavailable",
    "NotAllowed",
    "OutsideAllowed",
    "PathEscape",
    "PolicyFileError",
    "PresetError",
    "RegistryError",
    "RequestRefused",
    "SandboxError",
    "SandboxUnavailable",
    "ServerDied",
    "SetupError",
    "SlackUnavailable",
    "TicketCancelled",
    "TicketError",
    "TokenError",
    "ToolError",
    "TrainingInputError",
    "TrainingRefused",
    "TransientError",
    "TreeRefused",
    "UnknownRequest",
    "UnsupportedMetric",
    "maps_errors",
]


class DaedalusError(Exception):
    """The root. A subclass says once whether Temporal may retry it; the message is for a person to act on."""

    retryable: ClassVar[bool] = False
    type_name: ClassVar[str] = "DaedalusError"
    """The `ApplicationError.type` this class travels as; stored in histories, so renaming a class is a change."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.type_name = cls.__name__

    def to_application_error(self) -> ApplicationError:
        """This error as Temporal carries it: the message, the class's name as type, retryable as the class says."""
        from temporalio.exceptions import ApplicationError

        return ApplicationError(str(self), type=self.type_name, non_retryable=not self.retryable)

    @classmethod
    def type_names(cls) -> frozenset[str]:
        """The type names of this class and all its subclasses: a failure of any of them is one of these."""
        names = {cls.type_name}
        for sub in cls.__subclasses__():
            names |= sub.type_names()
        return frozenset(names)

    @classmethod
    def failure_in(cls, error: BaseException) -> ApplicationError | None:
        """The ApplicationError of this class (or a subclass) inside an activity's or child workflow's failure,
        or None when `error` is some other failure."""
        from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

        while isinstance(error, ActivityError | ChildWorkflowError) and error.cause is not None:
            error = error.cause
        return error if isinstance(error, ApplicationError) and error.type in cls.type_names() else None


# ---- input: fix what was filed ------------------------------------------------------------------------


class InputError(DaedalusError):
    """What was filed or asked is wrong; the same input fails the same way, so it is never retried."""


class RequestRefused(InputError):
    """A request Daedalus refused; the message is for the person who made it. Entry points catch this root; each
    subject raises its own kind (a ticket's, a training run's, a campaign's)."""


class TicketError(RequestRefused):
    """A request about a ticket (or a question) that Daedalus refused."""


class TrainingRefused(RequestRefused):
    """A request about a training run that Daedalus refused (filing, stopping, deciding, reading its status)."""


class CampaignRefused(RequestRefused):
    """A request about a campaign that Daedalus refused (cancelling it, deciding its proposal)."""


class UnknownRequest(RequestRefused):
    """A decision for a request no ticket, training run or campaign asked."""


class TokenError(RequestRefused):
    """A token command was given something it cannot use (an unknown id, a bad person)."""


class NotAllowed(RequestRefused):
    """The server's policy (policy.yaml) gives the person no authority for what they asked, or a spec tried to
    give them more than the policy does; the message says who may, or what to change."""


class TrainingInputError(InputError):
    """A run that cannot start as filed: the message says what to change."""


class BadButton(InputError):
    """A button value that is not one Daedalus made."""


# ---- setup: fix the host --------------------------------------------------------------------------------


class SetupError(DaedalusError):
    """This machine lacks something or is set up wrong (a binary, a checkout, a key). Retrying would only hide
    it for as long as the retry policy allows, so it fails at once and says what to install or set."""


class BadSettings(SetupError):
    """A DAEDALUS_* variable (or .env line) holds a value Daedalus cannot use; the message names each one."""


class DevServerError(SetupError):
    """The embedded Temporal dev server cannot start (binary missing, port taken, it exited)."""


class GitError(SetupError):
    """A git command failed; the message carries the command, the directory and git's own words."""


class AgentConfigError(SetupError):
    """The agent cannot start as configured (missing key, missing binary, unknown model)."""


class RegistryError(SetupError):
    """hosts.yaml is missing or invalid, or names something it does not declare; the message says where."""


class PolicyFileError(SetupError):
    """policy.yaml is missing or invalid, or names a host the registry does not declare; the message says where."""


class EngineRepoUnavailable(SetupError):
    """The engine repo cannot be reached from this host, or lacks the commit; the message says what to fix."""


class BundleError(SetupError):
    """A bundle could not be built or installed; the message says what to change."""


class SandboxError(SetupError):
    """The sandbox cannot be set up as asked; the message says what to fix."""


class SandboxUnavailable(SandboxError):
    """bubblewrap is not installed on this host."""


class LeadUnavailable(SetupError):
    """The lead agent cannot be asked (no key, the provider refused); callers fall back to plain facts."""


# ---- engines --------------------------------------------------------------------------------------------


class EngineError(DaedalusError):
    """An engine could not be built, started or measured; the message says why and what to do.

    Not retried: a build or a launch that failed once fails the same way on the same host and commit, and a
    benchmark that broke half-way is reported INVALID by its gate rather than repeated behind its back."""


class EngineSetupError(EngineError):
    """The worker is not set up to run this engine (no build, no model file, the port taken, vLLM missing):
    a fault of the host's setup that says what to install or free, never a finding about the preset."""


class BuildError(EngineError):
    """CMake failed; the message carries the tail of the build log."""


class ServerDied(EngineError):
    """The server process exited; the message carries its exit code and log tail."""


class MetricsUnavailable(EngineError):
    """The server's /metrics could not be read."""


class ApiError(EngineError):
    """The server answered an OpenAI-compatible request with an error, or with something unreadable."""


class GpuUnavailable(EngineSetupError):
    """The measurement needs a GPU (torch with CUDA, or NVML) that this host does not have."""


class PresetError(EngineError, InputError):
    """A preset file is missing or invalid; the message names the file and the field."""


class UnsupportedMetric(EngineError, InputError):
    """A gate names a metric the engines cannot produce."""


# ---- agents ---------------------------------------------------------------------------------------------


# ---- GPU leases ----------------------------------------------------------------------------------------


class LeaseError(DaedalusError):
    """A lease was refused, lost, or its keeper cannot be reached; the message says why and what to do."""


class LeaseRefused(LeaseError):
    """The keeper refused the lease (no such GPU, a standing constraint, a tenant that would not free them)."""


class LeaseLost(LeaseError):
    """A held lease expired or was revoked; the step under it must stop."""


# ---- agents ---------------------------------------------------------------------------------------------


class AgentError(DaedalusError):
    """A coding agent misbehaved or its provider gave up; the attempt records it as its outcome."""


class AgentViolation(AgentError):
    """The agent did something it must not: wrote outside its worktree, ran a forbidden command."""


class TreeRefused(AgentViolation):
    """Its worktree holds something no attempt may commit (a nested repository, a huge file)."""


class OutsideAllowed(AgentViolation):
    """Its worktree changed paths the spec does not allow: the attempt counts as a whole, so nothing is committed."""

    def __init__(self, paths: list[str], diff_stat: str) -> None:
        super().__init__(f"changes outside the allowed paths: {paths}")
        self.paths = paths
        self.diff_stat = diff_stat


class BudgetExceeded(AgentError):
    """The attempt spent its budget (dollars or tokens)."""


class ApiFailure(AgentError):
    """A provider call failed for good (after the SDK's retries); `timed_out` when it did not answer in time
    (the attempt is recorded as a timeout, else as failed)."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class ToolError(AgentError):
    """A tool call the agent got wrong; the message goes back to the model so it can correct itself."""


class PathEscape(ToolError):
    """A path that leaves the worktree."""


class ForbiddenCommand(ToolError):
    """A command on the deny list."""


# ---- bugs: a fix is deployed, then Temporal retries ----------------------------------------------------


class BrokenInvariant(DaedalusError):
    """Workflow code found a state its own logic rules out: a bug, not bad input. Raised where an `assert` stood,
    it fails the workflow task as the assert did (Temporal retries the task once a fix is deployed), and its
    message says which rule broke."""


# ---- transient: Temporal retries ------------------------------------------------------------------------


class TransientError(DaedalusError):
    """A dependency was briefly away (network, rate limit, a 5xx); the same call may well work in a moment."""

    retryable = True


class SlackUnavailable(TransientError):
    """Slack could not be reached, failed on its side, or asked us to slow down."""


# ---- workflow control -----------------------------------------------------------------------------------


class TicketCancelled(DaedalusError):
    """Raised inside a ticket's workflow when a cancel request interrupts its current step."""


# ---- the one mapping to Temporal ------------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def maps_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Wrap an async activity so a `DaedalusError` leaves it as `ApplicationError` (type = class name,
    non_retryable = not retryable). Put it under `@activity.defn`, which then registers the wrapper under the
    activity's own name and signature. Any other exception passes through untouched (Temporal retries it)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except DaedalusError as error:
            raise error.to_application_error() from error

    return wrapper
