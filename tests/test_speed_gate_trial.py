"""bench/speed_gate_trial.py on the CPU: the JSON it writes, and an injected verify slowdown that shows in tok/s."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from specbench.cases import find_case
from specbench.pytest_plugin import skip_unless_available

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "speed_gate_trial.py"
TOP_KEYS = {"runs": int, "false_failures": int, "cases": dict, "injected": list, "smallest_caught": dict,
            "tolerances": dict, "env": dict, "seconds": float, "stopped_early": bool, "gate_speed_forced": bool}


def load_script():
    spec = importlib.util.spec_from_file_location("speed_gate_trial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_trial(tmp_path: Path) -> dict:
    (case,) = find_case("medusa/chain-k3")
    skip_unless_available(case)
    argv = [str(tmp_path), "--cases", "medusa/chain-k3", "--device", "cpu", "--runs", "2", "--slowdowns", "0.5",
            "--no-graphs-off", "--max-new-tokens", "16", "--num-prompts", "2"]
    assert load_script().main(argv) == 0
    return json.loads((tmp_path / "speed_gate_trial.json").read_text())


def test_trial_on_cpu(tmp_path):
    doc = run_trial(tmp_path)
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
    assert set(entry["max_abs_deviation"]) >= {"tokens_per_s", "speedup"}
    assert doc["false_failures"] == sum(not r["passed"] for r in entry["unchanged"])
    assert set(doc["tolerances"]) == {case_id} and doc["env"]["hardware_class"] == "cpu"
    assert sorted((r["where"], r["slowdown"]) for r in doc["injected"]) == [("proposer", 0.5), ("verify", 0.5)]
    for run in doc["injected"]:
        assert run["case"] == case_id and isinstance(run["caught"], bool) and isinstance(run["failed_checks"], list)
        assert run["caught"] == bool(run["failed_checks"])
    assert set(doc["smallest_caught"]) == {"verify", "proposer"}
    # each verify busy-waits half a T(1), and a decoding step (plain or speculative) is mostly its verify
    # (T(K+1) is about 1.2 T(1) here): every step costs about a third more, so tok/s falls by about a quarter
    verify = next(r for r in doc["injected"] if r["where"] == "verify")
    assert verify["measured_slowdown"] > 0.2, verify
