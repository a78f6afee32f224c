"""The command line does what it says: every `run` flag applies (an override renames the case, which then has no
baseline) or is refused naming itself; runs are recorded where `specbench report` reads; bad input is one line and
exit status 2 (tests/test_cli_bad_input.py); the lossless verdict is gates.check_correctness's; the default output is one line per case.

Where running a model is not the point, specbench.run.harness.run_case is replaced by a stand-in that returns a
synthetic result for the case it was given (tests/_synthetic_results.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from _cli_output import error_line
from _synthetic_results import make_result, with_divergence

from specbench.cli import build_parser, exit_status, gate_results, main

# the suites shipped as specbench/cases/*.toml, listed from the directory, not from the code under test
SHIPPED_SUITES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "specbench" / "cases").glob("*.toml"))



@pytest.fixture(autouse=True)
def history_in_tmp(tmp_path, monkeypatch):
    """Every `specbench run` here records into tmp_path/history, never into the repo's."""
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(tmp_path / "history"))


@pytest.fixture()
def fake_run(monkeypatch):
    """Replace run_case: record each case it is given and return a synthetic result of that case."""
    state = SimpleNamespace(cases=[], progress=[], accept_scale=1.0, divergence=None)

    def run_case(case, *, progress=True, **_):
        state.cases.append(case)
        state.progress.append(progress)
        result = make_result(num_requests=case.prompts.get("num_prompts") or 4, dtype=case.dtype, name=case.name,
                             suite=case.suite, max_new_tokens=16, accept_scale=state.accept_scale)
        if state.divergence is not None:
            result = with_divergence(result, 0, 3, match_fraction=state.divergence)
        result["case"] = case.to_dict()
        return SimpleNamespace(to_dict=lambda: result)

    monkeypatch.setattr("specbench.run.harness.run_case", run_case)
    return state


# ---- 1. every run flag applies or is refused -------------------------------------------------------------


def test_overrides_change_the_stored_case_and_its_id(fake_run, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["run", "medusa/chain-k3", "--max-new-tokens", "8", "--num-prompts", "2", "--temperature", "0.7",
                 "--seed", "5", "--ignore-eos", "--dtype", "bfloat16", "--output", str(out), "--no-history"]) == 0
    (case,) = fake_run.cases
    expected_id = "medusa/chain-k3[max_new_tokens=8,num_prompts=2,temperature=0.7,seed=5,ignore_eos=true,dtype=bfloat16]"
    assert case.case_id == expected_id
    assert (case.max_new_tokens, case.prompts, case.sampling, case.seed, case.ignore_eos, case.dtype, case.device) == (
        8, {"name": "gsm8k-embedded", "num_prompts": 2}, {"temperature": 0.7}, 5, True, "bfloat16", "cpu")
    result = json.loads(out.read_text())
    assert result["case_id"] == expected_id and result["case"]["max_new_tokens"] == 8
    assert ("1 case changed by --max-new-tokens, --num-prompts, --temperature, --seed, --ignore-eos, --dtype: "
            "not compared with the stored baselines, lossless check only") in capsys.readouterr().out.splitlines()


def test_an_override_equal_to_the_stored_setting_changes_nothing(fake_run):
    assert main(["run", "medusa/chain-k3", "--max-new-tokens", "64", "--device", "cpu", "--no-gate", "--no-history"]) == 0
    assert [c.case_id for c in fake_run.cases] == ["medusa/chain-k3"]


def test_overrides_apply_to_the_default_suite_too(fake_run):
    assert main(["run", "--max-new-tokens", "8", "--no-history"]) == 0
    assert [c.case_id for c in fake_run.cases] == ["medusa/chain-k3[max_new_tokens=8]", "medusa/tree-63[max_new_tokens=8]"]


def test_an_overridden_case_is_never_gated_against_the_unmodified_baseline(fake_run, tmp_path, capsys):
    baselines = str(tmp_path / "baselines")
    assert main(["run", "medusa/chain-k3", "--update-baselines", "--reason", "first baseline", "--baselines", baselines,
                 "--no-history"]) == 0
    fake_run.accept_scale = 0.5  # acceptance halves: a regression against that baseline
    assert main(["run", "medusa/chain-k3", "--baselines", baselines, "--no-history"]) == 1
    assert "medusa/chain-k3: acceptance_rate regressed" in capsys.readouterr().out
    assert main(["run", "medusa/chain-k3", "--num-prompts", "8", "--baselines", baselines, "--no-history"]) == 0
    out = capsys.readouterr().out
    assert "regressed" not in out
    assert "medusa/chain-k3[num_prompts=8]: PASSED (1 pass)" in out.splitlines()


