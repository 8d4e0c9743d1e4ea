"""The issue's "valid-looking input wedges a ticket" attacks, each refused when the spec is read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from daedalus.schemas.limits import BRIEF_CHARS, MAX_GATE_SAMPLES, TEMPORAL_PAYLOAD_LIMIT_BYTES
from daedalus.schemas.ticket import CancelRequest, Decision, SpecAmendment, TicketSpec
from daedalus.services import TicketError, load_spec, parse_spec


def gate_ticket(**gate: Any) -> dict[str, Any]:
    return {
        "id": "w1",
        "title": "wedge",
        "host": "local",
        "gates": [
            {"name": "g", "metric": "decode_tps", "threshold": 1.0, "command": "true", **gate},
        ],
    }


def agent_ticket(**fields: Any) -> dict[str, Any]:
    return {
        "id": "w2",
        "title": "wedge",
        "host": "local",
        "engine": {"name": "e", "kind": "repo", "repo": "/tmp/r"},
        "agent": {"name": "scripted", "commands": ["true"]},
        **fields,
    }


@pytest.mark.parametrize("threshold", [".nan", ".inf", "-.inf", "Infinity", "NaN", "1e400"])
def test_a_threshold_that_is_not_a_finite_number_is_refused_in_yaml(tmp_path: Path, threshold: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "id: w1\ntitle: wedge\nhost: local\ngates:\n"
        f"  - {{name: g, metric: decode_tps, threshold: {threshold}, command: 'true'}}\n"
    )
    with pytest.raises(TicketError, match=r"gates\.0\.threshold: .*finite"):
        load_spec(path)


@pytest.mark.parametrize("threshold", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_threshold_that_is_not_a_finite_number_is_refused_in_json(threshold: str) -> None:
    body = json.dumps(gate_ticket()).replace('"threshold": 1.0', f'"threshold": {threshold}')
    with pytest.raises(ValidationError, match="finite"):
        TicketSpec.model_validate_json(body)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (gate_ticket(timeout_s=10**20), "gates.0.timeout_s"),
        (gate_ticket(timeout_s=1e20), "gates.0.timeout_s"),
        (agent_ticket(build={"command": "make", "timeout_s": 10**20}), "build.timeout_s"),
        (agent_ticket(approval={"reminder_interval_s": 10**20}), "approval.reminder_interval_s"),
        (agent_ticket(approval={"reminder_interval_s": 1e20}), "approval.reminder_interval_s"),
    ],
)
def test_a_duration_of_1e20_seconds_is_refused(data: dict[str, Any], where: str) -> None:
    # 10**20 parses as an int and meets the ceiling; 1e20 as a float is past what an int may hold
    with pytest.raises(
        TicketError, match=re.escape(where) + ": .*(less than or equal to 604800|maximum size)"
    ):
        parse_spec(data)


def test_a_one_megabyte_brief_is_refused_at_filing_with_the_limit() -> None:
    with pytest.raises(TicketError, match=rf"spec: String should have at most {BRIEF_CHARS} characters"):
        parse_spec(agent_ticket(spec="x" * 1024 * 1024))


def test_many_children_each_under_the_limits_are_refused_as_a_whole() -> None:
    children = [
        {**agent_ticket(spec="y" * (BRIEF_CHARS - 1)), "id": f"c{i}", "title": f"child {i}"} for i in range(8)
    ]
    with pytest.raises(TicketError, match=r"KiB as JSON, more than the 384 KiB"):
        parse_spec({"id": "u", "title": "umbrella", "host": "local", "children": children})


def test_the_largest_accepted_spec_is_far_below_the_payload_limit() -> None:
    children = [
        {**agent_ticket(spec="y" * (BRIEF_CHARS - 1)), "id": f"c{i}", "title": f"child {i}"} for i in range(5)
    ]
    spec = parse_spec({"id": "u", "title": "umbrella", "host": "local", "children": children})
    assert len(spec.model_dump_json()) < TEMPORAL_PAYLOAD_LIMIT_BYTES / 4


@pytest.mark.parametrize("ticket_id", ["training-drafter", "hunt-drafter-1", "campaign-local-kv-matrix"])
def test_a_reserved_ticket_id_is_refused(ticket_id: str) -> None:
    with pytest.raises(TicketError, match="reserves for the subjects of training runs and campaigns"):
        parse_spec({**agent_ticket(), "id": ticket_id})


def test_a_reserved_id_is_refused_for_a_sub_ticket_too() -> None:
    child = {**agent_ticket(), "id": "training-x"}
    with pytest.raises(TicketError, match="'training-x' starts with 'training-'"):
        parse_spec({"id": "u", "title": "umbrella", "host": "local", "children": [child]})


def test_a_grandchild_may_not_reuse_an_id_of_the_tree() -> None:
    grandchild = {**agent_ticket(), "id": "u"}
    child = {"id": "c", "title": "child", "host": "local", "children": [grandchild]}
    with pytest.raises(
        TicketError, match=r"unique across the ticket and all its sub-tickets; repeated: \['u'\]"
    ):
        parse_spec({"id": "u", "title": "umbrella", "host": "local", "children": [child]})


@pytest.mark.parametrize("name", ["x/../../../escape/pwn", "../pwn", "/etc/passwd", "a b", ".hidden", ""])
def test_a_gate_name_that_is_not_a_slug_is_refused(name: str) -> None:
    with pytest.raises(TicketError, match=r"gates\.0\.name: String should match pattern"):
        parse_spec(gate_ticket(name=name))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Decision(request_id="4-dispatch-1", option="approve", decided_by="wayne", note="n" * 10**6),
        lambda: CancelRequest(requested_by="wayne", reason="r" * 10**6),
        lambda: SpecAmendment(amended_by="wayne", spec="s" * 10**6),
        lambda: SpecAmendment(amended_by="wayne", note="s" * 10**6),
    ],
)
def test_notes_reasons_and_amended_briefs_are_bounded(build: Any) -> None:
    with pytest.raises(ValidationError, match="String should have at most"):
        build()


def test_a_measurement_with_nan_samples_is_not_a_valid_measurement() -> None:
    from daedalus.activities.gates import parse_measurement

    with pytest.raises(ValueError, match="finite"):
        parse_measurement('{"samples": [1.0, NaN, 2.0]}')


def test_a_measurement_with_too_many_samples_is_refused_before_it_is_validated() -> None:
    from daedalus.activities.gates import parse_measurement

    line = json.dumps({"samples": [1.0] * (MAX_GATE_SAMPLES + 1)})
    with pytest.raises(
        ValueError, match=rf"{MAX_GATE_SAMPLES + 1} samples, more than the {MAX_GATE_SAMPLES}"
    ):
        parse_measurement(line)
    assert parse_measurement(json.dumps({"samples": [1.0] * MAX_GATE_SAMPLES})).samples


@pytest.mark.parametrize(
    "watchdog",
    [
        {"checkpoint_grace_s": ".inf"},
        {"term_grace_s": 1e20},
        {"min_available_gib": ".nan"},
        {"report_interval_s": "Infinity"},
        {"slope_window_s": 1e20, "min_fit_span_s": 1e19},
    ],
)
def test_a_training_run_with_an_endless_or_nan_duration_is_refused(watchdog: dict[str, Any]) -> None:
    from daedalus.schemas.training import TrainingRunSpec

    values = {k: float(v.replace(".", "")) if isinstance(v, str) else v for k, v in watchdog.items()}
    run = {"name": "r", "host": "local", "command": ["true"], "checkpoints": {"directory": "/tmp/c"}}
    with pytest.raises(ValidationError, match="watchdog"):
        TrainingRunSpec.model_validate({**run, "watchdog": values})


def test_a_yaml_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nid: b\ntitle: *a11\nhost: local\n")
    with pytest.raises(TicketError, match=r"aliases \(\*a0\) are not allowed in a ticket spec \(line 2\)"):
        load_spec(path)


def test_an_oversized_spec_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("id: b\ntitle: t\nhost: local\n# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(TicketError, match="larger than 768 KiB"):
        load_spec(path)


def test_a_host_name_is_bounded() -> None:
    with pytest.raises(TicketError, match="host: String should match pattern"):
        parse_spec({**gate_ticket(), "host": "h" * 200})
