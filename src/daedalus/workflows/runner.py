"""The workflow runner: Temporal's (sandboxed or not), minus a per-payload cost Daedalus's converter never uses.

temporalio asks the workflow instance for a serialization context for every payload it decodes or encodes, six
passes per activation round trip, so that a converter or codec that takes context (encryption keyed by workflow,
say) gets it. Under the sandbox each ask is an `exec` of a code string with the sandbox's import hooks applied:
in a burst of decisions with 1,000 parked tickets that was 28% of the control worker's Python time (py-spy
`--gil`), more than the workflows' own code. Daedalus's converter (pydantic JSON, no codec, no external storage)
takes no context, which `ignores_context` checks against the converter itself; for such a converter this runner
answers "no context" outside the sandbox, and the payloads convert as they would with one. Workflow code still
runs in the wrapped runner: the sandbox's determinism checks are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import temporalio.bridge.proto.workflow_activation
import temporalio.bridge.proto.workflow_completion
import temporalio.workflow
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    SerializationContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner


def ignores_context(converter: DataConverter) -> bool:
    """Whether `converter` converts every payload the same whatever the serialization context (and keeps nothing
    in external storage, whose references are addressed by that context)."""
    if converter.external_storage is not None:
        return False
    probes: Sequence[SerializationContext] = (
        WorkflowSerializationContext(namespace="default", workflow_id="probe"),
        ActivitySerializationContext(
            namespace="default",
            activity_id="1",
            workflow_id="probe",
            workflow_type="Probe",
            activity_type="probe",
            activity_task_queue="probe",
            is_local=True,
        ),
    )
    return all(converter.with_context(context) is converter for context in probes)


class ContextFreeRunner(WorkflowRunner):
    """Runs workflows in `inner`; answers the converter's context questions itself (see the module docstring).
    Only for a converter that `ignores_context`: the constructor refuses any other."""

    def __init__(self, inner: WorkflowRunner, converter: DataConverter) -> None:
        if not ignores_context(converter):
            raise ValueError(
                "ContextFreeRunner needs a data converter that takes no serialization context and no external "
                "storage; run workflows in Temporal's own runner instead"
            )
        self.inner = inner

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _ContextFreeInstance(self.inner.create_instance(det), det.info)

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]]) -> None:
        self.inner.set_worker_level_failure_exception_types(types)


class _ContextFreeInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, info: temporalio.workflow.Info) -> None:
        self.inner = inner
        self.store_context = StorageDriverStoreContext(
            target=StorageDriverWorkflowInfo(
                id=info.workflow_id, run_id=info.run_id, type=info.workflow_type, namespace=info.namespace
            )
        )

    def activate(
        self, act: temporalio.bridge.proto.workflow_activation.WorkflowActivation
    ) -> temporalio.bridge.proto.workflow_completion.WorkflowActivationCompletion:
        return self.inner.activate(act)

    def get_serialization_context(self, command_info: object) -> SerializationContext | None:
        return None  # the converter ignores it: payloads convert as with any context

    def get_external_store_context(self, command_info: object) -> StorageDriverStoreContext:
        return self.store_context  # never used to store: the converter keeps nothing externally

    def get_info(self) -> temporalio.workflow.Info:
        return self.inner.get_info()

    def get_thread_id(self) -> int | None:
        return self.inner.get_thread_id()
