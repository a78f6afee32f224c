"""bench/prefill_variants.py's CPU smoke path: the JSON's structure, the eager group against one-slot prefills, and the argument
checks (no timing is asserted; the compiled variants are exercised on the GPU tier)."""

from __future__ import annotations

import json

import pytest

from _bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("prefill_variants")


def test_cpu_report_structure(bench, tmp_path):
    assert bench.main([str(tmp_path), "--tiny", "--device", "cpu", "--variants", "eager", "--groups", "2,3",
                       "--prompt-len", "8", "--reps", "1"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["prefill_variants.json"]  # written atomically: no temp left
    points = json.loads((tmp_path / "prefill_variants.json").read_text())["points"]
    assert [(p["variant"], p["prompts"], p["tokens"]) for p in points] == [("eager", 2, 16), ("eager", 3, 24)]
    for point in points:  # against each prompt's one-slot prefill: fp32, other matmul shapes, equal to rounding
        assert point["max_abs_logit_diff"] < 1e-4 and point["argmax_agreement"] == 1.0
        assert point["graphs_compiled_first_call"] == 0 and point["graphs_compiled_while_timed"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--variants", "eager,own"], "got own"),
    (["--groups", "1,2"], "--groups of at least 2 prompts"),
])
def test_bad_arguments(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(["out", "--tiny", "--device", "cpu", *argv])
    assert message in capsys.readouterr().err
