"""Questions that belong to no ticket, and standing rulings, on the real dev server and store: a question is
asked, answered through the same routing as any decision (found by its subject in the store), recorded under its
own subject kind, and a ruling it makes refuses a later ticket that contradicts it; a question past its deadline
closes with its recorded outcome; bad input is refused with the reason and nothing is started."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.service import RPCError

from daedalus import services
from daedalus.decisions.questions import QuestionState, QuestionStatus
from daedalus.decisions.rulings import Rule, Ruling, preset_breaks
from daedalus.decisions.schemas import Decision
from daedalus.engines.presets import load_preset
from daedalus.errors import RequestRefused
from daedalus.ids import question_subject_key, question_workflow_id
from daedalus.report import build_report, render_markdown
from daedalus.services import questions
from daedalus.store.database import session_scope
from daedalus.store.tables import DecisionRow
from tests.support import TEST_AUDIT_KEY, running_workers
from tests.ticket_helpers import events, kinds

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "questions"
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


def unique(spec: dict[str, Any], task_queue: str) -> dict[str, Any]:
    return {**spec, "id": f"{spec['id']}-{task_queue[-8:]}"}


async def wait_status(client: Client, question_id: str, done: Any, limit: float = 60) -> QuestionStatus:
    deadline = time.monotonic() + limit
    while True:
        try:
            state = await questions.status(client, question_id)
            if done(state):
                return state
        except RequestRefused:
            pass
        assert time.monotonic() < deadline, f"question {question_id} never got there"
        await asyncio.sleep(0.2)


def ticket(ticket_id: str, preset: str, baseline: str | None = None) -> dict[str, Any]:
    command = f"daedalus engine measure decode_tps --preset {preset} --model /models/target --users 1"
    if baseline is not None:
        command += f" --baseline-preset {baseline}"
    return {
        "id": ticket_id,
        "title": "a vLLM measurement",
        "kind": "measurement",
        "host": "local",
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 1, "command": command}],
    }


# ---- the rule language ----------------------------------------------------------------------------------


def test_rule_is_checked_where_it_enters() -> None:
    with pytest.raises(ValueError, match="not a plain field of a vllm preset; choose one of"):
        Rule.model_validate({"effect": "forbid", "engine": "vllm", "field": "kv_dtype", "values": ["fp8"]})
    with pytest.raises(ValueError, match="'tbq' is not a vllm kv_cache_dtype; known: auto"):
        Rule.model_validate(
            {"effect": "require", "engine": "vllm", "field": "kv_cache_dtype", "values": ["tbq"]}
        )
    with pytest.raises(ValueError, match=r"cannot be a llama\.cpp preset.s context"):
        Rule.model_validate(
            {"effect": "forbid", "engine": "llama.cpp", "field": "context", "values": ["big"]}
        )
    with pytest.raises(ValueError, match="not a plain field"):  # a mapping is no field a rule can name
        Rule.model_validate({"effect": "forbid", "engine": "vllm", "field": "env", "values": ["x"]})
    with pytest.raises(ValueError, match="repeated"):
        Rule.model_validate({"effect": "forbid", "engine": "vllm", "field": "name", "values": ["a", "a"]})
    with pytest.raises(ValueError, match="effect"):
        Rule.model_validate({"effect": "prefer", "engine": "vllm", "field": "name", "values": ["a"]})


def test_ruling_names_itself_when_a_preset_breaks_it() -> None:
    tbq = load_question_spec("kv-always-tbq.yaml").rule
    assert tbq is not None
    ruling = Ruling(
        id="kv-always-tbq",
        statement="KV is always TBQ",
        rule=tbq,
        ruled_by="wayne",
        ruled_at=datetime(2026, 7, 12, 9, 30, tzinfo=UTC),
    )
    fp16, pool = load_preset("vllm-fp16-baseline"), load_preset("vllm-pool-tbq4nc")
    (why,) = preset_breaks([ruling], fp16)
    assert "preset vllm-fp16-baseline has kv_cache_dtype 'auto'" in why
    assert "ruling kv-always-tbq ('KV is always TBQ', wayne, 2026-07-12 09:30 UTC)" in why
    assert preset_breaks([ruling], fp16, baseline=True) == []  # fp16 only as a baseline
    assert preset_breaks([ruling], pool) == []
    assert preset_breaks([ruling], load_preset("local-f16")) == []  # a llama.cpp preset: not its engine
    forbid = Rule.model_validate(
        {"effect": "forbid", "engine": "vllm", "field": "name", "values": ["vllm-pool-tbq4nc"]}
    )
    assert forbid.broken_by(pool) == "preset vllm-pool-tbq4nc has name 'vllm-pool-tbq4nc'"


def load_question_spec(name: str) -> Any:
    return questions.load_question(EXAMPLES / name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"options": ["yes"]}, "options: List should have at least 2 items"),
        ({"options": ["Yes", "no"]}, "are not option names"),
        ({"deadline": "2026-07-19T17:00:00"}, "has no timezone"),
        ({"deadline": "+7w"}, "is not a relative deadline"),
        ({"on_deadline": "maybe"}, "on_deadline 'maybe' is not one of the options"),
        ({"enacts": None}, "rule and enacts go together"),
        ({"on_deadline": "rule"}, "would enact the rule without anyone ruling"),
        ({"rule": {"effect": "require", "engine": "vllm", "field": "kv_cache_dtype", "values": ["tbq"]}},
         "rule: Value error, value 'tbq' is not a vllm kv_cache_dtype"),
    ],
)  # fmt: skip
def test_bad_questions_are_refused_with_the_field(change: dict[str, Any], message: str) -> None:
    import yaml

    data = yaml.safe_load((EXAMPLES / "kv-always-tbq.yaml").read_text())
    with pytest.raises(RequestRefused, match=r"not a valid question|not a relative") as refused:
        questions.parse_question({**data, **change}, "q.yaml")
    assert message.removeprefix("rule: Value error, ") in str(refused.value), str(refused.value)


def test_every_example_question_loads() -> None:
    loaded = [questions.load_question(path) for path in sorted(EXAMPLES.glob("*.yaml"))]
    assert {q.id for q in loaded} == {
        "dense-models",
        "forbid-fp8-kv",
        "fork-backup-remote",
        "kv-always-tbq",
        "helper-agents",
        "gb10-swapoff",
        "pool-vs-comfyui",
    }
    assert all(q.deadline > datetime.now(UTC) for q in loaded)


# ---- on the dev server and the store -----------------------------------------------------------------------


async def test_a_question_answered_makes_a_ruling_that_refuses_a_later_ticket(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    import yaml

    data = unique(yaml.safe_load((EXAMPLES / "kv-always-tbq.yaml").read_text()), task_queue)
    spec = questions.parse_question({**data, "deciders": ["wayne"]}, "kv-always-tbq.yaml")
    before = questions.read_rulings(store_engine)
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, "local"):
        await questions.ask(temporal_client, spec, queue=task_queue, asked_by="lead", store=store_engine)
        state = await wait_status(temporal_client, spec.id, lambda s: s.pending_decision is not None)
        request = state.pending_decision
        assert request is not None and request.id == f"{spec.id}-question-1"
        assert request.options == ["rule", "decline"] and request.allowed == ["wayne"]
        assert any("makes a standing ruling" in line for line in request.evidence)

        # the same routing as every decision: the store says whose request it is
        with pytest.raises(RequestRefused, match=r"lead may not decide question"):
            await services.decide(
                temporal_client,
                Decision(request_id=request.id, option="rule", decided_by="lead", channel="api"),
                store=store_engine,
            )
        with pytest.raises(
            RequestRefused, match=r"unknown option 'maybe'.*choose one of \['rule', 'decline'\]"
        ):
            await services.decide(
                temporal_client,
                Decision(request_id=request.id, option="maybe", decided_by="wayne"),
                store=store_engine,
            )
        await services.decide(
            temporal_client,
            Decision(
                request_id=request.id, option="rule", decided_by="wayne", note="always TBQ", channel="slack"
            ),
            store=store_engine,
        )
        done = await wait_status(temporal_client, spec.id, lambda s: s.status.is_closed)
        assert done.status is QuestionState.RULED and done.outcome == "rule" and done.decided_by == "wayne"
        assert done.ruling is not None and done.ruling.ruled_by == "wayne"
        # its trail is a hash chain like a ticket's, held against the workflow's own count
        from daedalus.services import audit

        held = await audit.verify(
            store_engine,
            TEST_AUDIT_KEY,
            temporal_client,
            [question_subject_key(spec.id)],
            control_queue=task_queue,
        )
        assert (held.breaks, held.anchored, held.events) == ([], 1, 5), held
        # a second answer is refused: the question is closed
        with pytest.raises(RequestRefused, match=r"not live|not waiting"):
            await services.decide(
                temporal_client,
                Decision(request_id=request.id, option="decline", decided_by="wayne"),
                store=store_engine,
            )

    trail = events(store_engine, question_subject_key(spec.id))
    assert kinds(trail) == ["filed", "decision_requested", "decided", "ruled", "closed"]
    assert all(row.workflow_id == question_workflow_id(spec.id) for row in trail)
    assert '"kind":"question"' in trail[1].detail["subject"]
    assert trail[3].actor == "wayne"
    with session_scope(store_engine) as session:
        row = session.get(DecisionRow, request.id)
        assert row is not None and row.kind == "question" and row.option == "rule" and row.channel == "slack"
    rulings = questions.read_rulings(store_engine)
    assert len(rulings) == len(before) + 1
    ruling = rulings[-1]
    assert ruling.id == spec.id and ruling.ruled_by == "wayne" and ruling.rule == spec.rule

    # a ticket whose preset contradicts it is refused at filing, naming the ruling; nothing is started
    refused = services.parse_spec(ticket(f"fp16-{task_queue[-8:]}", "vllm-fp16-baseline"))
    with pytest.raises(
        RequestRefused, match=rf"contradicts standing rulings: .*ruling {spec.id} \('KV quant"
    ):
        await services.file_ticket(
            temporal_client, refused, queue=task_queue, filed_by="lead", store=store_engine
        )
    with pytest.raises(RPCError):
        await temporal_client.get_workflow_handle(f"ticket-{refused.id}").describe()
    # fp16 as the baseline of a TBQ preset obeys it ("fp16 only as a baseline")
    obeys = services.parse_spec(ticket("ok", "vllm-pool-tbq4nc", baseline="vllm-fp16-baseline"))
    assert questions.ticket_breaks(obeys, [ruling]) == []

    # the report: the question done as ruled, and the ruling with who ruled and when
    with session_scope(store_engine) as session:
        report = build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1))
    text = render_markdown(report)
    assert "## Questions for" in text and "## Standing rulings" in text
    assert f"{spec.question} — done: ruled **rule** by wayne on " in text
    assert (
        f"| {spec.statement} | a vllm preset's kv_cache_dtype must be one of [tq_4bit_nc, tq_3bit_nc, "
        in text
    )
    assert f"| wayne | {ruling.ruled_at:%Y-%m-%d %H:%M} |" in text
    assert request.id not in text.split("## Decisions")[1].split("## Questions")[0]  # not twice


async def test_a_question_past_its_deadline_closes_with_its_recorded_outcome(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    import yaml

    data = unique(yaml.safe_load((EXAMPLES / "dense-models.yaml").read_text()), task_queue)
    spec = questions.parse_question({**data, "deadline": "+6s", "deciders": ["wayne"]})
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "local"):
        await questions.ask(temporal_client, spec, queue=task_queue, asked_by="lead", store=sqlite_engine)
        state = await wait_status(temporal_client, spec.id, lambda s: s.pending_decision is not None)
        assert state.status is QuestionState.OPEN
        done = await wait_status(temporal_client, spec.id, lambda s: s.status.is_closed, limit=40)
        assert (
            done.status is QuestionState.EXPIRED
            and done.outcome == "screen-first"
            and done.decided_by is None
        )
        # the same id is never asked twice
        with pytest.raises(RequestRefused, match="was asked before"):
            again = questions.parse_question({**data, "deciders": ["wayne"]})
            await questions.ask(
                temporal_client, again, queue=task_queue, asked_by="lead", store=sqlite_engine
            )
    trail = events(sqlite_engine, question_subject_key(spec.id))
    assert kinds(trail) == ["filed", "decision_requested", "closed"]
    assert trail[-1].detail == {"expired": "true", "outcome": "screen-first"}
    assert "recorded outcome 'screen-first'" in trail[-1].summary
    with session_scope(sqlite_engine) as session:
        rows = questions.question_rows(session)
        assert [r.request_id for r in rows] == [f"{spec.id}-question-1"]
        assert rows[0].decided_at is not None and rows[0].option is None  # withdrawn, not answered
        assert questions.question_rows(session, pending=True) == []
        text = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    assert "## Questions for the deciders" in text and "- nothing waits" in text
    assert f"- {spec.question} — done: expired at the deadline, recorded **screen-first** on " in text
    assert "## Standing rulings" not in text  # this store holds none


async def test_a_question_is_withdrawn_by_its_asker_and_refused_to_others(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    import yaml

    data = unique(yaml.safe_load((EXAMPLES / "fork-backup.yaml").read_text()), task_queue)
    spec = questions.parse_question(data)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "local"):
        await questions.ask(temporal_client, spec, queue=task_queue, asked_by="lead", store=sqlite_engine)
        await wait_status(temporal_client, spec.id, lambda s: s.pending_decision is not None)
        from daedalus.decisions.questions import WithdrawQuestion

        with pytest.raises(RequestRefused, match=r"mallory may not withdraw question .*\['lead', 'wayne'\]"):
            await questions.withdraw(
                temporal_client, spec.id, WithdrawQuestion(requested_by="mallory", reason="no")
            )
        await questions.withdraw(
            temporal_client, spec.id, WithdrawQuestion(requested_by="lead", reason="asked in the wrong place")
        )
        done = await wait_status(temporal_client, spec.id, lambda s: s.status.is_closed)
        assert done.status is QuestionState.WITHDRAWN
    assert events(sqlite_engine, question_subject_key(spec.id))[-1].summary == (
        "withdrawn by lead: asked in the wrong place"
    )
    with session_scope(sqlite_engine) as session:
        text = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    assert f"- {spec.question} — done: withdrawn by lead: asked in the wrong place" in text


async def test_bad_asks_start_nothing(
    temporal_client: Client, sqlite_engine: Engine, task_queue: str
) -> None:
    from daedalus.decisions.policy import load_policy

    policy = load_policy(Path(__file__).resolve().parents[2] / "examples" / "policy.yaml")
    base = {"id": f"bad-{task_queue[-8:]}", "question": "?", "options": ["a", "b"]}
    past = questions.parse_question({**base, "deadline": datetime.now(UTC) - timedelta(minutes=1)})
    with pytest.raises(RequestRefused, match="has passed"):
        await questions.ask(temporal_client, past, queue=task_queue, asked_by="lead", policy=policy)
    far = questions.parse_question({**base, "deadline": "+200d"})
    with pytest.raises(RequestRefused, match="more than 90 days away"):
        await questions.ask(temporal_client, far, queue=task_queue, asked_by="lead", policy=policy)
    soon = {**base, "deadline": "+1d"}
    with pytest.raises(RequestRefused, match=r"deciders names \['lead'\], who are not deciders"):
        spec = questions.parse_question({**soon, "deciders": ["lead"]})
        await questions.ask(temporal_client, spec, queue=task_queue, asked_by="lead", policy=policy)
    with pytest.raises(RequestRefused, match="mallory may not ask questions"):
        await questions.ask(
            temporal_client,
            questions.parse_question(soon),
            queue=task_queue,
            asked_by="mallory",
            policy=policy,
        )
    with pytest.raises(RequestRefused, match="names no deciders and the server has no policy"):
        await questions.ask(
            temporal_client, questions.parse_question(soon), queue=task_queue, asked_by="lead"
        )
    with pytest.raises(RPCError):
        await temporal_client.get_workflow_handle(question_workflow_id(base["id"])).describe()


# ---- a campaign never proposes what a ruling forbids --------------------------------------------------------


def q8_0_ruling() -> Ruling:
    rule = Rule.model_validate(
        {"effect": "forbid", "engine": "llama.cpp", "field": "cache_type_k", "values": ["q8_0"]}
    )
    return Ruling(
        id="no-q8", statement="no q8_0 K cache", rule=rule, ruled_by="wayne", ruled_at=datetime.now(UTC)
    )


async def test_a_campaign_measures_a_preset_a_ruling_forbids_and_never_proposes_it(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    from temporalio.worker import Worker

    from daedalus.campaigns.spec import load_campaign
    from daedalus.ids import host_queue
    from daedalus.schemas.campaigns import CampaignInput, campaign_workflow_id
    from daedalus.workflows.campaign import CampaignWorkflow
    from tests.campaigns.test_campaign_workflow import scripted_cell, wait_status

    host = f"hq-{task_queue[-8:]}"
    spec = load_campaign(
        Path(__file__).resolve().parents[2] / "examples" / "campaigns" / "local-kv-matrix.yaml"
    )
    spec = spec.model_copy(update={"host": host, "id": f"cq-{task_queue[-8:]}"})
    ruled_out = questions.ruled_out_presets(spec, [q8_0_ruling()])
    assert ruled_out and all(name.startswith("q8_0-") for name in ruled_out)
    assert all("ruling no-q8 ('no q8_0 K cache', wayne" in why for why in ruled_out.values())
    assert questions.ruled_out_presets(spec, []) == {}
    async with (
        running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "elsewhere"),
        Worker(temporal_client, task_queue=host_queue(host), activities=[scripted_cell]),
    ):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue, filed_by="lead", ruled_out=ruled_out),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        status = await wait_status(handle, "awaiting_decision")
        await handle.terminate("test done")
    # without the ruling the smaller q8_0 KV wins (test_campaign_workflow); with it, f16 is proposed
    assert status.proposal is not None and status.proposal.preset is not None
    assert status.proposal.preset.startswith("f16-"), status.proposal.reason
    assert "ruled out by standing rulings: q8_0-" in status.proposal.reason
    assert status.cells_done == status.cells_total  # the forbidden presets were measured all the same


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("question-*.json")), ids=lambda p: p.stem)
async def test_stored_question_histories_replay(path: Path) -> None:
    """A question recorded asking, answered with its rule and ruled: later code must replay it."""
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from daedalus.payloads import DATA_CONVERTER
    from daedalus.workflows.question import QuestionWorkflow
    from tests.replay_split import replay_split_too

    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replay_split_too(Replayer(workflows=[QuestionWorkflow], data_converter=DATA_CONVERTER), history)


async def test_a_later_ruling_lifts_an_earlier_one(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    import yaml

    data = unique(yaml.safe_load((EXAMPLES / "forbid-fp8.yaml").read_text()), task_queue)
    first = questions.parse_question({**data, "deciders": ["wayne"]})
    lift = questions.parse_question(
        {
            "id": f"lift-{task_queue[-8:]}",
            "question": "Lift the fp8 ban now that the kernel is fixed?",
            "options": ["lift", "keep"],
            "deadline": "+1d",
            "deciders": ["wayne"],
            "revokes": [first.id],
            "enacts": "lift",
        }
    )
    refused = questions.parse_question(
        {**lift.model_dump(mode="json"), "id": f"bad-{task_queue[-8:]}", "revokes": ["nope"]}
    )

    async def answer(spec: Any, option: str) -> QuestionStatus:
        await questions.ask(temporal_client, spec, queue=task_queue, asked_by="lead", store=sqlite_engine)
        state = await wait_status(temporal_client, spec.id, lambda s: s.pending_decision is not None)
        assert state.pending_decision is not None
        await services.decide(
            temporal_client,
            Decision(request_id=state.pending_decision.id, option=option, decided_by="wayne"),
            store=sqlite_engine,
        )
        return await wait_status(temporal_client, spec.id, lambda s: s.status.is_closed)

    fp8 = services.parse_spec(ticket("fp8", f"{tmp_path}/fp8.yaml"))
    (tmp_path / "fp8.yaml").write_text(
        yaml.safe_dump({"engine": "vllm", "name": "fp8", "max_model_len": 4096, "kv_cache_dtype": "fp8"})
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "local"):
        assert (await answer(first, "rule")).status is QuestionState.RULED
        assert [r.id for r in questions.read_rulings(sqlite_engine)] == [first.id]
        assert questions.ticket_breaks(fp8, questions.read_rulings(sqlite_engine))
        with pytest.raises(RequestRefused, match=r"revokes \['nope'\], which are not standing rulings"):
            await questions.ask(
                temporal_client, refused, queue=task_queue, asked_by="lead", store=sqlite_engine
            )
        lifted = await answer(lift, "lift")
    assert (
        lifted.status is QuestionState.RULED
        and lifted.ruling is not None
        and lifted.ruling.revokes == [first.id]
    )
    assert questions.read_rulings(sqlite_engine) == []  # the ban is lifted, and the lift is no rule itself
    assert questions.ticket_breaks(fp8, questions.read_rulings(sqlite_engine)) == []
    with session_scope(sqlite_engine) as session:
        text = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    assert f"{lift.question} — done: ruled **lift** by wayne" in text
    assert "## Standing rulings" not in text
