"""specbench's pytest plugin (entry point ``pytest11``): GPU markers, case fixtures, gates,
baseline updates, a results file and an end-of-session table of cases vs baselines.

Markers
    ``large_gpu(min_gb=N)``  skip unless CUDA device 0 has at least N GiB (binary, 2**30 bytes) of
                            total memory. vLLM's ``large_gpu_mark`` counts decimal GB (1e9 bytes):
                            its 24 GB is 22.35 GiB.
    ``multi_gpu(n)``         skip unless at least n CUDA devices are visible.
Options
    ``--specbench-update-baselines``  store each gated result as its case's baseline (refused when the
                                      run fails its correctness check) instead of gating it
    ``--specbench-results PATH``      append every case result as one JSON line (safe under xdist)
    ``--specbench-history DIR``       append every result and its gate outcome to a results history
    ``--specbench-baselines DIR``     baseline directory (default ``$SPECBENCH_BASELINES_DIR`` or ./baselines)
Fixtures
    ``specbench_run(case)``   run a Case (or "suite/name") through the harness, record, then gate it
    ``specbench_gate(result)`` gate (or store) an already computed result dict
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from pathlib import Path

import pytest

from specbench import env

RESULTS_KEY = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specbench", "speculative-decoding regression gates")
    group.addoption("--specbench-update-baselines", action="store_true", default=False,
                    help="store each case result as its baseline instead of gating it")
    group.addoption("--specbench-results", metavar="PATH", default=None,
                    help="append every case result to PATH as JSON lines")
    group.addoption("--specbench-history", metavar="DIR", default=None,
                    help="append every case result and its gate outcome to this results-history directory")
    group.addoption("--specbench-baselines", metavar="DIR", default=None,
                    help="baseline directory (default: $SPECBENCH_BASELINES_DIR or ./baselines)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "large_gpu(min_gb): needs a CUDA device with at least min_gb GiB (2**30 bytes) of memory")
    config.addinivalue_line("markers", "multi_gpu(n): needs at least n CUDA devices")
    config.stash[RESULTS_KEY] = []


def _skip_reason(item: pytest.Item) -> str | None:
    large = item.get_closest_marker("large_gpu")
    multi = item.get_closest_marker("multi_gpu")
    if large is None and multi is None:
        return None
    gpus = env.gpu_inventory()
    if large is not None:
        min_gb = large.kwargs.get("min_gb", large.args[0] if large.args else 0)
        shortfall = env.gpu_shortfall(min_gb, gpus)
        if shortfall:
            return f"large_gpu(min_gb={min_gb}): {shortfall}"
    if multi is not None:
        needed = multi.kwargs.get("n", multi.args[0] if multi.args else 2)
        if len(gpus) < needed:
            return f"multi_gpu({needed}): needs {needed} CUDA devices, found {len(gpus)}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = _skip_reason(item)
    if reason:
        pytest.skip(reason)


def _append_result_line(path: str, line: str) -> None:
    """One whole line per write under an exclusive lock: concurrent xdist workers never interleave."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Gatekeeper:
    """Records, gates or stores results for one test item."""

    def __init__(self, request: pytest.FixtureRequest):
        self.config = request.config
        self.node = request.node

    def __call__(self, result: dict) -> dict:
        from specbench.gating.regenerate import update_baseline
        from specbench.gating.baselines import BaselineStore, compare
        from specbench.harness import to_json

        config = self.config
        baselines_dir = config.getoption("--specbench-baselines")
        line = to_json(result, indent=None)
        results_path = config.getoption("--specbench-results")
        if results_path:
            _append_result_line(results_path, line)
        metrics = result["metrics"]
        for name in ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup"):
            self.node.user_properties.append((f"specbench.{name}", metrics.get(name)))
        self.node.user_properties.append(("specbench.case_id", result["case_id"]))
        row = {"case_id": result["case_id"], "metrics": metrics}
        if config.getoption("--specbench-update-baselines"):
            command = "pytest --specbench-update-baselines " + shlex.join(config.invocation_params.args)
            diff = update_baseline(result, baselines_dir, command=command)
            row.update(status="updated", detail=diff.format())
            config.stash[RESULTS_KEY].append(row)
            sys.stdout.write(diff.format() + "\n")
            return result
        report = compare(result, BaselineStore(baselines_dir) if baselines_dir else None)
        history = config.getoption("--specbench-history")
        if history:
            from specbench.gating.history import append_results

            append_results(history, [result], gate_reports=[report])
        self.node.user_properties.append(("specbench.gate", "pass" if report.passed else "fail"))
        row.update(status="pass" if report.passed else "FAIL", detail=report.format(only_problems=True))
        config.stash[RESULTS_KEY].append(row)
        if not report.passed:
            pytest.fail(report.format(only_problems=True), pytrace=False)
        return result


