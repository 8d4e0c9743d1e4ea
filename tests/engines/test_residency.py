"""A/B residency follows the presets: concurrent only when both say their servers fit together."""

from daedalus.engines.measure import residency
from daedalus.engines.presets import load_preset, parse_preset
from daedalus.schemas.engines import ABResidency


def test_cpu_llama_presets_share_the_host_gpu_ones_and_vllm_alternate() -> None:
    f16, q8 = load_preset("local-f16"), load_preset("local-q8_0")
    assert residency(f16, q8) is ABResidency.CONCURRENT
    gpu = parse_preset({"engine": "llama.cpp", "name": "gpu-f16", "n_gpu_layers": 99})
    assert residency(gpu, f16) is ABResidency.ALTERNATE
    mtp2, ar = load_preset("vllm-single-user-mtp2"), load_preset("vllm-fp16-baseline")
    assert residency(mtp2, ar) is ABResidency.ALTERNATE  # the seed's TP4 pair at 0.9 each cannot both fit
    small = parse_preset({"engine": "vllm", "name": "a", "max_model_len": 4096, "gpu_memory_utilization": 0.4,
                          "ab_residency": "concurrent"})  # fmt: skip
    other = small.model_copy(update={"name": "b"})
    assert residency(small, other) is ABResidency.CONCURRENT
    assert residency(small, ar) is ABResidency.ALTERNATE, "one side saying 'fits' is not enough"