def test_update_baselines_records_its_reason(fake_run, tmp_path, capsys):
    from specbench.gating.baselines import BaselineStore

    baselines = tmp_path / "baselines"
    reason = "the chain case's first baseline"
    assert main(["run", "medusa/chain-k3", "--update-baselines", "--reason", reason, "--baselines", str(baselines),
                 "--no-history"]) == 0
    assert f"  reason: {reason}" in capsys.readouterr().out.splitlines()  # printed with the diff
    entry = BaselineStore(baselines).entry("medusa/chain-k3")
    assert entry["quality"]["provenance"]["reason"] == entry["speed"]["cpu"]["provenance"]["reason"] == reason


@pytest.mark.parametrize("argv, message", [
    (["medusa/chain-k3", "--target", "x"],
     "specbench: error: --target describes a new case (the explicit form), so it cannot change the stored case(s) "
     "'medusa/chain-k3'; drop medusa/chain-k3 to run the explicit form, or drop --target (the stored cases' "
     "settings are edited in their suite file)"),
    (["medusa/chain-k3", "--name", "x"],
     "specbench: error: --name names the case of the explicit form (--target/--proposer/--prompts ...); a stored "
     "case keeps its own name: drop --name"),
    (["--prompts", "synthetic", "-k", "x"],
     "specbench: error: -k selects cases of a suite, and the explicit form runs the one case its flags describe; "
     "drop -k"),
    (["medusa/chain-k3", "--n-shot", "2"],
     "specbench: error: n_shot applies to the gsm8k prompt set only, and case medusa/chain-k3 uses 'gsm8k-embedded'; "
     "drop the n_shot override (--n-shot)"),
    (["--prompts", "synthetic", "--n-shot", "2"],
     "specbench: error: --n-shot applies to --prompts gsm8k only, not 'synthetic'; drop --n-shot"),
    (["--proposer", "none", "--tree", "gsm8k-tiny-63", "--prompts", "synthetic"],
     "specbench: error: --proposer none decodes plainly, so --tree does not apply; drop it"),
    (["--proposer", "ngram", "--tree", "gsm8k-tiny-63", "--prompts", "synthetic"],
     "specbench: error: --tree applies to --proposer medusa only, not 'ngram'; drop --tree"),
    (["--no-gate", "--update-baselines"],
     "specbench: error: --no-gate has no effect with --update-baselines (it stores the results, it gates nothing); "
     "drop --no-gate"),
    (["--no-gate", "--baselines", "b"],
     "specbench: error: --baselines has no effect with --no-gate (nothing is compared); drop one of them"),
    (["medusa/chain-k3", "--max-new-tokens", "8", "--update-baselines", "--reason", "r"],
     "specbench: error: --update-baselines stores the baselines of the stored cases, and --max-new-tokens changes "
     "them (it would store medusa/chain-k3[max_new_tokens=8]); drop the override, or edit the case in its suite "
     "file and run `specbench baselines regenerate --reason TEXT`"),
    (["medusa/chain-k3", "--update-baselines"],
     'specbench: error: storing baselines needs a reason: pass --reason "TEXT" saying why they change (e.g. '
     '--reason "new verify kernel, measured faster"); it is recorded in each entry\'s provenance'),
    (["medusa/chain-k3", "--update-baselines", "--reason", "  "],
     'specbench: error: storing baselines needs a reason: pass --reason "TEXT" saying why they change (e.g. '
     '--reason "new verify kernel, measured faster"); it is recorded in each entry\'s provenance'),
    (["medusa/chain-k3", "--reason", "r"],
     "specbench: error: --reason is recorded only when baselines are stored: add --update-baselines, or drop "
     "--reason (a run without it gates against the stored baselines)"),
    (["--history", "h", "--no-history"],
     "specbench run: error: argument --no-history: not allowed with argument --history "
     "(see `specbench run --help`)"),
])
def test_flags_that_cannot_apply_are_refused_naming_the_flag(fake_run, capsys, argv, message):
    assert main(["run", *argv]) == 2
    assert error_line(capsys) == message
    assert fake_run.cases == []


