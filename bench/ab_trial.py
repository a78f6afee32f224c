"""A/B trial: `specbench compare` of this tree against itself, unchanged and with an injected verify slowdown
(bench/inject_slowdown), repeated until a time budget runs out; for the A/B gate's false failures and the
smallest slowdown it catches, on whatever machine runs it (docs/ab.md#trials).

    python bench/ab_trial.py OUT --synth-dir /tmp/specbench-synth-7b --plan unchanged,0.10,0.05,unchanged \
        --case speed/synth-7b-plain --rounds 3 --budget-s 480 --num-prompts 2 --max-new-tokens 64

The tree is committed into a scratch repository first (the device machine's copy carries no usable .git), so
both sides run exactly this code. Each comparison's JSON, the log and ab_trial.json (one row per comparison:
injected slowdown, exit status, per case and speed metric the paired change, its interval and verdict) land in
OUT; the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("specbench", "suites", "bench", "baselines", "pyproject.toml", "conftest.py", "README.md")
SHOWN_METRICS = ("step_latency_s", "tokens_per_s", "speedup", "decode_speedup")


def scratch_repository(directory: Path) -> Path:
    """This tree's code, committed alone in a new repository at ``directory``."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, directory / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        elif source.is_file():
            shutil.copy2(source, directory / name)
    # a fixed author and date: the same code gives the same commit in every call, so --runs-root's kept rounds
    # of one call are reused by the next (specbench compare --runs-dir)
    env = {**os.environ, "GIT_AUTHOR_NAME": "ab-trial", "GIT_AUTHOR_EMAIL": "ab@trial", "GIT_COMMITTER_NAME": "ab-trial",
           "GIT_COMMITTER_EMAIL": "ab@trial", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    for command in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "-m", "the tree under trial"]):
        subprocess.run(["git", "-C", str(directory), *command], check=True, env=env)
    return directory


def summary_rows(label: str, code: int, data: dict | None) -> list[dict]:
    """One row per case and shown metric of a comparison's JSON (none when it wrote none)."""
    rows = []
    for case in (data or {}).get("cases") or []:
        for check in ((case.get("report") or {}).get("checks") or []):
            if check["name"] not in SHOWN_METRICS or not check.get("ci") or not check.get("baseline"):
                continue
            low, high = (value / check["baseline"] - 1 for value in check["ci"])
            rows.append({"comparison": label, "exit": code, "case_id": case["case_id"], "metric": check["name"],
                         "base": check["baseline"], "head": check["measured"],
                         "change": ((1 + low) * (1 + high)) ** 0.5 - 1, "interval": [low, high],
                         "status": check["status"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--case", action="append", default=None, help="a case to compare (repeatable; default "
                        "speed/synth-7b-plain)")
    parser.add_argument("--plan", default="unchanged,0.10,0.05,unchanged,unchanged,unchanged,unchanged",
                        help="comparisons in order: 'unchanged', or the head's injected verify slowdown as a fraction; "
                             "ITEM@R gives that comparison R rounds instead of --rounds (e.g. 0.05@10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no comparison that the last one's "
                        "duration says would end past this many seconds")
    parser.add_argument("--synth-dir", type=Path, help="the synthetic 7B (written with `specbench zoo synth` when absent)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/specbench-ab-trial"))
    parser.add_argument("--runs-root", type=Path, default=None,
                        help="keep each comparison's finished rounds in RUNS_ROOT/<comparison> (specbench compare "
                             "--runs-dir): the same call again, on this machine or with the directory carried to "
                             "another, continues a comparison the time limit cut short")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.synth_dir:
        env["SPECBENCH_SYNTH_DIR"] = str(args.synth_dir.resolve())
        if not (args.synth_dir / "synth_record.json").is_file():
            subprocess.run([sys.executable, "-m", "specbench.cli", "zoo", "synth", str(args.synth_dir), "--device", "cuda"],
                           check=True, cwd=ROOT, env=env)
    repo = scratch_repository(args.scratch / "repo")
    settings = [*(["--num-prompts", str(args.num_prompts)] if args.num_prompts else []),
                *(["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else [])]
    rows, last_duration, log = [], 0.0, args.out / "ab_trial.log"
    for i, item in enumerate(args.plan.split(",")):
        if time.perf_counter() - started + last_duration > args.budget_s:
            print(f"budget: stopping before comparison {i} ({item})", flush=True)
            break
        item, _, item_rounds = item.partition("@")
        rounds = int(item_rounds) if item_rounds else args.rounds
        label = f"{i}-{item}" + (f"-r{rounds}" if item_rounds else "")  # a file name the device hands back
        inject = [] if item == "unchanged" else ["--head-env", f"PYTHONPATH={repo / 'bench' / 'inject_slowdown'}",
                                                 "--head-env", f"SPECBENCH_INJECT_VERIFY_SLOWDOWN={float(item)}"]
        output = args.out / f"ab_{label}.json"
        command = [sys.executable, "-m", "specbench.cli", "compare", "HEAD", *(args.case or ["speed/synth-7b-plain"]),
                   "--head", "HEAD", "--rounds", str(rounds), *settings, *inject, "--output", str(output),
                   "--no-history", *(["--runs-dir", str(args.runs_root.resolve() / label)] if args.runs_root else [])]
        began = time.perf_counter()
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"== {label}: {' '.join(command)}\n")
            handle.flush()
            code = subprocess.run(command, cwd=repo, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
        last_duration = time.perf_counter() - began
        data = json.loads(output.read_text(encoding="utf-8")) if output.is_file() else None
        rows += summary_rows(label, code, data)
        print(f"{label}: exit {code} in {last_duration:.0f} s", flush=True)
    (args.out / "ab_trial.json").write_text(json.dumps({"rounds": args.rounds, "settings": settings, "rows": rows},
                                                       indent=2) + "\n", encoding="utf-8")
    print(f"{'comparison':14} {'case':40} {'metric':15} {'base':>10} {'head':>10} {'change':>8}  interval           status")
    for row in rows:
        low, high = row["interval"]
        print(f"{row['comparison']:14} {row['case_id'][:40]:40} {row['metric']:15} {row['base']:10.4g} "
              f"{row['head']:10.4g} {row['change'] * 100:+7.1f}%  [{low * 100:+.1f}%, {high * 100:+.1f}%]  {row['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
