"""Pure functions over recorded engine output and generated text."""

import pytest

from daedalus.engines.llama_cpp import parse_kv_cache_log
from daedalus.engines.measure import METRIC_METHODS, NEEDS_BASELINE, RECIPES, check_metric
from daedalus.engines.quality import garbage, parse_perplexity
from daedalus.errors import EngineError, UnsupportedMetric
from daedalus.schemas.engines import GarbageKind
from daedalus.schemas.gates import Metric

LLAMA_LOG = """\
llama_kv_cache:        CPU KV buffer size =     4.00 MiB
llama_kv_cache: size =    4.00 MiB (  2048 cells,   2 layers,  1/1 seqs), K (f16):    2.00 MiB, V (f16):    2.00 MiB
llama_kv_cache: size =    2.12 MiB (  2048 cells,   2 layers,  1/1 seqs), K (q8_0):    1.06 MiB, V (q8_0):    1.06 MiB
"""


def test_llama_kv_cache_lines() -> None:
    target, draft = parse_kv_cache_log(LLAMA_LOG)
    assert (target.mib, target.cells, target.layers, target.k_type) == (4.0, 2048, 2, "f16")
    assert (draft.mib, draft.v_type) == (2.12, "q8_0")


def test_perplexity_final_estimate() -> None:
    assert parse_perplexity("[1]6.1,[2]6.6,\nFinal estimate: PPL = 6.6506 +/- 0.09000\n") == (6.6506, 0.09)
    with pytest.raises(EngineError, match="Final estimate"):
        parse_perplexity("llama_perplexity: tokenizing the input ..")


def test_garbage_detectors_name_what_went_wrong() -> None:
    def kinds(text: str, **kw: int) -> set[GarbageKind]:
        return {f.kind for f in garbage(text, **kw)}

    assert kinds("The capital of France is Paris, a city on the Seine with many museums.") == set()
    assert GarbageKind.DIGIT_SOUP in kinds("7 3 9 1 0 4 4 2 8 8 1 2 3 . 9 9 0 1")
    assert GarbageKind.REPETITION in kinds("the cat sat " * 12)
    assert GarbageKind.FRAGMENTS in kinds("a b cd e f gh i j k lm n o")
    assert kinds("The capital of France", requested_tokens=64, completion_tokens=5) == {
        GarbageKind.DROPPED_TAIL
    }


def test_metrics_the_engine_cannot_produce_are_rejected() -> None:
    with pytest.raises(UnsupportedMetric, match="tests_passed comes from the ticket's test command"):
        check_metric(Metric.TESTS_PASSED)
    with pytest.raises(UnsupportedMetric, match="--baseline-preset"):
        check_metric(Metric.COMPRESSION)
    check_metric(Metric.DECODE_TPS)


def test_every_metric_has_one_recipe() -> None:
    """A new Metric is one entry in RECIPES: its method, what it needs, how it runs (issue 24 item 6)."""
    assert set(RECIPES) == set(Metric), set(Metric) - set(RECIPES)
    for metric, recipe in RECIPES.items():
        assert recipe.method, metric
        if recipe.run is None:
            assert recipe.not_measured, (
                f"{metric.value}: a metric no engine measures says where it comes from"
            )
        else:
            assert metric in METRIC_METHODS
    assert set(NEEDS_BASELINE) == {Metric.COMPRESSION, Metric.TEMP0_IDENTITY, Metric.PPL_DELTA_PCT}
