"""Step costs at batch size B (run/step_costs.py): scripted timings with known answers, at B = 1 also through a
per-sequence proposer as the one slot (a case's loop); real runs' figures and tokens; the gates of a batch point."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from _random_heads import random_heads
from _synthetic_results import make_result
from specbench.run import batch
from specbench.run.speed import mean_acceptance_length, measurement_flags, prediction_error
from specbench.cases import Case
from specbench.checkpoints.tiny import tiny_llama
from specbench.run import step_costs
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, SlotProposer, PerSlotProposer
from specbench.engine.static_target import StaticTarget
from specbench.run.step_costs import StepCosts, measure_step_costs
from specbench.engine.target import TargetOutput
from specbench.gating.gates import NOT_MEASURED, compare_entry
from specbench.gating.regenerate import baseline_entry
from specbench.run.harness import run_case
from specbench.proposers.draft_model import DraftModelProposer
from specbench.proposers.medusa import MedusaProposer

VOCAB, HIDDEN = 256, 64
SMALL_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes: verify width 7
PER_REQUEST = ("prompt_id", "repeat", "output_token_ids", "plain_output_token_ids", "num_drafts", "num_draft_tokens",
               "num_accepted_tokens", "accepted_per_position", "finish_reason")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(step_costs.time, "perf_counter", fake)
    return fake


class ScriptedTarget:
    """B slots whose verify of width W costs 1 ms + 0.25 ms per scored node (B * W) on a fake clock; prefill,
    commit, truncate and release cost none. Records each verify's width, inputs and the slot lengths it started at."""

    device = torch.device("cpu")
    vocab_size = 16

    def __init__(self, clock: FakeClock, batch_size: int):
        self.clock, self.batch_size = clock, batch_size
        self.lengths = [0] * batch_size
        self.steps: list[tuple[int, list, list[int]]] = []  # (width, inputs, lengths before the verify)
        self.pending: int | None = None

    def prefill(self, slot, ids):
        self.lengths[slot] = ids.numel()
        logits = torch.zeros(1, self.vocab_size)  # (1, V)
        logits[0, 7 + slot] = 1.0  # each slot's first token: 7 + slot
        return TargetOutput(logits=logits, hidden_states=torch.zeros(ids.numel(), 4))

    def verify(self, inputs):
        width = max(len(x) for x in inputs)
        self.steps.append((width, inputs, list(self.lengths)))
        self.clock.now += 1e-3 + 0.25e-3 * self.batch_size * width
        self.pending = width
        return TargetOutput(logits=torch.zeros(self.batch_size, width, self.vocab_size),
                            hidden_states=torch.zeros(self.batch_size, width, 4))

    def commit(self, accepted):
        assert self.pending is not None and len(accepted) == self.batch_size
        self.lengths = [n + len(path) for n, path in zip(self.lengths, accepted)]
        self.pending = None

    def truncate(self, lengths):
        assert self.pending is None
        for slot, length in lengths.items():
            self.lengths[slot] = length

    def release(self, slot):
        self.lengths[slot] = 0


class ScriptedSlotProposer(SlotProposer):
    """Drafts (1, 2, 3) for every slot but the ``silent`` ones (None: nothing drafted), or a tree; 0.5 ms per call
    plus 0.1 ms per slot on the fake clock."""

    def __init__(self, clock: FakeClock, silent=(), tree: bool = False, tokens=(1, 2, 3)):
        self.clock, self.silent, self.tree, self.begun = clock, set(silent), tree, []
        self.tokens = torch.tensor(tokens)

    @property
    def max_draft_tokens(self) -> int:
        return 3

    def begin_request(self, slot, prompt_ids):
        self.begun.append(slot)

    def propose(self, states):
        self.clock.now += 0.5e-3 + 0.1e-3 * len(states)
        parents = torch.tensor([0, 0, 1]) if self.tree else None  # a root with two children, one grandchild
        tokens = self.tokens
        return {slot: None if slot in self.silent else
                (Draft(tokens, parents) if self.tree else Draft.chain(tokens)) for slot in states}


