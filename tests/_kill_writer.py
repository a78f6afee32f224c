"""Helper process for tests/test_baselines.py: regenerates baselines in a loop.

JOB_JSON is {"results": [run results], "texts": [baseline file texts]}.
python tests/_kill_writer.py STORE_DIR JOB_JSON --rounds N
    apply update_baseline for each result in turn, N rounds, then exit.
python tests/_kill_writer.py STORE_DIR JOB_JSON --serve
    for each "fork update" / "fork write" line on stdin, fork a child that forever either applies the
    results in turn (update_baseline: load, merge, format, write) or writes the texts in turn to
    STORE_DIR/<suite>.json (write_text_atomic alone: nearly all its time is spent inside the write, where
    a kill tests atomicity hardest); print "child <pid>", wait for it (the test SIGKILLs it) and print
    "exited <wait status>". Forking from this small process costs milliseconds, where starting an
    interpreter per trial costs a second, and forking the test process itself would copy torch's threads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: specbench is not installed

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.gating.regenerate import update_baseline  # noqa: E402


def regenerate(store_dir: str, results: list[dict], rounds) -> None:
    for _ in rounds:
        for result in results:
            update_baseline(result, store_dir, command="tests/_kill_writer.py", reason="test")


def rewrite(path: Path, texts: list[str]) -> None:
    for text in itertools.cycle(texts):
        write_text_atomic(path, text)


def serve(store_dir: str, job: dict) -> None:
    path = Path(store_dir) / f"{job['results'][0]['case']['suite']}.json"
    for line in sys.stdin:
        if line.split()[:1] != ["fork"]:
            return
        mode = line.split()[1]
        pid = os.fork()
        if pid == 0:
            try:
                if mode == "write":
                    rewrite(path, job["texts"])
                else:
                    regenerate(store_dir, job["results"], itertools.count())
            finally:
                os._exit(1)  # only reached on an error: never fall back into the server loop
        print(f"child {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {status}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store_dir")
    parser.add_argument("job_json")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rounds", type=int)
    mode.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    job = json.loads(Path(args.job_json).read_text())
    if args.serve:
        serve(args.store_dir, job)
    else:
        regenerate(args.store_dir, job["results"], range(args.rounds))


if __name__ == "__main__":
    main()
