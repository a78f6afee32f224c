"""Launch-bound runs (a tiny reference target on CUDA) say so next to their speedup: in `specbench run`'s table, the
dashboard's status table and trend legend, and the Markdown summary; runs that are not (CPU, the synthetic 7B on
CUDA) carry no such words."""

from __future__ import annotations

import copy

import pytest

from specbench.cli.run_command import lossless_report, results_table
from specbench.gating.history import append_results, load_history
from specbench.gating.launch_bound import LAUNCH_BOUND_NOTE, LAUNCH_BOUND_WORDS, launch_bound
from specbench.report.arguments import main as report_main
from specbench.report.html import render_html
from specbench.report.status import status_rows
from tests._synthetic_results import make_result


def _on(result: dict, *, device: str, target: str | None = None, name: str | None = None) -> dict:
    """``result`` as if run on ``device`` (and ``target``): the case and hardware class a GPU run records."""
    moved = copy.deepcopy(result)
    moved["case"]["device"] = device
    if target:
        moved["case"]["target"] = target
    if name:
        moved["case"]["name"] = name
        moved["case_id"] = f"{moved['case']['suite']}/{name}"
    moved["env"]["hardware_class"] = "NVIDIA H200" if device.startswith("cuda") else "cpu"
    return moved


@pytest.mark.parametrize("case, expected", [
    ({"target": "specbench-ref/gsm8k-tiny", "device": "cuda"}, True),
    ({"target": "specbench-tiny/random-llama", "device": "cuda:1"}, True),
    ({"target": "specbench-ref/gsm8k-tiny", "device": "cpu"}, False),  # every CPU step is compute
    ({"target": "${SPECBENCH_SYNTH_DIR}/target", "device": "cuda"}, False),  # the 7B shape: GPU-bound
    (None, False),
])
def test_launch_bound_is_a_tiny_reference_target_on_cuda(case, expected):
    assert launch_bound(case) is expected


def test_the_run_table_says_it_beside_the_speedup_and_explains_once():
    tiny_gpu = _on(make_result(seed=0), device="cuda")
    synth_gpu = _on(make_result(seed=1), device="cuda", target="/data/synth-7b/target", name="synth-7b-chain-k3")
    cpu = make_result(seed=2, name="chain-k5")
    results = [tiny_gpu, synth_gpu, cpu]
    table = results_table(results, [lossless_report(r) for r in results]).splitlines()
    rows = {line.split()[0]: line for line in table if line.startswith("medusa/")}
    speedup = f"{tiny_gpu['metrics']['speedup']:.2f}x launch-bound"
    assert speedup in rows["medusa/medusa-chain-k3"]
    assert "launch-bound" not in rows["medusa/synth-7b-chain-k3"] and "launch-bound" not in rows["medusa/chain-k5"]
    assert table[-1] == LAUNCH_BOUND_NOTE and "not the proposer's speed" in LAUNCH_BOUND_NOTE
    assert LAUNCH_BOUND_NOTE not in results_table([cpu], [lossless_report(cpu)])


@pytest.fixture()
def history(tmp_path):
    runs = [_on(make_result(seed=0), device="cuda"),
            _on(make_result(seed=1), device="cuda", target="/data/synth-7b/target", name="synth-7b-chain-k3")]
    append_results(tmp_path, runs)
    return tmp_path


def test_the_dashboard_marks_the_speedup_of_launch_bound_runs(history):
    rows = {row.case_id: row for row in status_rows(load_history(history), None)}
    assert rows["medusa/medusa-chain-k3"].launch_bound and not rows["medusa/synth-7b-chain-k3"].launch_bound
    assert rows["medusa/medusa-chain-k3"].to_dict()["launch_bound"] is True
    page = render_html(load_history(history), [], list(rows.values()))
    tiny_row = page[page.index('data-case="medusa/medusa-chain-k3"'):page.index('data-case="medusa/synth-7b-chain-k3"')]
    speedup_cell = tiny_row[tiny_row.index('class="measured" data-metric="speedup"'):]
    assert speedup_cell[:speedup_cell.index("</td>")].count(LAUNCH_BOUND_WORDS.replace("'", "&#39;")) == 1
    synth_row = page[page.index('data-case="medusa/synth-7b-chain-k3"'):]
    assert LAUNCH_BOUND_WORDS.replace("'", "&#39;") not in synth_row[:synth_row.index("</tr>")]


def test_the_markdown_summary_says_it_next_to_the_figure(history, capsys):
    assert report_main(["report", "--format", "markdown", "--history", str(history)]) == 0
    out = capsys.readouterr().out
    tiny = next(line for line in out.splitlines() if line.startswith("| medusa/medusa-chain-k3"))
    synth = next(line for line in out.splitlines() if line.startswith("| medusa/synth-7b-chain-k3"))
    speedup = [cell.strip() for cell in tiny.strip("|").split("|")][6]
    assert speedup.endswith(f"({LAUNCH_BOUND_WORDS})")
    assert "launch-bound" not in synth and "launch-bound: a tiny reference target on CUDA" in out