class ScriptedProposer(Proposer):
    """A per-sequence proposer: drafts the chain ``tokens`` (none: nothing drafted), 0.5 ms per call on the fake clock."""

    name = "scripted-costs"

    def __init__(self, clock: FakeClock, tokens=(1, 2, 3)):
        self.clock, self.tokens, self.begun = clock, tokens, []

    @classmethod
    def from_options(cls, target, **options):
        raise NotImplementedError("built directly by the tests")

    @property
    def max_draft_tokens(self) -> int:
        return 3

    def begin_request(self, prompt_ids):
        self.begun.append(prompt_ids.tolist())

    def propose(self, state):
        self.clock.now += 0.5e-3
        return Draft.chain(torch.tensor(self.tokens, dtype=torch.long)) if self.tokens else None


def _nodes(x) -> list[int]:
    """A slot input's ``[root, *draft]``: its host-known ids, then its device-held tail."""
    return list(x.ids) + ([] if x.tail is None else x.tail.tolist())


@pytest.mark.parametrize("batch_size", [1, 3])
def test_step_costs_at_b_on_a_scripted_clock(clock, batch_size):
    target, proposer = ScriptedTarget(clock, batch_size), ScriptedSlotProposer(clock)
    prompts = [[5, 6, 7], [5, 6], [9]]
    costs = measure_step_costs(target, proposer, prompts, reps=3, warmup=1)
    t1, verify, draft = 1e-3 + 0.25e-3 * batch_size, 1e-3 + 0.25e-3 * batch_size * 4, 0.5e-3 + 0.1e-3 * batch_size
    assert isinstance(costs, StepCosts) and costs.batch_size == batch_size
    assert (costs.t1_s, costs.verify_s, costs.draft_s) == pytest.approx((t1, verify, draft), abs=1e-12)
    assert costs.verify_width == 4 and costs.reps == 3
    assert costs.verify_cost_ratio == pytest.approx(verify / t1) and costs.draft_cost_ratio == pytest.approx(draft / t1)
    assert costs.predicted_speedup(2.5) == pytest.approx(2.5 / ((verify + draft) / t1))
    # warm-up + reps of the plain step (width 1 per slot), then of the chain step; every slot active in each
    assert [w for w, _, _ in target.steps] == [1] * 4 + [4] * 4
    assert all(len(inputs) == batch_size and all(x is not None for x in inputs) for _, inputs, _ in target.steps)
    roots = [7 + b for b in range(batch_size)]
    assert [_nodes(x) for x in target.steps[0][1]] == [[r] for r in roots]
    assert [_nodes(x) for x in target.steps[-1][1]] == [[r, 1, 2, 3] for r in roots]
    # slot b holds prompts[b]; every timed verify starts from the prompts, and every slot is idle at the end
    want = [len(prompts[b % len(prompts)]) for b in range(batch_size)]
    assert all(lengths == want for _, _, lengths in target.steps)
    assert target.lengths == [0] * batch_size and proposer.begun == list(range(batch_size))


@pytest.mark.parametrize("tokens", [(1, 2, 3), ()], ids=["drafts", "drafts-nothing"])
def test_a_per_sequence_proposer_as_the_one_slot(clock, tokens):
    """A case's loop measures at B = 1 with its per-sequence proposer as the decoder's one slot. One that drafts
    nothing at the prompt (an n-gram without a match) is charged its propose time and a verify of max_draft_tokens."""
    target, proposer = ScriptedTarget(clock, 1), ScriptedProposer(clock, tokens)
    costs = measure_step_costs(target, PerSlotProposer([proposer]), [[5, 6, 7]], reps=3, warmup=1)
    t1, verify = 1e-3 + 0.25e-3, 1e-3 + 0.25e-3 * 4  # the plain step and the chain of 3 (4 nodes)
    assert (costs.t1_s, costs.verify_s, costs.draft_s) == pytest.approx((t1, verify, 0.5e-3), abs=1e-12)
    assert costs.verify_width == 4 and costs.reps == 3 and costs.batch_size == 1
    assert costs.verify_cost_ratio == pytest.approx(verify / t1) and costs.draft_cost_ratio == pytest.approx(0.5e-3 / t1)
    assert costs.predicted_speedup(2.25) == pytest.approx(2.25 / ((verify + 0.5e-3) / t1))
    assert [w for w, _, _ in target.steps] == [1] * 4 + [4] * 4  # warm-up + reps, plain first
    assert [_nodes(x) for x in target.steps[-1][1]] == ([[7, 1, 2, 3]] if tokens else [[7, 7, 7, 7]])
    assert proposer.begun == [[5, 6, 7]] and target.lengths == [0]


