"""bench/profile_decode_overhead.py's CPU smoke path: the JSON's structure, plain and oracle steps of the one engine
through the same request, and the argument checks (no timing is asserted; off CUDA no runtime calls are counted)."""

from __future__ import annotations

import json

import pytest

from _bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("profile_decode_overhead")


def test_cpu_report_structure(bench, tmp_path):
    assert bench.main([str(tmp_path), "--tiny", "--device", "cpu", "--prompt-len", "8", "--new-tokens", "9",
                       "--k", "2", "--repeats", "1", "--reps", "1"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["decode_overhead.json"]  # written atomically: no temp left
    report = json.loads((tmp_path / "decode_overhead.json").read_text())
    assert report["schema_version"] == 2 and "engines" not in report  # one engine (#28)
    kinds = report["kinds"]
    # 9 tokens: the first from the prefill, then 8 plain steps, or 8 / (K + 1) = 3 oracle steps (full acceptance)
    assert kinds["plain"]["steps"] == 8 and kinds["oracle"]["steps"] == 3
    for figures in kinds.values():
        assert figures["step_wall_ms"] > 0 and figures["verify_ms"] > 0
        assert figures["runtime_calls_per_step"] == {}  # no CUDA runtime on the CPU
        assert figures["top_level_aten_ops_per_step"]  # the loop's host ops are listed


def test_bad_arguments(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["out", "--tiny", "--new-tokens", "1"])
    assert "--new-tokens >= 2" in capsys.readouterr().err
