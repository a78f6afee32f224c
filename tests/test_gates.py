"""Gates: one-sided, direction-aware, noise-aware comparison of a run with its stored baseline."""

from __future__ import annotations

import copy
import math

import pytest
from _synthetic_results import make_result, with_divergence

from specbench.gating.regenerate import update_baseline
from specbench.gating.baselines import CaseDefinitionChanged, compare
from specbench.gating.intervals import bootstrap_interval
from specbench.gating.gates import DEFAULT_TOLERANCES, LOWER_IS_BETTER, compare_entry, resolve_tolerances

QUALITY_CHECKS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate[0]",
                  "per_position_acceptance_rate[1]", "per_position_acceptance_rate[2]")
SPEED_CHECKS = ("tokens_per_s", "speedup", "time_to_first_token_s", "per_token_latency_s", "decode_speedup",
                "verify_cost_ratio", "draft_cost_ratio", "step_latency_s")


@pytest.fixture()
def baseline():
    return make_result(seed=0)


@pytest.fixture()
def store(tmp_path, baseline):
    update_baseline(baseline, tmp_path, command="pytest tests/test_gates.py", reason="test")
    return tmp_path


def test_identical_result_passes_with_zero_width_paired_interval(store, baseline):
    report = compare(baseline, store)
    assert report.passed and report.has_baseline
    assert [c.name for c in report.checks] == [*QUALITY_CHECKS, *SPEED_CHECKS, "exact_match"]
    assert all(c.status == "pass" for c in report.checks), report.format()
    # same prompts, same per-request values: paired resampling makes every difference exactly 0
    check = report.check("acceptance_rate")
    assert check.ci[0] == check.ci[1] == check.baseline


def test_regression_fails_naming_metric_baseline_measured_and_tolerance(store):
    report = compare(make_result(seed=0, accept_scale=0.5), store)
    assert not report.passed
    check = report.check("acceptance_rate")
    assert check.status == "regression" and check in report.failures
    low, high = check.ci
    assert high < check.baseline  # the rule's second condition, visible in the report
    expected = (f"medusa/medusa-chain-k3: acceptance_rate regressed: measured {check.measured:.3f} < "
                f"baseline {check.baseline:.3f} (tolerance 5%, 99% CI [{low:.3f}, {high:.3f}])")
    assert check.message() == expected
    assert expected in report.format()
    assert report.format().splitlines()[0].startswith("medusa/medusa-chain-k3: FAILED")


def test_improvement_passes_and_suggests_regenerating(store):
    report = compare(make_result(seed=0, accept_scale=1.3), store)
    assert report.passed
    check = report.check("mean_acceptance_length")
    assert check.status == "improvement" and check in report.improvements
    assert check.measured > check.baseline
    assert "improved" in check.message() and "consider regenerating the baseline" in check.message()


def test_noise_from_the_same_distribution_passes(store, baseline):
    """Twenty reruns with other sampling draws: none fails, though many leave the tolerance band.

    Per check a false alarm needs the measured value beyond the 99% interval's far end: at most 0.5%
    (gates docstring). The draws are seeded, so this is deterministic; the second assertion shows the
    interval, not the tolerance, is what keeps these runs green.
    """
    beyond_tolerance = 0
    for seed in range(1, 21):
        report = compare(make_result(seed=seed), store)
        assert report.passed, report.format(only_problems=True)
        for name in QUALITY_CHECKS:
            c = report.check(name)
            beyond_tolerance += abs(c.measured - c.baseline) > DEFAULT_TOLERANCES["acceptance_rate"] * c.baseline
    assert beyond_tolerance >= 10  # a tolerance-only gate would have failed on these


def test_a_real_30_percent_acceptance_drop_fails(store, baseline):
    dropped = make_result(seed=7, accept_scale=0.8)
    ratio = dropped["metrics"]["acceptance_rate"] / baseline["metrics"]["acceptance_rate"]
    assert 0.6 < ratio < 0.8  # the scenario: accepting 20% less per position drops the rate by about 30%
    report = compare(dropped, store)
    assert report.check("acceptance_rate").status == "regression"
    assert report.check("mean_acceptance_length").status == "regression"
    assert not report.passed


def test_lower_is_better_latency_regresses_when_slower(store):
    report = compare(make_result(seed=0, speed_scale=0.5), store)  # half the speed
    ttft = report.check("time_to_first_token_s")
    assert ttft.direction == LOWER_IS_BETTER and ttft.status == "regression"
    assert f"measured {ttft.measured:.3g} > baseline {ttft.baseline:.3g}" in ttft.message()
    assert report.check("tokens_per_s").status == "regression"
    assert report.check("acceptance_rate").status == "pass"  # speed changes leave quality alone