def test_a_silent_slot_is_charged_a_full_chain_and_a_tree_its_nodes(clock):
    target = ScriptedTarget(clock, 3)
    costs = measure_step_costs(target, ScriptedSlotProposer(clock, silent={1}), [[5, 6]], reps=2)
    assert costs.verify_width == 4 and costs.verify_s == pytest.approx(1e-3 + 0.25e-3 * 12)
    assert [_nodes(x) for x in target.steps[-1][1]] == [[7, 1, 2, 3], [8, 8, 8, 8], [9, 1, 2, 3]]
    tree = ScriptedTarget(clock, 2)
    costs = measure_step_costs(tree, ScriptedSlotProposer(clock, tree=True), [[5, 6]], reps=2)
    step = tree.steps[-1][1][0]
    assert costs.verify_width == 4 and step.tree_mask is not None and torch.as_tensor(step.depths).tolist() == [0, 1, 1, 2]
    plain = measure_step_costs(ScriptedTarget(clock, 2), None, [[5, 6]], reps=2)
    assert (plain.verify_width, plain.draft_s, plain.verify_s) == (1, 0.0, plain.t1_s)
    with pytest.raises(ValueError, match="reps >= 1"):
        measure_step_costs(ScriptedTarget(clock, 2), None, [[5]], reps=0)


def test_batch_measurement_flags_name_the_batch_speedup():
    metrics = {"batch_speedup": 1.2, "decode_speedup": 1.4, "predicted_speedup": 1.5, "mean_acceptance_length": 2.0,
               "verify_cost_ratio": 1.2, "draft_cost_ratio": 0.13}
    metrics["speedup_prediction_error"] = prediction_error(metrics, "batch_speedup")
    assert metrics["speedup_prediction_error"] == pytest.approx(1.2 / 1.5 - 1)
    (flag,) = measurement_flags(metrics, measured="batch_speedup")
    assert flag["kind"] == "speedup_prediction"
    assert flag["message"].startswith("measured batch speedup 1.200 is -20% off the 1.500 its step costs predict")
    assert measurement_flags({**metrics, "speedup_prediction_error": 0.05}, measured="batch_speedup") == []
    assert math.isnan(prediction_error({**metrics, "predicted_speedup": math.nan}, "batch_speedup"))
    assert prediction_error(metrics) == pytest.approx(1.4 / 1.5 - 1)  # the single-sequence form: decode phase


# ---- real batched runs on a tiny random Llama (CPU, fp32) ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return StaticTarget.from_hf_model(tiny_llama(seed=0)), random_heads(HIDDEN, VOCAB)


def _case(batch_size: int, repeats: int = 1, **changes) -> Case:
    return Case.from_dict({"name": "costs", "suite": "batch", "target": "specbench-tiny/random-llama", "engine": "static",
                           "proposer": {"name": "ngram", "num_speculative_tokens": 3}, "max_new_tokens": 10,
                           "prompts": {"name": "synthetic", "num_prompts": 4}, "batch_size": batch_size,
                           "repeats": repeats, **changes})


def _run(case: Case, target, proposer=None) -> dict:
    return run_case(case, progress=False, target=target, proposer=proposer).to_dict()


def _medusa(static, heads, **options):
    return MedusaProposer.from_options(static, heads=heads, **options)


def _draft_model(static):
    """A greedy draft model of the target's own weights (for_batch builds its B-slot form); every draft is accepted."""
    return DraftModelProposer(StaticTarget.from_hf_model(tiny_llama(seed=0)), num_speculative_tokens=3)


def test_the_verify_width_is_the_steps_fixed_width(tiny):
    """A draft shorter than K verifies at the chain's reserved width K + 1, as the run's steps do."""
    static, _ = tiny
    target = static.with_batch_size(2)
    target.reserve(32, 3)
    costs = measure_step_costs(target, ScriptedSlotProposer(FakeClock(), tokens=(1, 2)), [[5, 6, 7]], reps=2)
    assert costs.verify_width == 4 and costs.batch_size == 2
    assert all(math.isfinite(t) and t > 0 for t in (costs.t1_s, costs.verify_s, costs.draft_s))
    assert [target.cache_length(b) for b in range(2)] == [0, 0]  # every slot released


