"""specbench's pytest plugin (entry point ``pytest11``): GPU markers, case fixtures, gates,
baseline updates, a results file and an end-of-session table of cases vs baselines.

Markers
    ``large_gpu(min_gb=N)``  skip unless CUDA device 0 has at least N GiB (binary, 2**30 bytes) of
                            total memory. vLLM's ``large_gpu_mark`` counts decimal GB (1e9 bytes):
                            its 24 GB is 22.35 GiB.
    ``multi_gpu(n)``         skip unless at least n CUDA devices are visible.
Options
    ``--specbench-update-baselines``  store each gated result as its case's baseline (refused when the
                                      run fails its correctness check) instead of gating it; needs
    ``--specbench-reason TEXT``       why the baselines change, recorded in their provenance (a usage error
                                      when missing, or given without --specbench-update-baselines)
    ``--specbench-results PATH``      append every case result as one JSON line (safe under xdist)
    ``--specbench-history DIR``       the results history that every result and its gate outcome are appended
                                      to (default ``$SPECBENCH_HISTORY_DIR`` or .specbench/history at the repo
                                      root: where ``specbench report`` reads)
    ``--specbench-no-history``        record nothing in a results history
    ``--specbench-baselines DIR``     baseline directory (default ``$SPECBENCH_BASELINES_DIR`` or ./baselines)
    ``--specbench-compare BASE``      gate each case by an A/B against commit BASE on this machine, not the stored
                                      baselines (``--specbench-compare-rounds R``, default 5; specbench.plugin.ab_mode)
    ``--specbench-no-gpu-sharding``   under pytest-xdist, leave CUDA_VISIBLE_DEVICES alone (as does setting
                                      ``$SPECBENCH_NO_GPU_SHARDING`` to anything but "" or "0")
GPU sharding (pytest-xdist, ``-n N``)
    Each worker's CUDA_VISIBLE_DEVICES is set in its pytest_configure, before CUDA is initialised there: worker
    gwk sees GPU k mod G first, then the others in rotation (specbench.plugin.gpu_assignment), so ``multi_gpu(n)`` cases
    use their worker's GPU and the n-1 after it. The controller lists the GPUs (CUDA_VISIBLE_DEVICES, else
    env.gpu_inventory()) and hands the list to the workers; each result's ``env`` gains ``xdist_worker`` and
    ``cuda_visible_devices``, the workers' table rows come back to the controller's summary, with each worker's
    assignment and the session's wall time (docs/tensor_parallel.md, "Sharded GPU suites").
Fixtures
    ``specbench_run(case)``   run a Case (or "suite/name") through the harness, record, then gate it
    ``specbench_gate(result)`` gate (or store) an already computed result dict

Importing this module imports neither torch nor transformers (pytest loads it in every session through the
entry point): the fixtures import the harness and the gates when they run, and torch is imported (to list the
GPUs) only when a collected test carries a GPU marker, or on an xdist controller (``-n N``) whose
CUDA_VISIBLE_DEVICES is unset and whose GPU sharding is on.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from specbench import env
from specbench.plugin import gpu_assignment as gpus_of
from specbench.plugin import ab_mode
from specbench.plugin import sharding
from specbench.io.file_lock import locked
from specbench.gating.launch_bound import LAUNCH_BOUND_NOTE, launch_bound

RESULTS_KEY = pytest.StashKey[list]()
HISTORY_USED_KEY = pytest.StashKey[set]()
STARTED_KEY = pytest.StashKey[float]()  # time.perf_counter() at pytest_configure
_WORKER_OUTPUT = "specbench"  # the key of config.workeroutput that carries a worker's rows and assignment back


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specbench", "speculative-decoding regression gates")
    group.addoption("--specbench-update-baselines", action="store_true", default=False,
                    help="store each case result as its baseline instead of gating it (needs --specbench-reason)")
    group.addoption("--specbench-reason", metavar="TEXT", default=None,
                    help="with --specbench-update-baselines, required: why the baselines change, recorded in "
                         "their provenance")
    group.addoption("--specbench-results", metavar="PATH", default=None,
                    help="append every case result to PATH as JSON lines")
    group.addoption("--specbench-history", metavar="DIR", default=None,
                    help="append every case result and its gate outcome to this results-history directory "
                         "(default: $SPECBENCH_HISTORY_DIR or .specbench/history at the repo root)")
    group.addoption("--specbench-no-history", action="store_true", default=False,
                    help="do not append case results to any results history")
    group.addoption("--specbench-baselines", metavar="DIR", default=None,
                    help="baseline directory (default: $SPECBENCH_BASELINES_DIR or ./baselines)")
    ab_mode.add_options(group)
    group.addoption("--specbench-no-gpu-sharding", action="store_true", default=False,
                    help="under pytest-xdist, do not give each worker its own GPU through CUDA_VISIBLE_DEVICES "
                         f"(also: ${gpus_of.OPT_OUT_VAR}=1)")


@pytest.hookimpl(tryfirst=True)  # on an xdist worker, before other plugins' pytest_configure could initialise CUDA
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "large_gpu(min_gb): needs a CUDA device with at least min_gb GiB (2**30 bytes) of memory")
    config.addinivalue_line("markers", "multi_gpu(n): needs at least n CUDA devices")
    if config.getoption("--specbench-no-history") and config.getoption("--specbench-history"):
        raise pytest.UsageError("give --specbench-history DIR or --specbench-no-history, not both")
    _check_reason(config)
    ab_mode.check_options(config)
    config.stash[RESULTS_KEY] = []
    config.stash[HISTORY_USED_KEY] = set()
    config.stash[STARTED_KEY] = time.perf_counter()
    config.stash[sharding.WORKERS_KEY] = []
    if hasattr(config, "workerinput"):  # a worker of this session, not a process that inherited xdist's variables
        sharding.assign_worker_gpus(config)


def _check_reason(config: pytest.Config) -> None:
    """Storing baselines is deliberate: --specbench-update-baselines needs --specbench-reason, which alone is an
    error (it would be silently ignored)."""
    reason = config.getoption("--specbench-reason")
    if not config.getoption("--specbench-update-baselines"):
        if reason is not None:
            raise pytest.UsageError("--specbench-reason is recorded only when baselines are stored: add "
                                    "--specbench-update-baselines, or drop --specbench-reason")
        return
    from specbench.gating.baselines import BaselineError
    from specbench.gating.regenerate import require_reason

    try:
        require_reason(reason, flag="--specbench-reason")
    except BaselineError as err:
        raise pytest.UsageError(str(err)) from None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs) -> None:
    """Controller, before the workers start: list the GPUs once, say how they are shared."""
    sharding.announce_plan(config, len(specs))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller, per worker: hand it the GPU list (each worker picks its own order from its id)."""
    node.workerinput["specbench_gpus"] = node.config.stash[sharding.PLAN_KEY]["gpus"]  # set up by setupnodes


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """Controller, per finished worker: merge its table rows, history directories and GPU assignment."""
    output = (getattr(node, "workeroutput", None) or {}).get(_WORKER_OUTPUT)
    if not output:
        return
    config = node.config
    config.stash[RESULTS_KEY].extend(output.get("rows") or [])
    config.stash[HISTORY_USED_KEY].update(output.get("history") or [])
    if output.get("assignment"):
        config.stash[sharding.WORKERS_KEY].append(output["assignment"])


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):  # an xdist worker: its summary is the controller's to print
        # through JSON: workeroutput crosses execnet, which carries only plain values
        rows = json.loads(json.dumps(config.stash.get(RESULTS_KEY, []), default=str))
        config.workeroutput[_WORKER_OUTPUT] = {"rows": rows, "history": sorted(config.stash.get(HISTORY_USED_KEY, ())),
                                               "assignment": config.stash.get(sharding.ASSIGNMENT_KEY, None)}


