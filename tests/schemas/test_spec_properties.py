"""Property-based: every spec the schema accepts travels through Temporal, and every one it refuses says why.

Specs are drawn around the edges of each field: finite and non-finite numbers, integers up to 1e20, texts up
to past their limits, names with `/`, `..`, spaces and control characters.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload

from daedalus.payloads import DATA_CONVERTER
from daedalus.schemas.gates import Metric
from daedalus.schemas.limits import BRIEF_CHARS, TEMPORAL_PAYLOAD_LIMIT_BYTES, TITLE_CHARS
from daedalus.schemas.ticket import TicketInput, TicketSpec
from daedalus.services import TicketError, parse_spec

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**21), max_value=10**21),
    st.sampled_from([0, 1, 60, 604_800, 604_801, 1e20, 1e400, float("nan")]),
)
durations = st.one_of(st.integers(min_value=-5, max_value=10**21), st.floats(), st.sampled_from([1, 604_800]))
names = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    st.sampled_from(["x/../../../escape/pwn", "..", "/etc/passwd", "a b", "", "training-x", "a\x00b"]),
    st.text(max_size=30),
)


def sized_text(limit: int) -> st.SearchStrategy[str]:
    """Short texts, and texts right at and just past `limit` (built by repetition: drawing them is slow)."""
    return st.one_of(
        st.text(max_size=40),
        st.builds(lambda c, n: c * n, st.characters(), st.sampled_from([limit - 1, limit, limit + 1])),
    )


gates = st.fixed_dictionaries(
    {
        "name": names,
        "metric": st.sampled_from([m.value for m in Metric]),
        "threshold": numbers,
        "command": st.sampled_from(["true", "echo '{\"samples\": [1]}'"]),
    },
    optional={"timeout_s": durations, "confidence": numbers, "kind": st.sampled_from(["absolute", "ab"])},
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": draw(names),
        "title": draw(sized_text(TITLE_CHARS)),
        "host": draw(st.sampled_from(["local", "mavis", "bad host"])),
        "gates": draw(st.lists(gates, max_size=3)),
    }
    if draw(st.booleans()):
        data["engine"] = {"name": "e", "kind": "repo", "repo": "/tmp/r"}
        data["agent"] = {"name": "scripted", "commands": ["true"]}
        data["spec"] = draw(sized_text(BRIEF_CHARS))
        data["build"] = {"command": "make", "timeout_s": draw(durations)}
        data["approval"] = {"reminder_interval_s": draw(durations)}
        data["max_attempts"] = draw(st.integers(min_value=-1, max_value=12))
        data["budget_usd"] = draw(st.one_of(st.none(), numbers))
    return data


def payload_of(spec: TicketSpec) -> Payload:
    [payload] = DATA_CONVERTER.payload_converter.to_payloads([TicketInput(spec=spec)])
    return payload


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(specs())
def test_every_spec_is_either_accepted_and_travels_or_refused_with_a_reason(data: dict[str, Any]) -> None:
    try:
        spec = TicketSpec.model_validate(data)
    except ValidationError as error:
        assert error.error_count() >= 1
        for problem in error.errors():
            assert problem["msg"], problem
        return
    payload = payload_of(spec)
    assert len(payload.data) < TEMPORAL_PAYLOAD_LIMIT_BYTES / 4
    [back] = DATA_CONVERTER.payload_converter.from_payloads([payload], [TicketInput])
    assert back == TicketInput(spec=spec)
    for gate in spec.gates:
        assert gate.threshold == gate.threshold and abs(gate.threshold) != float("inf")
        assert 0 < gate.timeout_s <= 604_800


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(specs())
def test_filing_either_accepts_or_explains_every_problem_by_field(data: dict[str, Any]) -> None:
    try:
        parse_spec(data)
    except TicketError as error:
        message = str(error)
        assert message.startswith("spec")
        assert "is not a valid ticket spec" in message or "reserves" in message or "must" in message, message


valid_gates = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
        "metric": st.sampled_from([m.value for m in Metric]),
        "threshold": st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False),
        "command": st.sampled_from(["true", "echo '{\"samples\": [1]}'"]),
    },
    optional={"timeout_s": st.integers(min_value=1, max_value=604_800)},
)


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Specs inside every limit: each must be accepted (the refusals above would pass a schema that refused all)."""
    gates_drawn = draw(st.lists(valid_gates, min_size=1, max_size=3, unique_by=lambda g: g["name"]))
    data: dict[str, Any] = {
        "id": draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True).filter(
            lambda s: not s.startswith(("training-", "campaign-", "hunt-")))),
        "title": draw(st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1, max_size=TITLE_CHARS)),
        "host": draw(st.sampled_from(["local", "mavis"])),
        "gates": gates_drawn,
    }  # fmt: skip
    if draw(st.booleans()):
        data["engine"] = {"name": "e", "kind": "repo", "repo": "/tmp/r"}
        data["agent"] = {"name": "scripted", "commands": ["true"]}
        data["spec"] = draw(st.text(max_size=200))
        data["build"] = {"command": "make", "timeout_s": draw(st.integers(min_value=1, max_value=604_800))}
        data["max_attempts"] = draw(st.integers(min_value=1, max_value=10))
    return data


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_every_spec_inside_the_limits_is_accepted_and_travels(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    [back] = DATA_CONVERTER.payload_converter.from_payloads([payload_of(spec)], [TicketInput])
    assert back == TicketInput(spec=spec)
    assert [g.name for g in spec.gates] == [g["name"] for g in data["gates"]]