@pytest.fixture
def specbench_gate(request: pytest.FixtureRequest):
    """Gate (or, with --specbench-update-baselines, store) a result dict; fails the test on a regression."""
    return _Gatekeeper(request)


@pytest.fixture
def specbench_run(request: pytest.FixtureRequest, specbench_gate):
    """Run a case (a Case, a dict, or "suite/name") through the harness, then gate it; returns the result dict."""
    from specbench.cases import Case, find_case
    from specbench.harness import run_case

    def run(case) -> dict:
        if isinstance(case, str):
            (case,) = find_case(case)
        elif isinstance(case, dict):
            case = Case.from_dict(case)
        result = run_case(case, progress=False).to_dict()
        return specbench_gate(result)

    return run


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    rows = list(config.stash.get(RESULTS_KEY, []))
    if not rows:
        return
    terminalreporter.section("specbench: cases vs baselines")
    header = f"{'case':40} {'status':8} {'accept':>7} {'MAL':>6} {'tok/s':>8} {'speedup':>8}"
    terminalreporter.write_line(header)
    for row in rows:
        m = row["metrics"]

        def fmt(x, spec):
            return "-" if x is None or x != x else format(x, spec)

        terminalreporter.write_line(
            f"{row['case_id']:40} {row['status']:8} {fmt(m.get('acceptance_rate'), '7.3f')} "
            f"{fmt(m.get('mean_acceptance_length'), '6.2f')} {fmt(m.get('tokens_per_s'), '8.1f')} "
            f"{fmt(m.get('speedup'), '7.2f')}x"
        )
        for detail_line in (row.get("detail") or "").splitlines():
            if detail_line.strip() and row["status"] != "pass":
                terminalreporter.write_line(f"    {detail_line}")


def case_params(suite: str) -> list:
    """``pytest.param`` per case of a suite, id'd by case name, marked ``large_gpu`` when the case
    sets ``min_gpu_gib``; for ``@pytest.mark.parametrize("case", case_params("medusa"))``."""
    from specbench.cases import load_suite

    params = []
    for case in load_suite(suite):
        marks = [pytest.mark.large_gpu(min_gb=case.min_gpu_gib)] if case.min_gpu_gib else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def skip_unless_available(case) -> None:
    """Skip (with the precise reason) when the case's target, proposer checkpoint or prompts are not
    available here: no download is attempted when HF_HUB_OFFLINE=1."""
    from specbench.checkpoints.resolve import ModelUnavailable, resolve_model_dir
    from specbench.checkpoints.tiny import BUILTIN_TARGETS
    from specbench.prompts import DatasetUnavailable, load_prompts
    from specbench.references import ReferenceMissing

    from specbench.cases import expand_ref

    refs = [("target", case.target)] if case.target not in BUILTIN_TARGETS else []
    if case.proposer.get("path"):
        refs.append(("proposer.path", case.proposer["path"]))
    for key, ref in refs:
        try:
            resolve_model_dir(expand_ref(ref, key=key))
        except (ModelUnavailable, ReferenceMissing, ValueError) as err:
            pytest.skip(f"{case.case_id}: {err}")
    prompts = case.prompts.get("name")
    if prompts and prompts != "synthetic":
        try:
            load_prompts(prompts, num_prompts=case.prompts.get("num_prompts"), n_shot=case.prompts.get("n_shot", 1))
        except DatasetUnavailable as err:
            pytest.skip(f"{case.case_id}: {err}")