def test_speed_gating_skipped_for_another_hardware_class(store):
    report = compare(make_result(seed=0, hardware_class="NVIDIA H200", speed_scale=5.0), store)
    assert report.passed
    for name in SPEED_CHECKS:
        check = report.check(name)
        assert check.status == "skipped"
        assert check.reason == "no baseline for hardware class NVIDIA H200 (have: cpu)"
    assert all(report.check(name).status == "pass" for name in QUALITY_CHECKS)  # quality is hardware-independent


def test_no_baseline_reports_but_does_not_fail(tmp_path):
    report = compare(make_result(seed=0), tmp_path)
    assert report.passed and not report.has_baseline
    assert {report.check(n).status for n in (*QUALITY_CHECKS, *SPEED_CHECKS)} == {"no_baseline"}
    assert "no baseline stored for medusa/medusa-chain-k3" in report.check("acceptance_rate").message()


def test_fp32_divergence_fails_naming_request_and_position(tmp_path):
    result = with_divergence(make_result(seed=0), request_index=3, position=17, match_fraction=0.95)
    report = compare(result, tmp_path)  # correctness needs no baseline
    check = report.check("exact_match")
    assert not report.passed and check.status == "fail"
    assert "request 'gsm8k-3' (#3) first diverges at output position 17" in check.message()
    assert "1 of 40 requests diverge" in check.message()


def test_bf16_match_fraction_is_gated_by_the_minimum(store):
    bf16 = make_result(seed=0, dtype="bfloat16")
    under = with_divergence(bf16, request_index=0, position=2, match_fraction=0.3)
    check = compare_entry(under, None).check("match_fraction")
    assert check.status == "fail"
    assert "match fraction 0.300 is under the minimum 0.500" in check.reason
    assert "request 'gsm8k-0' (#0) first diverges at output position 2" in check.reason

    drift = with_divergence(bf16, request_index=5, position=40, match_fraction=0.9)
    check = compare_entry(drift, None).check("match_fraction")
    assert check.status == "pass" and "position 40" in check.reason  # first divergence reported even on pass
    stricter = compare_entry(drift, {"tolerances": {"min_match_fraction": 0.95}, "quality": None, "speed": {}})
    assert stricter.check("match_fraction").status == "fail"


def test_gate_quality_false_reports_quality_without_gating_it(store):
    result = make_result(seed=0, accept_scale=0.5, speed_scale=0.5)
    result["case"]["gate_quality"] = False  # random-weight targets: acceptance means nothing
    report = compare(result, store)
    check = report.check("acceptance_rate")
    assert check.status == "skipped" and "gate_quality = false" in check.reason
    assert check.baseline is not None and check.measured < check.baseline  # still reported
    assert report.check("tokens_per_s").status == "regression"  # speed is still gated


def test_unchecked_correctness_is_skipped(tmp_path):
    result = make_result(seed=0)
    result["correctness"] = {"checked": False, "exact": False, "match_fraction": 0.1, "first_divergence": []}
    check = compare(result, tmp_path).check("exact_match")
    assert check.status == "skipped" and "not checked" in check.reason


def test_nothing_drafted_is_a_quality_regression(store):
    result = make_result(seed=0)
    for r in result["requests"]:
        r.update(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=[])
    result["metrics"].update(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, acceptance_rate=math.nan,
                             mean_acceptance_length=1.0, per_position_acceptance_rate=[])
    report = compare(result, store)
    check = report.check("acceptance_rate")
    assert check.status == "regression" and "undefined" in check.message()
    assert report.check("per_position_acceptance_rate[0]").status == "regression"


def test_tolerance_overrides_and_validation(store):
    dropped = make_result(seed=7, accept_scale=0.8)
    loose = compare(dropped, store, tolerances={"acceptance_rate": 0.5})  # a 30% drop is within 50%
    assert loose.check("acceptance_rate").status == "pass"
    assert loose.check("acceptance_rate").tolerance == 0.5
    dropped["case"]["tolerances"] = {"acceptance_rate": 0.5}  # the case's own table, not part of its definition
    from_case = compare(dropped, store)
    assert from_case.check("acceptance_rate").status == "pass"
    assert from_case.check("mean_acceptance_length").status == "regression"  # other metrics keep their default
    assert compare(dropped, store, tolerances={"acceptance_rate": 0.05}).check("acceptance_rate").failed
    dropped["case"]["tolerances"] = {"acceptance": 0.1}
    with pytest.raises(ValueError, match="medusa/medusa-chain-k3: unknown tolerance 'acceptance'.*'tolerances' table"):
        compare(dropped, store)
    with pytest.raises(ValueError, match="unknown tolerance 'acceptance'"):
        resolve_tolerances({"acceptance": 0.1})
    with pytest.raises(ValueError, match="must be a number >= 0"):
        resolve_tolerances({"speedup": -0.1})