@pytest.mark.parametrize("batch_size, options, width", [(1, {"num_speculative_tokens": 3}, 4),
                                                        (3, {"num_speculative_tokens": 3}, 4),
                                                        (3, {"tree": SMALL_TREE}, 7)])
def test_a_batched_result_has_finite_step_costs_at_b(tiny, batch_size, options, width):
    static, heads = tiny
    result = _run(_case(batch_size, repeats=2), static, _medusa(static, heads, **options))
    metrics, first = result["metrics"], result["requests"][:4]
    for record in result["repeats"]:
        assert record["verify_width"] == width and record["t1_s"] > 0 and record["verify_s"] > 0
        assert record["draft_s"] > 0  # the batched Medusa heads over B slots
        mal = mean_acceptance_length([r for r in result["requests"] if r["repeat"] == record["repeat"]])
        assert record["predicted_speedup"] == pytest.approx(mal / (record["verify_cost_ratio"] + record["draft_cost_ratio"]))
    for name in ("step_latency_s", "verify_cost_ratio", "draft_cost_ratio", "predicted_speedup", "speedup_prediction_error"):
        assert math.isfinite(metrics[name]), name
    assert metrics["step_latency_s"] == pytest.approx(statistics.median(r["t1_s"] for r in result["repeats"]))
    assert metrics["speedup_prediction_error"] == pytest.approx(metrics["batch_speedup"] / metrics["predicted_speedup"] - 1)
    assert bool(result["flags"]) == (abs(metrics["speedup_prediction_error"]) > 0.10)
    assert mean_acceptance_length(first) == pytest.approx(metrics["mean_acceptance_length"])


def test_a_batch_curve_carries_the_step_costs_at_each_b(tiny):
    static, _ = tiny
    results = [_run(_case(b), static) for b in (1, 2)]  # n-gram, from the case
    (curve,) = batch.curves(results)
    assert [p["batch_size"] for p in curve["points"]] == [1, 2]
    for point, result in zip(curve["points"], results):
        assert point["verify_cost_ratio"] == result["metrics"]["verify_cost_ratio"]
        assert point["predicted_speedup"] == result["metrics"]["predicted_speedup"]
        assert math.isfinite(point["verify_cost_ratio"])


def test_scripted_step_costs_flow_into_the_batch_result(tiny, monkeypatch):
    static, heads = tiny
    fixed = StepCosts(t1_s=0.010, verify_s=0.015, draft_s=0.002, verify_width=4, reps=10, batch_size=3)
    monkeypatch.setattr(batch, "measure_step_costs", lambda target, proposer, prompts: fixed)
    result = _run(_case(3), static, _draft_model(static))
    metrics, (record,) = result["metrics"], result["repeats"]
    assert (record["t1_s"], record["verify_s"], record["draft_s"], record["verify_width"]) == (0.010, 0.015, 0.002, 4)
    assert metrics["verify_cost_ratio"] == pytest.approx(1.5) and metrics["draft_cost_ratio"] == pytest.approx(0.2)
    assert metrics["step_latency_s"] == 0.010
    mal = metrics["mean_acceptance_length"]
    assert mal > 1.0  # a draft model of the target's own weights: its drafts are accepted
    assert metrics["predicted_speedup"] == pytest.approx(mal / 1.7) == pytest.approx(fixed.predicted_speedup(mal))
    assert metrics["speedup_prediction_error"] == pytest.approx(metrics["batch_speedup"] / (mal / 1.7) - 1)
    assert result["flags"] == measurement_flags(metrics, measured="batch_speedup")


@pytest.mark.parametrize("proposer_for", [lambda static, heads: None,  # n-gram per slot, from the case
                                          lambda static, heads: _medusa(static, heads, tree=SMALL_TREE),
                                          lambda static, heads: _draft_model(static)],
                         ids=["ngram", "medusa-tree", "draft-model"])
