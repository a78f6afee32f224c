"""bench/speed_gate_trial.py on the CPU: its slowdown wrapper, its JSON, and a verify slowdown seen in tok/s."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from specbench.cases import find_case
from specbench.engine.step_inputs import SlotInput
from specbench.pytest_plugin import skip_unless_available

from _bench_scripts import load_bench_script
TOP_KEYS = {"runs": int, "false_failures": int, "cases": dict, "injected": list, "smallest_caught": dict,
            "tolerances": dict, "env": dict, "seconds": float, "stopped_early": bool, "gate_speed_forced": bool}


@pytest.fixture(scope="module")
def script():
    return load_bench_script("speed_gate_trial")


def test_slowed_target_delegates_and_spins(script, tiny_target):
    slowed = script.Slowed(tiny_target, "verify", script.Spin("cpu", 0.05, None))
    assert slowed.vocab_size == tiny_target.vocab_size and slowed.max_context == tiny_target.max_context
    slowed.prefill(0, torch.tensor([1, 2, 3]))
    start = time.perf_counter()
    out = slowed.verify([SlotInput([4], [0])])
    assert time.perf_counter() - start >= 0.05
    slowed.commit([[0]])
    assert out.logits.shape[:2] == (1, 1) and tiny_target.cache_length == 4
    assert script.Spin("cuda", 0.01, 2e9).cycles == 20_000_000  # seconds x calibrated cycles per second


def run_trial(script, out: Path) -> dict:
    argv = [str(out), "--cases", "medusa/chain-k3", "--device", "cpu", "--runs", "2", "--slowdowns", "0.5",
            "--no-graphs-off", "--max-new-tokens", "16", "--num-prompts", "2"]
    assert script.main(argv) == 0
    return json.loads((out / "speed_gate_trial.json").read_text())


def check_document(doc: dict) -> None:
    for key, kind in TOP_KEYS.items():
        assert isinstance(doc[key], kind), (key, doc[key])
    assert doc["runs"] == 2 and doc["gate_speed_forced"] is True and doc["stopped_early"] is False
    (case_id, entry), = doc["cases"].items()
    assert case_id.startswith("medusa/chain-k3[")  # renamed by its overrides: never the stored case's id
    assert entry["baseline"]["tokens_per_s"] > 0 and entry["baseline"]["t1_s"] > 0
    assert [r["run"] for r in entry["unchanged"]] == [0, 1]
    for run in entry["unchanged"]:
        assert isinstance(run["passed"], bool) and isinstance(run["failed_checks"], list)
        assert run["tokens_per_s"] > 0 and run["speedup"] > 0
        assert run["passed"] == (not run["failed_checks"])
    assert set(entry["max_abs_deviation"]) >= {"tokens_per_s", "speedup"}
    assert doc["false_failures"] == sum(not r["passed"] for r in entry["unchanged"])
    assert set(doc["tolerances"]) == {case_id} and doc["env"]["hardware_class"] == "cpu"
    assert sorted((r["where"], r["slowdown"]) for r in doc["injected"]) == [("proposer", 0.5), ("verify", 0.5)]
    for run in doc["injected"]:
        assert run["case"] == case_id and isinstance(run["caught"], bool) and isinstance(run["failed_checks"], list)
        assert run["caught"] == bool(run["failed_checks"]) and isinstance(run["measured_slowdown"], float)
    assert set(doc["smallest_caught"]) == {"verify", "proposer"}
    runs = len(entry["unchanged"]) + 1  # the baseline run is gated against the others too
    assert entry["pairwise"]["pairs"] == runs * (runs - 1)
    assert entry["spread"]["tokens_per_s"]["values"][1:] == [r["tokens_per_s"] for r in entry["unchanged"]]


def test_trial_on_cpu(script, tmp_path):
    (case,) = find_case("medusa/chain-k3")
    skip_unless_available(case)
    # the injected verify busy-waits half the baseline's T(1) inside every verify call, the step-cost timer's
    # included: its T(1) is at least that, whatever else the machine is doing (a lower bound, not a timing race)
    doc = run_trial(script, tmp_path / "trial")
    check_document(doc)
    (entry,) = doc["cases"].values()
    verify = next(r for r in doc["injected"] if r["where"] == "verify")
    assert verify["t1_s"] >= 0.5 * entry["baseline"]["t1_s"]


def test_expected_seconds_stretches_only_injected_runs(script):
    # an unchanged run's value is its index: the 20th run is expected to take as long as the first
    state = {"baseline": {"seconds": 10.0}}
    assert script.expected_seconds(state, ("unchanged", 19)) == 10.0
    assert script.expected_seconds(state, ("verify", 0.2)) == pytest.approx(12.0)
    assert script.expected_seconds(state, ("graphs_off", None)) == 20.0
