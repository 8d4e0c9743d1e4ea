"""Training-run activities; both run on the host's task queue (`host-<name>`), next to the trainer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from daedalus.activities.refs import SUPERVISE_TRAINING, TRAINING_HOST_REPORT
from daedalus.engines.host_report import host_report
from daedalus.engines.watchdog import supervise_segment
from daedalus.errors import maps_errors
from daedalus.schemas.training import HostReport, HostReportInput, SegmentReport, SuperviseInput


class TrainingActivities:
    """Holds the host's artifact and state roots, so that tests (and odd hosts) can put them anywhere."""

    def __init__(self, artifact_dir: Path, state_dir: Path | None = None):
        self.artifact_dir = artifact_dir
        self.state_dir = state_dir or artifact_dir / "training-state"

    @activity.defn(name=SUPERVISE_TRAINING.name)
    @maps_errors
    async def supervise_training(self, inp: SuperviseInput) -> SegmentReport:
        """Start or re-attach to the incarnation, watch it for one report interval, report what it saw."""
        details = activity.info().heartbeat_details
        resume = details[0] if details and isinstance(details[0], dict) else None
        return await supervise_segment(
            inp,
            state_root=inp.spec.state_dir or self.state_dir,
            artifact_root=inp.spec.artifact_dir or self.artifact_dir,
            heartbeat=lambda d: activity.heartbeat(d),
            resume=resume,
        )

    @activity.defn(name=TRAINING_HOST_REPORT.name)
    @maps_errors
    async def training_host_report(self, inp: HostReportInput) -> HostReport:
        """The host's invisible players (earlyoom, systemd-oomd, swapoff crons) and its swap."""
        return await asyncio.to_thread(host_report, inp)
