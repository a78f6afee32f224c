"""The autotune selections a static-engine result records (specbench/run/kernel_choices.py)."""

from __future__ import annotations

import math
import pytest
import torch

from specbench.run import kernel_choices


class _Node:
    def __init__(self, *size):
        self.size = size

    def get_size(self):
        return list(self.size)


class _Choice:
    """Inductor's ChoiceCaller as the hook sees it: a name and a description, hashed by identity."""

    def __init__(self, name, description=""):
        self.name, self.description = name, description


_choice = _Choice


@pytest.fixture(autouse=True)
def _fresh():
    kernel_choices.clear()
    yield
    kernel_choices.clear()


def test_the_fastest_finite_choice_is_recorded_with_its_runner_up():
    aten, fast, broken = _choice("mm"), _choice("triton_mm_3", "BLOCK_M=16, BLOCK_N=64, num_warps=4"), _choice("triton_mm_9")
    kernel_choices._record({aten: 0.020, fast: 0.0125, broken: math.inf}, "mm", [_Node(1, 4096), _Node(4096, 11008)],
                           [aten, fast, broken], None, {})
    (record,) = kernel_choices.selections()
    assert record == {"op": "mm", "input_shapes": [[1, 4096], [4096, 11008]],
                      "chosen": "triton_mm_3 (BLOCK_M=16, BLOCK_N=64, num_warps=4)", "chosen_ms": 0.0125,
                      "runner_up": "mm", "runner_up_ms": 0.02, "candidates": 3}


def test_one_record_per_op_and_shape_the_latest_kept():
    a, b = _choice("mm"), _choice("triton_mm_1")
    kernel_choices._record({a: 0.02, b: 0.01}, "mm", [_Node(1, 64), _Node(64, 128)], [a, b], None, {})
    kernel_choices._record({a: 0.01, b: 0.02}, "mm", [_Node(1, 64), _Node(64, 128)], [a, b], None, {})
    kernel_choices._record({a: 0.01}, "mm", [_Node(1, 64), _Node(64, 256)], [a], None, {})
    records = kernel_choices.selections()
    assert [r["input_shapes"][1] for r in records] == [[64, 128], [64, 256]]
    assert records[0]["chosen"] == "mm" and records[1]["runner_up"] is None


def test_a_case_s_record_keeps_only_the_selections_of_its_own_weights(monkeypatch):
    """describe(modules) keeps the selections with an input shaped like one of the modules' weights: another model's,
    made earlier in the process, are left out (the matmul kernels are filtered the same way: test_compiled_matmuls)."""
    a = _choice("mm")
    kernel_choices._record({a: 0.02}, "mm", [_Node(1, 64), _Node(128, 64)], [a], None, {})  # this case's (128, 64)
    kernel_choices._record({a: 0.02}, "mm", [_Node(1, 32), _Node(96, 32)], [a], None, {})  # another model's
    monkeypatch.setattr(kernel_choices, "_INSTALLED", True)
    monkeypatch.setattr(kernel_choices, "compiled_matmuls", lambda shapes=None: [])
    ours = torch.nn.Linear(64, 128, bias=False)
    assert [r["input_shapes"] for r in kernel_choices.describe(ours)["selections"]] == [[[1, 64], [128, 64]]]
    assert len(kernel_choices.describe()["selections"]) == 2  # no modules: the whole process's


def test_a_selection_whose_every_choice_failed_is_not_recorded():
    kernel_choices._record({_choice("mm"): math.inf}, "mm", [_Node(1, 8)], [], None, {})
    assert kernel_choices.selections() == []


def test_install_registers_with_inductors_algorithm_selection(monkeypatch):
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    monkeypatch.setattr(kernel_choices, "_INSTALLED", False)
    cache = get_algorithm_selector_cache()
    before = list(cache.feedback_saver_fns)
    try:
        kernel_choices.install()
        kernel_choices.install()  # twice: registered once
        assert cache.feedback_saver_fns.count(kernel_choices._record) == before.count(kernel_choices._record) + 1
        described = kernel_choices.describe()
        assert described["selections"] == [] and set(described["fx_graph_cache"]) == {"hits", "misses"}
        assert isinstance(described["compiled_matmuls"], list)
    finally:
        cache.feedback_saver_fns[:] = before