def test_bootstrap_is_seeded_and_pairs_by_prompt_id(baseline):
    measured = make_result(seed=3)
    args = (measured["requests"], baseline["requests"], baseline["metrics"]["acceptance_rate"], "acceptance_rate")
    assert bootstrap_interval(*args) == bootstrap_interval(*args)
    # shuffled request order must not matter: pairing goes by prompt_id, not by position
    shuffled = list(reversed(measured["requests"]))
    paired = bootstrap_interval(*args)
    assert bootstrap_interval(shuffled, *args[1:]) == pytest.approx(paired, rel=0.02)
    # unpaired (other prompt ids) the interval carries prompt difficulty and widens
    renamed = copy.deepcopy(baseline["requests"])
    for r in renamed:
        r["prompt_id"] = "other-" + r["prompt_id"]
    unpaired = bootstrap_interval(measured["requests"], renamed, *args[2:])
    assert unpaired[1] - unpaired[0] > paired[1] - paired[0]
    assert bootstrap_interval(measured["requests"][:1], None, 0.4, "acceptance_rate") is None  # one request: no CI


def test_cpu_speed_is_reported_not_gated_by_default():
    """CPU timings on shared machines swing 2-4x under load: unset gate_speed gates speed on GPUs only."""
    from specbench.gating.gates import compare_entry

    from _synthetic_results import make_result

    baseline = make_result(seed=0, gate_speed=None)
    slow = make_result(seed=1, speed_scale=0.5, gate_speed=None)
    entry = {
        "case": baseline["case"],
        "quality": None,
        "speed": {"cpu": {"metrics": baseline["metrics"], "requests": baseline["requests"]}},
    }
    report = compare_entry(slow, entry)
    check = report.check("tokens_per_s")
    assert check.status == "skipped" and "too noisy to gate" in check.reason
    assert check.baseline == baseline["metrics"]["tokens_per_s"]


def cuda_twin(result: dict, **case_changes) -> dict:
    """The same run on CUDA, gated on the CPU case's quality (case key ``quality_baseline``)."""
    twin = copy.deepcopy(result)
    twin["case"].update(name="medusa-chain-k3-cuda-fp32", device="cuda", quality_baseline="medusa-chain-k3",
                        **case_changes)
    twin["case_id"] = "medusa/medusa-chain-k3-cuda-fp32"
    twin["env"] = {**twin["env"], "hardware_class": "NVIDIA-H200"}
    return twin


def test_quality_baseline_gates_a_cuda_twin_on_the_cpu_cases_quality(store, baseline):
    twin = cuda_twin(baseline)
    report = compare(twin, store)  # the twin has no baseline of its own yet
    assert report.quality_baseline == "medusa/medusa-chain-k3"
    assert all(report.check(name).status == "pass" for name in QUALITY_CHECKS), report.format()
    assert report.check("acceptance_rate").baseline == pytest.approx(baseline["metrics"]["acceptance_rate"], rel=1e-5)
    assert report.check("tokens_per_s").status == "no_baseline"  # speed: the twin's own, none stored
    assert "(quality against medusa/medusa-chain-k3)" in report.format()

    worse = cuda_twin(make_result(seed=0, accept_scale=0.6))  # the CUDA path lost acceptance
    assert compare(worse, store).check("acceptance_rate").status == "regression"


def test_quality_baseline_missing_or_differing_reference_is_named(store, baseline, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    check = compare(cuda_twin(baseline), empty).check("acceptance_rate")
    assert check.status == "no_baseline"
    assert "no baseline stored for medusa/medusa-chain-k3, the quality baseline of medusa/medusa-chain-k3-cuda-fp32" in check.reason

    with pytest.raises(CaseDefinitionChanged) as err:
        compare(cuda_twin(baseline, max_new_tokens=32), store)
    message = str(err.value)
    assert "takes its quality baseline from medusa/medusa-chain-k3" in message
    assert "max_new_tokens: baseline 64, now 32" in message
