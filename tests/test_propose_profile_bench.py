"""bench/propose_profile.py: a case's step-cost measurements report their propose cost, the profiled one counts every
propose call and the ops inside it, and the run's own measure_step_costs is restored afterwards."""

from __future__ import annotations

from types import SimpleNamespace

from _bench_scripts import load_bench_script

import specbench.run.sequence as sequence
from specbench.run.step_costs import DEFAULT_REPS, DEFAULT_WARMUP


def event(name: str, self_us: float, children=(), kernels=()) -> SimpleNamespace:
    children = list(children)
    total = self_us + sum(child.cpu_time_total for child in children)
    return SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_time_total=total, cpu_children=children,
                           kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels])


def test_ops_and_kernels_are_counted_per_propose_call_and_nothing_outside_it():
    bench = load_bench_script("propose_profile")
    calls = [event("propose", 2.0, [event("aten::bmm", 10.0, kernels=[("gemv", 30.0)]),
                                    event("aten::argmax", 4.0, kernels=[("argmax_kernel", 2.0)])]) for _ in range(2)]
    outside = event("aten::mm", 500.0, kernels=[("big_gemm", 900.0)])
    report = bench.inside_propose(calls + [outside] + [c for call in calls for c in call.cpu_children])
    assert report.splitlines()[0].startswith("inside propose: 2 calls, 16.0 us CPU each")
    assert "  op aten::bmm: 1.0 calls, 10.0 us self CPU" in report
    assert "  kernel gemv: 1.0 launches, 30.0 us GPU" in report
    assert "aten::mm" not in report and "big_gemm" not in report


def test_a_cpu_case_reports_its_propose_cost_and_restores_the_run_code(tmp_path, capsys):
    bench = load_bench_script("propose_profile")
    original = sequence.measure_step_costs
    status = bench.main([str(tmp_path), "medusa/chain-k3", "--num-prompts", "1", "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert status == 0 and sequence.measure_step_costs is original
    assert "step costs 1: T(1) " in out and " of T(1))" in out
    report = (tmp_path / "step_costs_profile.txt").read_text()
    # the profiled measurement's warm-up and timed propose calls, each running the heads' vocab projection once
    assert f"inside propose: {DEFAULT_WARMUP + DEFAULT_REPS} calls" in report
    assert "  op aten::bmm: 1.0 calls" in report
    assert (tmp_path / "run.json").is_file() and (tmp_path / "step_costs_trace.json").is_file()
