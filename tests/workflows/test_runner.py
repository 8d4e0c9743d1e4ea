"""The workflow runner answers "no serialization context" only for a converter that would ignore one; Daedalus's
converter is one, and writes what temporalio's pydantic converter writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Self

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from daedalus.decisions.schemas import Decision
from daedalus.payloads import DATA_CONVERTER, SharedPydanticPayloadConverter
from daedalus.worker import workflow_runner
from daedalus.workflows.runner import ContextFreeRunner, ignores_context


class KeyedCodec(PayloadCodec, WithSerializationContext):
    """A codec that would encrypt with a key per workflow: it needs the context."""

    def __init__(self, workflow_id: str = "") -> None:
        self.workflow_id = workflow_id

    def with_context(self, context: SerializationContext) -> Self:
        return type(self)(getattr(context, "workflow_id", ""))

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


KEYED = dataclasses.replace(pydantic_data_converter, payload_codec=KeyedCodec())


def test_daedalus_converter_ignores_context_and_a_keyed_codec_does_not() -> None:
    assert ignores_context(pydantic_data_converter)
    assert ignores_context(DataConverter.default)
    assert not ignores_context(KEYED)


def test_the_runner_refuses_a_converter_that_takes_context() -> None:
    with pytest.raises(ValueError, match="takes no serialization context"):
        ContextFreeRunner(SandboxedWorkflowRunner(), KEYED)


@pytest.mark.parametrize("sandboxed", [True, False])
def test_workers_wrap_the_runner_only_for_a_context_free_converter(sandboxed: bool) -> None:
    temporals = SandboxedWorkflowRunner if sandboxed else UnsandboxedWorkflowRunner
    wrapped = workflow_runner(sandboxed, pydantic_data_converter)
    assert isinstance(wrapped, ContextFreeRunner) and isinstance(wrapped.inner, temporals)
    assert isinstance(workflow_runner(sandboxed, KEYED), temporals)  # the codec gets its contexts


def test_daedalus_converter_writes_the_pydantic_converters_payloads_from_shared_parts() -> None:
    values = [
        Decision(request_id="7-dispatch-1", option="approve", decided_by="wayne"),
        {"n": 1},
        None,
        "text",
    ]
    ours = DATA_CONVERTER.payload_converter.to_payloads(values)
    assert ours == pydantic_data_converter.payload_converter.to_payloads(values)
    assert DATA_CONVERTER.payload_converter.from_payloads(ours, [Decision, dict, type(None), str]) == values
    first, second = SharedPydanticPayloadConverter(), SharedPydanticPayloadConverter()
    assert all(a is b for a, b in zip(first.converters.values(), second.converters.values(), strict=True))
    assert ignores_context(DATA_CONVERTER)
