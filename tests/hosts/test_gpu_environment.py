"""A leased step's GPU environment is built one way (`gpu_environment`), whichever step runs on the GPUs."""

from __future__ import annotations

from daedalus.schemas.gates import LeaseRecord, gpu_environment


def test_a_command_sees_only_its_gpus_and_can_name_its_lease() -> None:
    assert gpu_environment([1, 3], "ticket-4/abcd/gate") == {
        "CUDA_VISIBLE_DEVICES": "1,3",
        "DAEDALUS_LEASE_ID": "ticket-4/abcd/gate",
        "DAEDALUS_LEASE_GPUS": "1,3",
    }
    assert gpu_environment([0]) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert gpu_environment([]) == {"CUDA_VISIBLE_DEVICES": ""}  # no GPU at all, never "every GPU"


def test_a_lease_record_gives_the_same_environment() -> None:
    record = LeaseRecord(lease_id="campaign-x/cell", host="mavis", gpus=[2, 0])
    assert record.environment() == gpu_environment([2, 0], "campaign-x/cell")
    assert record.environment()["CUDA_VISIBLE_DEVICES"] == "2,0"  # the keeper's order, not re-sorted
