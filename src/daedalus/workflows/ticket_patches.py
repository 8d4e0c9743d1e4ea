"""The ticket workflow's patches (workflow.patched ids) and what each changed; the step machinery's own are in
ticket_steps.py and ticket_lessons.py. An id is stored in live tickets' histories: never rename one."""

CHILDREN_BUILD_ON_PREDECESSOR = "children-build-on-predecessor"
"""Patch: a sub-ticket starts from its predecessor's accepted commit (histories before it started from base)."""
WAITING_FOR_DELEGATES = "waiting-for-delegates"
"""Patch: a delegation names the delegate in a pending request's `DaedalusWaitingFor` (an upsert)."""
PATCHES_AT_START = "ticket-patches-at-start"
"""Patch: the ticket's patches are on, decided in the run's first activation (patches.py). Each was asked first
right after an audit write (a local activity), which fails replay when a query split their workflow tasks:
`waiting-for-delegates`, `children-build-on-predecessor`, `host-problems-ask-the-decider`,
`gates-hold-gpu-leases`, `ticket-lessons`. Runs started before it ask them lazily, where they always did."""
HOST_PROBLEM_OPTIONS = "host-problem-options"
"""Patch, asked in the run's first activation: a host that cannot run a step asks retry, fail or stop (histories
before it also offered accept and close-under-exception, though nothing had been measured)."""
CHILDREN_COVERED_BY_DISPATCH = "children-covered-by-dispatch"
"""Patch, asked in the run's first activation: once a ticket's dispatch was approved, its sub-tickets run on that
approval, whose evidence listed their commands too (histories before it asked each agent sub-ticket again)."""
PARENT_ANSWERS_FOR_CHILDREN = "parent-answers-for-children"
"""Patch, asked in the run's first activation: a parent passes only when its sub-tickets passed; its own PASS
becomes FAILED (or closed under an exception) when one of them did not (histories before it: every stored one,
the umbrella ones included, closed on the parent's own gates alone)."""
MEASURES_WHAT_WAS_ACCEPTED = "measures-what-was-accepted"
"""Patch, asked in the run's first activation: a ticket without an agent builds (its `build:`) and measures its
engine at the commit its sub-tickets' work was accepted at, else at its base (histories before it measured the base
commit unbuilt, so ticket 6's own gates and a measurement sub-ticket like 6c measured the host's install)."""
PATCHES_BUNDLED = "ticket-patches-bundled"
"""Patch, asked first in the run's first activation (the ticket's `__init__`): every patch a new ticket used to ask
in that activation is on without being asked, so a ticket records one patch marker, and one upsert of Temporal's
`TemporalChangeVersion` search attribute (core makes one per marker, a write to the visibility store each), where it
recorded ten: `ticket-patches-at-start`, `ticket-lessons-read-locally`, `lessons-that-teach`, `host-problem-options`,
`children-covered-by-dispatch`, `gate-startup-time`, `parent-answers-for-children`, `measures-what-was-accepted`,
`audit-batched-writes` and `audit-local-activity`. Runs started before it ask each one as they did (their
histories replay as recorded). A patch added later is asked on its own, as before."""
