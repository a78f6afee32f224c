"""bench/batch_curve.py's CPU smoke path: a tiny random Llama at B = 1, 2, 3; the JSON's structure, the oracle at
full acceptance at every B, the profile below it, and the argument checks (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from _bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("batch_curve")


@pytest.fixture(scope="module")
def report(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("curve")
    assert bench.main([str(out), "--tiny", "--device", "cpu", "--batch-sizes", "1,2,3", "--new-tokens", "8",
                       "--prompt-len", "6", "-k", "3"]) == 0
    assert not [p.name for p in out.iterdir() if p.name != "batch_curve.json"]  # written atomically: no temp left
    return json.loads((out / "batch_curve.json").read_text())


def test_report_structure(report):
    assert report["schema_version"] == 2 and report["settings"]["batch_sizes"] == [1, 2, 3]
    assert [p["batch_size"] for p in report["curve"]] == [1, 2, 3]
    for point in report["curve"]:
        assert point["cuda_graphs"] is False  # the CPU runs eagerly
        for kind in ("plain", "oracle", "medusa_profile"):
            figures = point[kind]
            assert figures["num_requests"] == 2 * point["batch_size"]  # --rounds 2
            assert figures["num_output_tokens"] == 8 * figures["num_requests"]  # EOS ignored
            for key in ("throughput_tokens_per_s", "time_per_output_token_s", "ttft_s", "ttft_from_start_s", "wall_s",
                        "decode_throughput_tokens_per_s", "admission_s", "decode_s"):
                assert figures[key] > 0, (kind, key)
            assert figures["admission_s"] + figures["decode_s"] <= figures["wall_s"]  # the run's two phases, apart
            assert "peak_memory_bytes" in figures  # None off CUDA
            assert figures["compiled_while_timed"] == 0  # the CPU engine compiles nothing; on CUDA the warm-up does
            assert figures["captured_while_timed_s"] == 0.0  # nor captures
        assert point["plain"]["num_drafts"] == 0 and point["plain"]["mean_acceptance_length"] == 1.0
        assert point["oracle"]["speedup_vs_plain"] > 0 and point["medusa_profile"]["speedup_vs_plain"] > 0
    assert "single_sequence_batch_1" not in report  # one engine: B = 1 is the curve's first point (#28)
    assert set(report["summary"]) == {"plain_throughput_b3_over_b1", "plain_decode_throughput_b3_over_b1",
                                      "crossover_batch_size_oracle", "crossover_batch_size_medusa_profile"}


def test_a_fused_prefill_curve_decodes_the_eager_tokens_and_compiles_nothing_while_timed(bench, tmp_path):
    """--fused-prefill: every admission of 3 prompts goes through the compiled stages (CPU: inductor's C++ kernels),
    no timed run compiles, and the oracle, scripted by the eager engine, is fully accepted (the same tokens)."""
    assert bench.main([str(tmp_path), "--tiny", "--device", "cpu", "--batch-sizes", "3", "--new-tokens", "4",
                       "--prompt-len", "6", "-k", "2", "--fused-prefill"]) == 0
    report = json.loads((tmp_path / "batch_curve.json").read_text())
    assert report["settings"]["fused_prefill"] is True
    (point,) = report["curve"]
    for kind in ("plain", "oracle", "medusa_profile"):
        assert point[kind]["compiled_while_timed"] == 0, kind
        assert point[kind]["num_requests"] == 6  # --rounds 2 at B = 3: a refill admission too
    # the oracle's script came from the eager prefill: full acceptance means the fused one decodes the same tokens
    assert point["oracle"]["acceptance_rate"] == 1.0


def test_the_oracle_is_fully_accepted_at_every_batch_size(report):
    for point in report["curve"]:
        assert point["oracle"]["acceptance_rate"] == 1.0, point["batch_size"]
        assert point["oracle"]["mean_acceptance_length"] == 4.0  # K + 1 tokens per forward
        assert point["medusa_profile"]["acceptance_rate"] < 1.0


def test_help_and_bad_batch_sizes(bench, capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0 and "--batch-sizes" in capsys.readouterr().out
    for bad in ("1,1", "0,2", "a"):
        with pytest.raises(SystemExit) as done:
            bench.main(["out", "--tiny", "--batch-sizes", bad])
        assert done.value.code == 2 and "--batch-sizes" in capsys.readouterr().err