@pytest.mark.parametrize("flag, value, expected", [
    ("--max-new-tokens", "-1", "expected an integer >= 1, got '-1'"),
    ("--max-new-tokens", "0", "expected an integer >= 1, got '0'"),
    ("--num-prompts", "0", "expected an integer >= 1, got '0'"),
    ("--num-prompts", "two", "expected an integer >= 1, got 'two'"),
    ("--n-shot", "-1", "expected an integer >= 0, got '-1'"),
    ("--num-speculative-tokens", "0", "expected an integer >= 1, got '0'"),
    ("--temperature", "-0.5", "expected a number >= 0 (0 = greedy), got '-0.5'"),
    ("--temperature", "nan", "expected a number >= 0 (0 = greedy), got 'nan'"),
    ("--seed", "-3", "expected an integer from 0 to 2**32 - 1, got '-3'"),
    ("--dtype", "fp8", "invalid choice: 'fp8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("--device", "gpu", "expected cpu, cuda, cuda:N or mps, got 'gpu'"),
    ("--proposer", "foo", "unknown proposer 'foo'; expected one of draft, eagle, eagle3, medusa, ngram, none (plug-ins register under "
                          "the entry-point group 'specbench.proposers')"),
])
@pytest.mark.parametrize("spec", [[], ["medusa/chain-k3"]])
def test_bad_values_are_refused_in_one_line_naming_flag_value_and_expected(fake_run, capsys, spec, flag, value, expected):
    assert main(["run", *spec, flag, value]) == 2
    assert error_line(capsys) == f"specbench run: error: argument {flag}: {expected} (see `specbench run --help`)"
    assert fake_run.cases == []


def test_cuda_without_cuda_is_refused(fake_run, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", "medusa/chain-k3", "--device", "cuda"]) == 2
    assert error_line(capsys) == ("specbench run: error: argument --device: 'cuda' needs a CUDA device and this "
                                  "machine has none (torch.cuda.is_available() is False); use --device cpu "
                                  "(see `specbench run --help`)")


@pytest.mark.parametrize("content, message", [
    (b'[[case]]\nname = "a"\nmax_new_tokens = -1\n', "{path} case 0: max_new_tokens must be an integer >= 1, found -1"),
    (b'[[case]]\nname = "a"\nsampling = { temperature = -1 }\n',
     "{path} case 0: sampling.temperature must be a number >= 0 (0 = greedy), found -1"),
    (b'[[case]]\nname = 3\n', "{path} case 0: name must be a non-empty string without '/', found 3"),
    (b"\xff\xfe[[case", "{path}: not UTF-8 text (invalid start byte at byte 0); TOML files must be UTF-8"),
])
def test_case_file_values_are_checked(fake_run, tmp_path, capsys, content, message):
    path = tmp_path / "mine.toml"
    path.write_bytes(content)
    assert main(["run", str(path)]) == 2
    assert error_line(capsys) == "specbench: error: " + message.format(path=path)
    assert fake_run.cases == []


# ---- 2. runs are recorded where `specbench report` reads ---------------------------------------------------


def test_run_then_report_works_on_the_default_history(fake_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    history = tmp_path / "history"  # $SPECBENCH_HISTORY_DIR, set by the autouse fixture
    assert main(["report", "--out", str(tmp_path / "site")]) == 0
    assert error_line(capsys) == (
        f"specbench report: nothing recorded yet in {history}: `specbench run` records every run there (unless "
        "--no-history), as does `pytest suites/` (unless --specbench-no-history); run one, then `specbench report` again")
    assert main(["run", "medusa/chain-k3", "--num-prompts", "2"]) == 0
    (record,) = history.glob("*.jsonl")
    assert f"recorded in {record} (`specbench report` renders the history)" in capsys.readouterr().out.splitlines()
    assert main(["report", "--out", str(tmp_path / "site")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'site' / 'index.html'} (1 run, 0 flagged regressions)\n"


def test_a_real_run_then_report_renders_the_run_in_the_dashboard(tmp_path, monkeypatch, capsys):
    """No stand-in: the reference model decodes, the history records it, the dashboard shows its case."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "medusa/chain-k3", "--num-prompts", "1", "--max-new-tokens", "6", "-q"]) == 0
    capsys.readouterr()
    assert main(["report", "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "medusa/chain-k3[max_new_tokens=6,num_prompts=1]" in page
    assert "1 run of 1 case" in page


def test_the_default_history_is_at_the_repo_root(fake_run, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECBENCH_HISTORY_DIR")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["run", "medusa/chain-k3", "--num-prompts", "2"]) == 0
    assert len(list((tmp_path / ".specbench" / "history").glob("*.jsonl"))) == 1


def test_no_history_and_history_dir(fake_run, tmp_path):
    assert main(["run", "medusa/chain-k3", "--num-prompts", "2", "--no-history"]) == 0
    assert not (tmp_path / "history").exists()
    assert main(["run", "medusa/chain-k3", "--num-prompts", "2", "--history", str(tmp_path / "mine")]) == 0
    assert len(list((tmp_path / "mine").glob("*.jsonl"))) == 1 and not (tmp_path / "history").exists()


def test_report_on_a_missing_explicit_history_is_bad_input(tmp_path, capsys):
    assert main(["report", "--history", str(tmp_path / "typo")]) == 2
    assert error_line(capsys) == (
        f"specbench report: error: history directory {tmp_path / 'typo'} does not exist; pass the directory that "
        "`specbench run --history DIR` or `pytest --specbench-history DIR` recorded into, or leave --history out for "
        "the default one")


# ---- 4. one lossless verdict: gates.check_correctness ------------------------------------------------------


@pytest.mark.parametrize("dtype, match_fraction, status", [
    ("bfloat16", 0.95, 0), ("bfloat16", 0.3, 1), ("float32", 0.95, 1), ("float16", 0.5, 0),
])
@pytest.mark.parametrize("gate", [True, False])
def test_the_exit_status_follows_check_correctness(tmp_path, dtype, match_fraction, status, gate):
    from specbench.gating.baselines import BaselineStore

    result = with_divergence(make_result(dtype=dtype), 0, 3, match_fraction=match_fraction)
    result["case"]["dtype"] = dtype
    assert result["correctness"]["exact"] is False
    reports = gate_results([result], BaselineStore(tmp_path), gate=gate)
    assert exit_status(reports) == status
    check = reports[0].correctness
    assert (check.name, check.status) == ("exact_match" if dtype == "float32" else "match_fraction",
                                          "pass" if status == 0 else "fail")


def test_a_bf16_run_whose_gate_passes_exits_0(fake_run, capsys):
    fake_run.divergence = 0.95
    assert main(["run", "medusa/chain-k3", "--dtype", "bfloat16", "--num-prompts", "2", "--no-history"]) == 0
    out = capsys.readouterr().out
    assert "match 0.950 (min 0.50)" in out
    fake_run.divergence = 0.3
    assert main(["run", "medusa/chain-k3", "--dtype", "bfloat16", "--num-prompts", "2", "--no-history"]) == 1
    assert "DIVERGED 0.300 (min 0.50)" in capsys.readouterr().out


# ---- 5. help and messages ----------------------------------------------------------------------------------


def subparser(*names: str):
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("command", [("run",), ("calibrate-tree",)])
def test_help_explains_every_flag_and_shows_each_default_once(command, capsys):
    parser = subparser(*command)
    undocumented = [a.dest for a in parser._actions if not a.help]
    assert undocumented == []
    assert [a.dest for a in parser._actions if (a.help or "").count("default") > 1] == []
    text = parser.format_help()  # defaults are written by hand: argparse adds none of its own
    assert "(default: None)" not in text and parser.formatter_class is not argparse.ArgumentDefaultsHelpFormatter
    if command == ("run",):
        assert text.count("(default medusa)") == 1
        for flag in ("--max-new-tokens", "--seed", "--dtype", "--temperature", "--device", "--history"):
            assert flag in text


def test_baselines_show_an_unknown_suite_names_it_and_the_known_ones(tmp_path, capsys):
    from specbench.gating.regenerate import update_baseline

    update_baseline(make_result(name="chain-k3"), tmp_path, command="test", reason="test")
    capsys.readouterr()
    assert main(["baselines", "show", "nosuite", "--baselines", str(tmp_path)]) == 2
    assert error_line(capsys) == (
        f"specbench: error: no baselines stored for suite 'nosuite' in {tmp_path} (suites with baselines there: "
        f"medusa; built-in suites: {', '.join(SHIPPED_SUITES)}); store them with "
        "`specbench baselines regenerate nosuite --reason TEXT`")
    assert main(["baselines", "show", "medusa", "--baselines", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("medusa/chain-k3: acceptance ")


# ---- 6. quiet by default -----------------------------------------------------------------------------------


def test_default_output_is_a_line_per_case_and_one_per_kind_of_skip(fake_run, tmp_path, capsys):
    baselines = tmp_path / "baselines"
    assert main(["run", "--no-history", "--baselines", str(baselines)]) == 0
    out = capsys.readouterr().out.splitlines()
    gate = out[out.index("") + 1:]
    path = baselines / "medusa.json"
    assert not path.exists()  # so no line names it: there is nothing there to look at
    assert gate == ["medusa/chain-k3: PASSED (1 pass, 13 no_baseline)",
                    "medusa/tree-63: PASSED (1 pass, 13 no_baseline)",
                    "no baseline for 2 cases (26 metrics); -v for details"]

    assert main(["run", "--no-history", "--update-baselines", "--reason", "test", "--baselines", str(baselines)]) == 0
    capsys.readouterr()
    assert main(["run", "--no-history", "--baselines", str(baselines)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[out.index("") + 1:] == [
        f"medusa/chain-k3: PASSED (6 pass, 8 skipped) against {path}",
        f"medusa/tree-63: PASSED (6 pass, 8 skipped) against {path}",
        "speed not gated on CPU for 2 cases (16 metrics): shared machines are too noisy (set gate_speed = true in a "
        "case to gate it); -v for details"]

    assert main(["run", "--no-history", "--baselines", str(baselines), "-v"]) == 0
    out = capsys.readouterr().out
    assert out.count("CPU timings on shared machines are too noisy to gate") == 16
    assert out.count("exact_match ok") == 2


def test_cases_this_machine_cannot_run_are_one_line(fake_run, monkeypatch, capsys):
    from specbench.cases import load_suite

    monkeypatch.setattr("specbench.env.gpu_inventory", lambda: [])
    suite = load_suite("medusa")
    gpu_cases = [case for case in suite if case.device.startswith("cuda")]  # what a machine without CUDA cannot run
    assert 0 < len(gpu_cases) < len(suite)
    assert main(["run", "medusa", "--no-history", "--no-gate"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"skipped {len(gpu_cases)} of {len(suite)} cases that this machine cannot run (no CUDA device); -v lists them"]
    assert main(["run", "medusa", "--no-history", "--no-gate", "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"skipped: {case.case_id} (device='cuda'): no CUDA device" for case in gpu_cases]


def test_quiet_silences_the_libraries_progress_bars(fake_run, monkeypatch):
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    try:
        assert main(["run", "medusa/chain-k3", "--num-prompts", "2", "-q", "--no-history"]) == 0
        assert fake_run.progress == [False]
        assert not transformers_logging.is_progress_bar_enabled()
        assert transformers_logging.get_verbosity() == transformers_logging.ERROR
        assert hub_utils.are_progress_bars_disabled()
    finally:  # global switches: give the other tests their bars back
        transformers_logging.enable_progress_bar()
        transformers_logging.set_verbosity(verbosity)
        hub_utils.enable_progress_bars()


def test_engine_flag_overrides_a_stored_case_and_is_validated(capsys):
    """--engine static runs a stored case on StaticTarget under its own name (never against the eager baseline)."""
    from specbench.cli import build_parser, main
    from specbench.cli.run_command import _cases_to_run

    args = build_parser().parse_args(["run", "medusa/chain-k3", "--engine", "static", "--no-history"])
    (case,), changed = _cases_to_run(args)
    assert (case.engine, case.case_id) == ("static", "medusa/chain-k3[engine=static]")
    assert changed == {"medusa/chain-k3[engine=static]": {"engine": "static"}}
    assert main(["run", "--engine", "fast"]) == 2
    assert "argument --engine: invalid choice: 'fast'" in capsys.readouterr().err