def _needs_gpu(item: pytest.Item) -> bool:
    return item.get_closest_marker("large_gpu") is not None or item.get_closest_marker("multi_gpu") is not None


def _skip_reason(item: pytest.Item, gpus: list[tuple[str, float]]) -> str | None:
    """Why ``gpus`` (env.gpu_inventory()) cannot run ``item``'s large_gpu / multi_gpu requirement, or None."""
    large = item.get_closest_marker("large_gpu")
    multi = item.get_closest_marker("multi_gpu")
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


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: a deselected GPU test must not cost a torch import
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a skip mark added at collection, not pytest.skip() in a setup hook: pytest reports a mark's skip at the
    # test's own file and line (a skip raised in a hook would be reported at this file's line, for every test)
    gpus = None
    for item in items:
        if not _needs_gpu(item):
            continue
        if gpus is None:  # once per session, and only when a test asks for a GPU: it imports torch
            gpus = env.gpu_inventory()
        reason = _skip_reason(item, gpus)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def _append_result_line(path: str, line: str) -> None:
    """One whole line per write under an exclusive lock: concurrent xdist workers never interleave."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with locked(path), open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _history_dir(config: pytest.Config) -> Path | None:
    """--specbench-history, else the default history ($SPECBENCH_HISTORY_DIR or .specbench/history at the
    repo root, where `specbench report` looks); None with --specbench-no-history."""
    if config.getoption("--specbench-no-history"):
        return None
    if config.getoption("--specbench-history"):
        return Path(config.getoption("--specbench-history"))
    from specbench.gating.history import default_history_dir

    return default_history_dir()


class _Gatekeeper:
    """Records, gates or stores results for one test item."""

    def __init__(self, request: pytest.FixtureRequest):
        self.config = request.config
        self.node = request.node

    def __call__(self, result: dict, ab_report=None) -> dict:
        """Record ``result``, then gate it against its stored baseline, or store it (--specbench-update-baselines);
        ``ab_report``: its verdict from an A/B against a base commit (--specbench-compare), gated instead."""
        # strict_json, not harness.to_json: gating a stored result must not import the harness (torch, datasets)
        from specbench.io import strict_json
        from specbench.gating.baselines import BaselineRefused, BaselineStore, compare
        from specbench.gating.regenerate import update_baseline

        config = self.config
        assignment = config.stash.get(sharding.ASSIGNMENT_KEY, None)
        if assignment is not None:  # an xdist worker: which one, and which GPUs it saw (its own first)
            result = {**result, "env": {**(result.get("env") or {}), "xdist_worker": assignment["worker"],
                                        "cuda_visible_devices": assignment["cuda_visible_devices"]}}
        baselines_dir = config.getoption("--specbench-baselines")
        results_path = config.getoption("--specbench-results")
        if results_path:
            _append_result_line(results_path, strict_json.dumps(result, indent=None))
        metrics = result["metrics"]
        for name in ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup"):
            self.node.user_properties.append((f"specbench.{name}", metrics.get(name)))
        self.node.user_properties.append(("specbench.case_id", result["case_id"]))
        row = {"case_id": result["case_id"], "metrics": metrics, "launch_bound": launch_bound(result.get("case"))}
        if ab_report is None and config.getoption("--specbench-update-baselines"):
            self._record_history(result, None)  # a run, whatever becomes of it; no gate outcome to store
            command = "pytest --specbench-update-baselines " + shlex.join(config.invocation_params.args)
            try:
                # the correctness verdict (fp32 exact, bf16/fp16 match fraction over the resolved minimum) is
                # gates.check_correctness's, applied inside update_baseline, as compare applies it when gating
                diff = update_baseline(result, baselines_dir, command=command,
                                       reason=config.getoption("--specbench-reason"))
            except BaselineRefused as err:
                row.update(status="REFUSED", detail=str(err))
                config.stash[RESULTS_KEY].append(row)
                pytest.fail(str(err), pytrace=False)
            row.update(status="updated", detail=diff.format())
            config.stash[RESULTS_KEY].append(row)
            sys.stdout.write(diff.format() + "\n")
            return result
        report = ab_report or compare(result, BaselineStore(baselines_dir) if baselines_dir else None)
        self._record_history(result, report)
        self.node.user_properties.append(("specbench.gate", "pass" if report.passed else "fail"))
        row.update(status="pass" if report.passed else "FAIL", detail=report.format(only_problems=True))
        config.stash[RESULTS_KEY].append(row)
        if not report.passed:
            pytest.fail(report.format(only_problems=True), pytrace=False)
        return result

    def _record_history(self, result: dict, report) -> None:
        directory = _history_dir(self.config)
        if directory is None:
            return
        from specbench.gating.history import append_results

        append_results(directory, [result], gate_reports=[report])
        self.config.stash[HISTORY_USED_KEY].add(str(directory))


@pytest.fixture
def specbench_gate(request: pytest.FixtureRequest):
    """Gate (or, with --specbench-update-baselines, store) a result dict; fails the test on a regression."""
    return _Gatekeeper(request)


@pytest.fixture
def specbench_run(request: pytest.FixtureRequest, specbench_gate):
    """Run a case (a Case, a dict, or "suite/name") through the harness, then gate it; returns the result dict.
    A device fault of the case (out of memory, a batched cache that does not fit, a CUDA/CUBLAS/cuDNN error) fails
    the test in one line (case id, error type, message, the memory asked for), after freeing what the case left
    behind."""
    from specbench.cases import Case, find_case

    def run(case) -> dict:
        if isinstance(case, str):
            (case,) = find_case(case)
        elif isinstance(case, dict):
            case = Case.from_dict(case)
        if request.config.getoption("--specbench-compare"):  # runs in fresh processes: nothing loaded here
            return specbench_gate(*ab_mode.run_ab(request.config, case))
        from specbench.run.harness import case_fault, fault_line, free_device_memory, run_case

        try:
            result = run_case(case, progress=False).to_dict()
        except (RuntimeError, MemoryError) as err:  # MemoryError: a batched cache that does not fit
            fault = case_fault(err)
            if fault is None:
                raise
        else:
            return specbench_gate(result)
        # out of the except block: the traceback (and the frames holding the case's tensors) is gone
        free_device_memory()
        line = fault_line(case.case_id, fault)
        request.config.stash[RESULTS_KEY].append({"case_id": case.case_id, "metrics": {}, "status": "ERROR",
                                                  "detail": line})
        pytest.fail(line, pytrace=False)

    return run


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its rows went to the controller (pytest_sessionfinish)
        return
    rows = list(config.stash.get(RESULTS_KEY, []))
    plan = config.stash.get(sharding.PLAN_KEY, None)  # set on the xdist controller only
    sharded = plan is not None and bool(plan["gpus"])
    if rows:
        _write_case_table(terminalreporter, config, rows)
    if not rows and not sharded:
        return
    wall = time.perf_counter() - config.stash.get(STARTED_KEY, time.perf_counter())
    if plan is None:
        terminalreporter.write_line(f"wall time {wall:.1f} s, one process")
        return
    sharding.write_summary(terminalreporter, config, plan, wall)


def _write_case_table(terminalreporter, config: pytest.Config, rows: list[dict]) -> None:
    terminalreporter.section("specbench: cases vs baselines")
    header = f"{'case':40} {'status':8} {'accept':>7} {'MAL':>6} {'tok/s':>8} {'speedup':>8}"
    terminalreporter.write_line(header)
    for row in rows:
        m = row["metrics"]

        def fmt(x, spec):
            return "-".rjust(int(spec.split(".")[0])) if x is None or x != x else format(x, spec)

        terminalreporter.write_line(
            f"{row['case_id']:40} {row['status']:8} {fmt(m.get('acceptance_rate'), '7.3f')} "
            f"{fmt(m.get('mean_acceptance_length'), '6.2f')} {fmt(m.get('tokens_per_s'), '8.1f')} "
            f"{fmt(m.get('speedup'), '7.2f')}x" + (" launch-bound" if row.get("launch_bound") else "")
        )
        for detail_line in (row.get("detail") or "").splitlines():
            if detail_line.strip() and row["status"] != "pass":
                terminalreporter.write_line(f"    {detail_line}")
    if any(row.get("launch_bound") for row in rows):
        terminalreporter.write_line(LAUNCH_BOUND_NOTE)
    for directory in sorted(config.stash.get(HISTORY_USED_KEY, ())):
        terminalreporter.write_line(f"recorded in the results history {directory} (`specbench report` shows it; "
                                    "--specbench-no-history records nothing)")


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
    from specbench.cases.requirements import missing_checkpoint
    from specbench.prompts import DatasetUnavailable, load_prompts

    missing = missing_checkpoint(case)
    if missing:
        pytest.skip(f"{case.case_id}: {missing}")
    prompts = case.prompts.get("name")
    if prompts and prompts != "synthetic":
        try:
            load_prompts(prompts, num_prompts=case.prompts.get("num_prompts"), n_shot=case.prompts.get("n_shot", 1))
        except DatasetUnavailable as err:
            pytest.skip(f"{case.case_id}: {err}")
