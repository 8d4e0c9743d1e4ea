"""The training curve carries NVML utilisation beside GPU memory, and older four-column curves still read."""

from __future__ import annotations

from pathlib import Path

from daedalus.training.curve import Sample, append_sample, read_curve


def test_curve_keeps_gpu_memory_and_utilisation(tmp_path: Path) -> None:
    curve = tmp_path / "curve.csv"
    append_sample(curve, Sample(t=1.0, available=100, psi=None, gpu_used=3 * 2**30, gpu_util=42))
    append_sample(curve, Sample(t=2.0, available=90, psi=0.5, gpu_used=None, gpu_util=None))
    with curve.open("a") as handle:
        handle.write("3.000,80,,\n")  # written before utilisation was sampled
        handle.write("4.000,7")  # torn by a kill mid-write
    samples = list(read_curve(curve))
    assert [(s.t, s.gpu_used, s.gpu_util) for s in samples] == [
        (1.0, 3 * 2**30, 42),
        (2.0, None, None),
        (3.0, None, None),
    ]
    assert samples[1].psi == 0.5
