"""Bounds on what a person may file, so that no valid-looking input can wedge a workflow.

Every number is finite, every duration and count has a ceiling, every text has a size, and every name that
becomes part of a workflow id or a file path is a slug. The text sizes keep a whole ticket (spec, children,
attempts, decisions) far below Temporal's 2 MB payload limit: a spec is at most `SPEC_BYTES` as JSON, and an
attempt's input carries the spec and one brief, so it stays under a quarter of the limit.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

TEMPORAL_PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024

TITLE_CHARS = 200
BRIEF_CHARS = 64 * 1024
"""The brief (`spec`) a person writes; a longer one belongs in the repository, referenced from the brief."""
NOTE_CHARS = 4 * 1024
"""A decision's note, a cancellation's reason, an amendment's note."""
COMMAND_CHARS = 8 * 1024
PATCH_CHARS = 128 * 1024
"""The scripted agent's patch (demos and tests)."""
LINE_CHARS = 1024
"""One constraint, one allowed path, one engine field."""
LIST_ITEMS = 64
"""Gates, constraints, allowed paths, commands, deciders."""
CHILDREN = 32
SPEC_BYTES = 384 * 1024
"""A whole ticket spec as JSON, children included."""

DURATION_MAX_S = 7 * 24 * 3600
"""No build, gate or reminder waits longer than a week; a longer one is a typo (and 1e20 s overflows)."""
GATES = 16
MAX_GATE_SAMPLES = 1_000
"""A gate measurement with more samples is INVALID: every verdict carries its raw samples through the workflow
(1,000 samples are ~20 KiB of history per gate and round), and the host sorts them for the order-statistic interval."""
GATE_OUTPUT_BYTES = 1024 * 1024
"""Only the tail of a gate command's stdout is read for its measurement line."""

SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Ids and names that become part of a workflow id or a file name: no `/`, no `..` prefix, no spaces."""
GATE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$"
HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
"""A host names a task queue (`host-<name>`) and a directory on the worker."""

RESERVED_TICKET_PREFIXES = ("training-", "campaign-", "hunt-")
"""`training-<name>` and `campaign-<id>` are a training run's and a campaign's audit and decision subjects;
`hunt-<run>-<n>` is the hunting ticket a training run opens itself. A ticket filed with either would share a
run's or a campaign's trail and request ids (`campaign-x-proposal-1`), or take an id a run needs."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
DurationS = Annotated[int, Field(gt=0, le=DURATION_MAX_S)]
Title = Annotated[str, Field(min_length=1, max_length=TITLE_CHARS)]
Brief = Annotated[str, Field(max_length=BRIEF_CHARS)]
Note = Annotated[str, Field(max_length=NOTE_CHARS)]
Command = Annotated[str, Field(min_length=1, max_length=COMMAND_CHARS)]
Line = Annotated[str, Field(max_length=LINE_CHARS)]
Slug = Annotated[str, Field(pattern=SLUG_PATTERN)]