def test_measuring_leaves_the_runs_tokens_and_counters_unchanged(tiny, monkeypatch, proposer_for):
    """Two repeats through three slots (a refill each): the repeat after a measurement decodes as it would without."""
    static, heads = tiny
    measured = _run(_case(3, repeats=2), static, proposer_for(static, heads))
    fixed = StepCosts(t1_s=0.01, verify_s=0.01, draft_s=0.0, verify_width=1, reps=1, batch_size=3)
    monkeypatch.setattr(batch, "measure_step_costs", lambda target, proposer, prompts: fixed)
    unmeasured = _run(_case(3, repeats=2), static, proposer_for(static, heads))
    assert [{k: r[k] for k in PER_REQUEST} for r in measured["requests"]] == [
        {k: r[k] for k in PER_REQUEST} for r in unmeasured["requests"]]
    assert sum(r["num_drafts"] for r in measured["requests"]) > 0
    assert measured["details"]["batch"] == unmeasured["details"]["batch"]
    assert measured["details"]["batch"]["num_refills"] == 1
    assert measured["correctness"] == unmeasured["correctness"] and measured["correctness"]["exact"]
    assert math.isfinite(measured["metrics"]["verify_cost_ratio"])


# ---- gates -------------------------------------------------------------------------------------------------


def _batch_point(seed: int = 0, batch_size: int = 2, **changes) -> dict:
    """make_result's run as the point ``NAME[batch_size=B]``: one batch speedup and throughput per repeat."""
    result = make_result(seed=seed, num_repeats=3, hardware_class="NVIDIA H200", name="chain-k3", **changes)
    name = f"chain-k3[batch_size={batch_size}]"
    result["case"].update(name=name, engine="static", batch_size=batch_size)
    result["case_id"] = f"medusa/{name}"
    for record in result["repeats"]:
        record.update(batch_speedup=1.3, throughput_tokens_per_s=100.0, plain_throughput_tokens_per_s=77.0)
    result["metrics"].update(batch_size=batch_size, batch_speedup=1.3, throughput_tokens_per_s=100.0,
                             plain_throughput_tokens_per_s=77.0, queue_s=0.0, peak_memory_bytes=None)
    return result


def test_a_batch_points_step_cost_ratios_are_gated_as_a_single_runs():
    entry = baseline_entry(_batch_point(seed=0), command="pytest tests/test_step_costs.py")
    tol = {"verify_cost_ratio": 0.05, "draft_cost_ratio": 0.05}
    assert compare_entry(_batch_point(seed=1), entry, tolerances=tol).passed
    slower = compare_entry(_batch_point(seed=1, verify_scale=1.2), entry, tolerances=tol)
    assert [c.name for c in slower.failures] == ["verify_cost_ratio"], slower.format()
    assert slower.failures[0].message().startswith("medusa/chain-k3[batch_size=2]: verify_cost_ratio regressed")
    draft = compare_entry(_batch_point(seed=1, draft_scale=1.5), entry, tolerances=tol)
    assert [c.name for c in draft.failures] == ["draft_cost_ratio"], draft.format()
    # a batch point of before this measurement (NaN step costs) is skipped as not measured
    old = _batch_point(seed=1)
    for name in ("verify_cost_ratio", "draft_cost_ratio", "step_latency_s", "predicted_speedup"):
        old["metrics"][name] = math.nan
    check = compare_entry(old, entry, tolerances=tol).check("verify_cost_ratio")
    assert check.status == "skipped" and check.reason == NOT_MEASURED


def test_a_real_batch_points_verify_cost_ratio_is_gated_under_ratios(tiny):
    static, heads = tiny
    result = _run(_case(2, gate_speed="ratios"), static, _medusa(static, heads, num_speculative_tokens=3))
    entry = baseline_entry(result, command="pytest tests/test_step_costs.py")
    speed = entry["speed"][result["env"]["hardware_class"]]
    assert math.isfinite(speed["metrics"]["verify_cost_ratio"]) and math.isfinite(speed["metrics"]["step_latency_s"])
    same = compare_entry(result, entry).check("verify_cost_ratio")
    assert same.status == "pass" and same.baseline == pytest.approx(result["metrics"]["verify_cost_ratio"], rel=1e-5)
    speed["metrics"]["verify_cost_ratio"] = result["metrics"]["verify_cost_ratio"] / 2  # a baseline twice as cheap
    worse = compare_entry(result, entry)
    assert worse.check("verify_cost_ratio").status == "regression", worse.format()
    assert compare_entry(result, entry, tolerances={"verify_cost_ratio": 1.5}).check("verify_cost_ratio").status == "pass"