def test_the_schedulers_deferred_template_choice_is_recorded(monkeypatch):
    from torch._inductor import ir

    fast, slow = _choice("triton_mm_4", "BLOCK_K=128"), _choice("mm")

    class Deferred:  # inductor's MultiTemplateBuffer as the scheduler calls it
        inputs = [_Node(1, 4096), _Node(4096, 4096)]

        def choice_timings(self, hint_override=None):
            return {fast: 0.009, slow: 0.012}

        def get_min_choice(self, hint_override=None):
            timings = self.choice_timings(hint_override)
            best = min(timings, key=timings.get)
            return best, timings[best]

    monkeypatch.setattr(ir, "MultiTemplateBuffer", Deferred)
    kernel_choices._record_deferred_choices()
    kernel_choices._record_deferred_choices()  # wrapped once
    assert Deferred().get_min_choice() == (fast, 0.009)  # the scheduler's answer unchanged
    (record,) = kernel_choices.selections()
    assert record["op"] == "template" and record["input_shapes"] == [[1, 4096], [4096, 4096]]
    assert record["chosen"] == "triton_mm_4 (BLOCK_K=128)" and record["runner_up"] == "mm"


def test_without_autotuning_the_details_say_so(monkeypatch):
    monkeypatch.setattr(kernel_choices, "_INSTALLED", False)
    assert kernel_choices.describe() == {"selections": [], "note": "no max-autotuned matmuls in this process"}


@pytest.mark.parametrize("batch_size", [None, 2])  # the single-sequence and the batched static runs
def test_a_static_result_carries_the_selections_made_in_its_process(monkeypatch, batch_size):
    from specbench.cases import Case
    from specbench.run.harness import run_case

    monkeypatch.setattr(kernel_choices, "_INSTALLED", True)  # as loading a static case on CUDA installs it (run/parts.load_target)
    tuned = _choice("triton_mm_2", "BLOCK_N=128")
    kernel_choices._record({tuned: 0.011}, "mm", [_Node(1, 64), _Node(64, 64)], [tuned], None, {})
    case = dict(name="tuned", engine="static", proposer={"name": "ngram", "num_speculative_tokens": 3},
                max_new_tokens=4, prompts={"name": "synthetic", "num_prompts": 2},
                **({} if batch_size is None else {"batch_size": batch_size}))
    autotune = run_case(Case.from_dict(case), progress=False).to_dict()["details"]["engine"]["autotune"]
    assert [s["chosen"] for s in autotune["selections"]] == ["triton_mm_2 (BLOCK_N=128)"]
    assert autotune["note"].startswith("selections inductor made in this process")


@pytest.mark.parametrize("hits, misses, start", [
    (3, 0, "no autotune selection in this process; inductor's FX graph cache served 3 of its 3 compiled graphs"),
    (1, 2, "inductor compiled 2 graphs in this process and reported no autotune selection to its hooks"),
])
def test_the_note_says_whether_the_graphs_were_compiled_here_or_served(monkeypatch, hits, misses, start):
    from collections import Counter

    from torch._dynamo.utils import counters

    monkeypatch.setattr(kernel_choices, "_INSTALLED", True)
    monkeypatch.setitem(counters, "inductor", Counter(fxgraph_cache_hit=hits, fxgraph_cache_miss=misses))
    described = kernel_choices.describe()
    assert described["fx_graph_cache"] == {"hits": hits, "misses": misses}
    assert described["note"].startswith(start)
    assert described["note"].endswith("; compiled_matmuls names the kernels the loaded graphs run, read from their "
                                      "generated code")


def test_the_note_says_when_one_row_matmuls_ran_as_reductions(monkeypatch):
    from collections import Counter

    from torch._dynamo.utils import counters

    record = {"input_shapes": [[1, 4096], [4096, 4096]],
              "kernels": ["triton_red_fused_mul_sum_0 (one-row mm as multiply + sum: R0_BLOCK=2048, num_warps=16)"]}
    monkeypatch.setattr(kernel_choices, "_INSTALLED", True)
    monkeypatch.setattr(kernel_choices, "compiled_matmuls", lambda shapes=None: [record])
    monkeypatch.setitem(counters, "inductor", Counter(fxgraph_cache_hit=0, fxgraph_cache_miss=5))
    described = kernel_choices.describe()
    assert described["compiled_matmuls"] == [record]
    assert "the one-row matmuls run as multiply + sum reductions (coordinate-descent tuning's decomposition)" in (
        described["note"])
