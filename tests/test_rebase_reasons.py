"""Re-basing is deliberate: storing a baseline (library, `specbench baselines regenerate`, pytest's
--specbench-update-baselines) needs a reason, refused when missing, recorded in the provenance, printed with the
diff and by `specbench baselines show`; files stored before reasons were recorded still load.
(`specbench run --update-baselines` is covered with the other run flags in tests/test_cli_honest.py.)"""

from __future__ import annotations

import json

import pytest
from _cli_output import error_line
from _synthetic_results import make_result

from specbench.cli import main
from specbench.gating.baselines import BaselineError, BaselineFileError, BaselineStore, compare
from specbench.gating.regenerate import update_baseline

pytest_plugins = ["pytester"]

CASE_ID = "medusa/medusa-chain-k3"  # make_result's default case
REFUSAL = ('storing baselines needs a reason: pass {flag} "TEXT" saying why they change (e.g. {flag} "new verify '
           'kernel, measured faster"); it is recorded in each entry\'s provenance')


def _results_file(tmp_path, *results) -> str:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in results))
    return str(path)


def _provenances(entry: dict) -> list[dict]:
    return [entry["quality"]["provenance"], *(speed["provenance"] for speed in entry["speed"].values())]


@pytest.mark.parametrize("reason", [None, "", "   "])
def test_the_library_refuses_to_store_without_a_reason(tmp_path, reason):
    with pytest.raises(BaselineError, match="storing baselines needs a reason: pass --reason"):
        update_baseline(make_result(seed=0), tmp_path, command="test", reason=reason)
    assert not (tmp_path / "medusa.json").exists()


def test_regenerate_without_a_reason_is_refused_before_reading_anything(tmp_path, capsys):
    store = tmp_path / "baselines"
    missing = str(tmp_path / "no-such-results.jsonl")  # read first, it would be the error
    assert main(["baselines", "regenerate", "--from-results", missing, "--baselines", str(store)]) == 2
    assert error_line(capsys) == "specbench: error: " + REFUSAL.format(flag="--reason")
    assert main(["baselines", "regenerate", "--from-results", missing, "--baselines", str(store),
                 "--reason", " "]) == 2
    assert error_line(capsys) == "specbench: error: " + REFUSAL.format(flag="--reason")
    assert not store.exists()


def test_regenerate_records_the_reason_prints_it_and_show_reports_it(tmp_path, capsys):
    store = tmp_path / "baselines"
    gpu = make_result(seed=1, hardware_class="NVIDIA H200")
    reason = "H200 figures after the fused prefill"
    assert main(["baselines", "regenerate", "--from-results", _results_file(tmp_path, gpu), "--baselines",
                 str(store), "--reason", reason]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"{CASE_ID} -> {store / 'medusa.json'} (new baseline)", f"  reason: {reason}"]
    entry = BaselineStore(store).entry(CASE_ID)
    assert [p["reason"] for p in _provenances(entry)] == [reason, reason]  # quality, and speed on the H200

    assert main(["baselines", "show", "--baselines", str(store)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith(f"; stored {gpu['created_at']}: {reason!r}")


def test_a_file_stored_before_reasons_were_recorded_still_loads_and_gates(tmp_path, capsys):
    result = make_result(seed=0)
    update_baseline(result, tmp_path, command="test", reason="test")
    path = tmp_path / "medusa.json"
    data = json.loads(path.read_text())
    for provenance in _provenances(data["cases"]["medusa-chain-k3"]):
        del provenance["reason"]  # what every file written before the reason existed holds
    path.write_text(json.dumps(data))
    entry = BaselineStore(tmp_path).entry(CASE_ID)
    assert [p.get("reason") for p in _provenances(entry)] == [None, None]
    assert compare(result, tmp_path).passed  # the same run, gated against the old file
    assert main(["baselines", "show", "--baselines", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"; stored {result['created_at']}, no reason recorded")

    data["cases"]["medusa-chain-k3"]["quality"]["provenance"]["reason"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineFileError, match=r"medusa\.json: key 'cases\.medusa-chain-k3\.quality\.provenance"
                                                r"\.reason' must be a string or null, found 7"):
        BaselineStore(tmp_path).entry(CASE_ID)


GATED_TEST = """
import sys
sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result

def test_case(specbench_gate):
    specbench_gate(make_result(seed=0))
"""


@pytest.mark.parametrize("options, message", [
    (["--specbench-update-baselines"], REFUSAL.format(flag="--specbench-reason")),
    (["--specbench-update-baselines", "--specbench-reason", ""], REFUSAL.format(flag="--specbench-reason")),
    (["--specbench-reason", "why"], "--specbench-reason is recorded only when baselines are stored: add "
                                    "--specbench-update-baselines, or drop --specbench-reason"),
])
def test_the_pytest_option_without_its_reason_is_a_usage_error(pytester, request, options, message):
    pytester.makepyfile(test_gated=GATED_TEST.format(tests_dir=str(request.path.parent)))
    baselines = pytester.path / "baselines"
    result = pytester.runpytest("--specbench-baselines", str(baselines), "-p", "no:cacheprovider", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: {message}" in result.stderr.str().splitlines()
    assert not baselines.exists()  # no test ran, nothing was stored


def test_the_pytest_option_records_its_reason(pytester, request):
    pytester.makepyfile(test_gated=GATED_TEST.format(tests_dir=str(request.path.parent)))
    baselines = pytester.path / "baselines"
    reason = "the reference heads were retrained"
    result = pytester.runpytest("--specbench-baselines", str(baselines), "-p", "no:cacheprovider", "-s",
                                "--specbench-update-baselines", "--specbench-reason", reason)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"  reason: {reason}"])
    entry = BaselineStore(baselines).entry(CASE_ID)
    assert [p["reason"] for p in _provenances(entry)] == [reason, reason]
