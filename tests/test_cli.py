"""The specbench command line: explicit runs, suite runs, errors and --help."""

from __future__ import annotations

import json

import pytest

from specbench.cli import main


@pytest.fixture(autouse=True)
def history_in_tmp(tmp_path, monkeypatch):
    """`specbench run` records every run in the default history: keep these runs out of the repo's."""
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(tmp_path / "history"))


def test_explicit_run_writes_a_complete_result(tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main([
        "run", "--target", "specbench-tiny/random-llama", "--proposer", "ngram", "--num-speculative-tokens", "2", "--prompts", "synthetic", "--num-prompts", "2",
        "--max-new-tokens", "12", "--output", str(out), "-q",
    ])
    assert code == 0
    table = capsys.readouterr().out
    assert "cli/ngram" in table and "exact" in table
    result = json.loads(out.read_text())
    assert set(result) >= {"case", "metrics", "requests", "correctness", "env"}
    from specbench.metrics import METRIC_NAMES

    assert set(METRIC_NAMES) <= set(result["metrics"])
    assert len(result["requests"]) == 2
    for request in result["requests"]:
        assert len(request["output_token_ids"]) == 12
        assert request["output_token_ids"] == request["plain_output_token_ids"]  # greedy, fp32: lossless
    assert result["env"]["hardware_class"] == "cpu"


def test_unknown_proposer_is_a_clear_error(capsys):
    code = main(["run", "--proposer", "nope", "--prompts", "synthetic", "--num-prompts", "1", "-q"])
    assert code == 2
    assert "unknown proposer 'nope'" in capsys.readouterr().err


def test_unknown_suite(capsys):
    assert main(["run", "no-such-suite"]) == 2
    assert "unknown suite 'no-such-suite'" in capsys.readouterr().err


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "mean acceptance length" in text and "--num-speculative-tokens" in text


def test_explicit_form_defaults_to_the_reference_models(tmp_path):
    """`specbench run --prompts X` alone is a complete command: reference target, its Medusa heads,
    their calibrated tree."""
    out = tmp_path / "r.json"
    code = main(["run", "--prompts", "gsm8k-embedded", "--num-prompts", "2", "--max-new-tokens", "16",
                 "--output", str(out), "-q", "--no-gate"])
    assert code == 0
    case = json.loads(out.read_text())["case"]
    assert case["target"] == "specbench-ref/gsm8k-tiny"
    assert case["proposer"] == {"name": "medusa", "path": "specbench-ref/gsm8k-tiny-medusa", "tree": "gsm8k-tiny-63"}


def test_medusa_on_another_target_needs_its_heads(capsys):
    assert main(["run", "--target", "./some-model", "--prompts", "gsm8k", "-q"]) == 2
    assert "needs --proposer-path" in capsys.readouterr().err


def test_regenerate_from_recorded_results_stores_them_without_rerunning(tmp_path, capsys):
    from _synthetic_results import make_result

    from specbench.gating.baselines import BaselineStore

    gpu = make_result(seed=1, hardware_class="NVIDIA-H200", name="chain-k3-cuda-fp32")
    other = make_result(seed=2, name="tree-63")
    ngram = make_result(seed=3, suite="ngram", name="k3")
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (gpu, other, ngram)))
    store = tmp_path / "baselines"

    assert main(["baselines", "regenerate", "medusa", "--from-results", str(results), "-k", "cuda",
                 "--baselines", str(store), "--reason", "H200 results of the GPU tier"]) == 0
    entry = BaselineStore(store).entry("medusa/chain-k3-cuda-fp32")
    assert list(entry["speed"]) == ["NVIDIA-H200"]  # the class the result recorded, not this machine's
    assert entry["quality"]["metrics"]["acceptance_rate"] == pytest.approx(gpu["metrics"]["acceptance_rate"], rel=1e-5)
    assert BaselineStore(store).case_ids() == ["medusa/chain-k3-cuda-fp32"]  # -k and the suite filtered the rest

    assert main(["baselines", "regenerate", "ngram", "--from-results", str(results), "-k", "cuda",
                 "--baselines", str(store), "--reason", "H200 results of the GPU tier"]) == 2
    assert "no results of suite ngram matching -k 'cuda' in" in capsys.readouterr().err
