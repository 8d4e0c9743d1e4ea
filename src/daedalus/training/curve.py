"""The memory curve: one CSV line per sample in the incarnation's `curve.csv`, read back by a re-attached
watchdog (its window) and by the report (the whole run)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CURVE_FILE = "curve.csv"
CURVE_LINE_BYTES = 64
"""A curve line is at most ~55 bytes (`t,available,psi,gpu_used,gpu_util`)."""


@dataclass(frozen=True)
class Sample:
    t: float
    available: int
    psi: float | None
    gpu_used: int | None
    gpu_util: int | None = None
    """NVML utilisation %, summed over the host's GPUs' readings divided by their count."""


def append_sample(path: Path, sample: Sample) -> None:
    with path.open("a") as handle:
        psi = "" if sample.psi is None else f"{sample.psi:.2f}"
        gpu = "" if sample.gpu_used is None else str(sample.gpu_used)
        util = "" if sample.gpu_util is None else str(sample.gpu_util)
        handle.write(f"{sample.t:.3f},{sample.available},{psi},{gpu},{util}\n")


def read_curve(path: Path, tail_bytes: int | None = None) -> Iterator[Sample]:
    """The samples on disk; with `tail_bytes`, only those in the file's last that many bytes (a long run's curve
    grows by a line a second: a re-attached watchdog reads its window, not its days)."""
    try:
        handle = path.open()
    except OSError:
        return
    with handle:
        if tail_bytes is not None:
            size = handle.seek(0, os.SEEK_END)
            if size > tail_bytes:
                handle.seek(size - tail_bytes)
                handle.readline()  # the line the seek landed in
            else:
                handle.seek(0)
        for row in csv.reader(handle):
            if len(row) not in (4, 5):  # 4: curves written before GPU utilisation was sampled
                continue  # a line torn by a kill mid-write
            try:
                yield Sample(
                    float(row[0]),
                    int(row[1]),
                    float(row[2]) if row[2] else None,
                    int(row[3]) if row[3] else None,
                    int(row[4]) if len(row) == 5 and row[4] else None,
                )
            except ValueError:
                continue
