"""Connecting to Temporal and sending an update, with Temporal's errors turned into refusals (`RequestRefused`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from daedalus.errors import CampaignRefused as CampaignRefused
from daedalus.errors import RequestRefused as RequestRefused
from daedalus.errors import TicketError as TicketError
from daedalus.errors import TrainingRefused as TrainingRefused
from daedalus.errors import UnknownRequest as UnknownRequest
from daedalus.payloads import DATA_CONVERTER


async def connect(
    address: str, namespace: str = "default", *, tls: bool | TLSConfig = False, api_key: str | None = None
) -> Client:
    """A client; `tls` and `api_key` close a production frontend to all but Daedalus's services
    (`TemporalSettings.connection()` builds them from DAEDALUS_TEMPORAL_TLS_* and _API_KEY)."""
    try:
        return await Client.connect(
            address, namespace=namespace, data_converter=DATA_CONVERTER, tls=tls, api_key=api_key
        )
    except RuntimeError as error:
        raise RequestRefused(
            f"cannot reach Temporal at {address} ({error}); start it with `daedalus up`, "
            f"or point DAEDALUS_TEMPORAL_ADDRESS at your cluster"
        ) from error


async def update(
    client: Client,
    workflow_id: str,
    label: str,
    update: Any,
    argument: BaseModel,
    *,
    refused: type[RequestRefused] = TicketError,
) -> Any:
    """Send `update` to the live workflow `workflow_id`; a refusal or a closed workflow raises `refused`, the
    subject's own kind of refusal."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        return await handle.execute_update(update, argument)
    except WorkflowUpdateFailedError as error:
        cause = error.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause or error)
        raise refused(f"{label} refused: {message}") from error
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise refused(f"{label} is not live (no running workflow {workflow_id})") from error
        raise refused(f"{label}: {error.message}") from error
