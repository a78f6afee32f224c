"""bench/proposer_table.py: issue #29's table from stored results, one row per result, launch-bound runs saying so."""

from __future__ import annotations

import copy
import json

from tests._bench_scripts import load_bench_script
from tests._synthetic_results import make_result

table = load_bench_script("proposer_table")


def test_a_row_per_result_with_cost_prediction_and_the_launch_bound_words(tmp_path, capsys):
    synth = make_result(seed=0, name="synth-7b-eagle3-chain-k3", suite="speed")
    synth["case"].update(target="/data/synth-7b/target", device="cuda", proposer={"name": "eagle3", "path": "/x",
                                                                                  "num_speculative_tokens": 3})
    tiny = copy.deepcopy(make_result(seed=1))
    tiny["case"]["device"] = "cuda"
    results = tmp_path / "run.json"
    results.write_text(json.dumps({"results": [synth, tiny]}))
    out = tmp_path / "nested" / "speed_7b_proposers.md"
    assert table.main([str(results), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines == capsys.readouterr().out.splitlines() and len(lines) == 4  # header, rule, two rows
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert cells[:2] == ["speed/synth-7b-eagle3-chain-k3", "eagle3 num_speculative_tokens=3"]  # the path left out
    m = synth["metrics"]
    assert cells[8] == f"{m['mean_acceptance_length']:.2f}" and cells[11] == f"{m['draft_cost_ratio']:.3f}"
    assert cells[6] == f"{m['predicted_speedup']:.3f}" and "launch-bound" not in lines[2]
    assert "(launch-bound: host overhead)" in lines[3].split("|")[5]
    assert not list(out.parent.glob(".*"))  # the staging file was renamed into place
