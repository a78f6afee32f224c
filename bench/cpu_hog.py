"""A CPU run beside a busy process: one small case through `specbench run`, idle and then beside a bounded
busy-loop process (one core's worth), printing both wall times and their ratio.

The thread policy (docs/metrics.md#cpu-threads) should keep the loaded run within 3x of the idle one; before
it, a default run beside one busy process on a 2-core machine took 428 s against 20 s idle. ``--threads N``
forces the loaded run's thread count (the old default was one thread per core: pass the core count to see
the oversubscribed run). Not a unit test: wall times on a shared machine are measurements, not assertions.

    python bench/cpu_hog.py                       # medusa/chain-k3, 4 prompts x 32 tokens
    python bench/cpu_hog.py --threads 2           # the loaded run without the policy, for contrast
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOG = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
RATIO_LIMIT = 3.0  # the acceptance bound of the thread policy: loaded within 3x of idle


def run_case(case: str, args: argparse.Namespace, threads: int | None) -> dict:
    """One `specbench run` of ``case`` in a fresh process: wall seconds, tok/s and the thread decision."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "specbench.cli", "run", case, "--num-prompts", str(args.num_prompts),
                   "--max-new-tokens", str(args.max_new_tokens), "--no-history", "--no-gate", "-q",
                   "--output", str(output)]
        if threads is not None:
            command += ["--threads", str(threads)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - start
        if done.returncode not in (0, 1):
            raise SystemExit(f"`{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-2000:]}")
        result = json.loads(output.read_text(encoding="utf-8"))
    return {"wall_s": wall, "tokens_per_s": result["metrics"]["tokens_per_s"],
            "cpu_threads": result["env"]["cpu_threads"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="medusa/chain-k3")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, help="force the loaded run's --threads (default: the policy's)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run, and the hog's lifetime bound")
    args = parser.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # the policy, not the caller's shell, decides

    print(f"load before: {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} usable cores", flush=True)
    idle = run_case(args.case, args, None)
    print(f"idle:   {idle['wall_s']:.1f} s, {idle['tokens_per_s']:.1f} tok/s, threads {idle['cpu_threads']}",
          flush=True)
    # bounded: the hog ends on its own after the timeout even if this script is killed
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(args.timeout)])
    try:
        time.sleep(1.0)  # the hog is running before the loaded run reads the load
        loaded = run_case(args.case, args, args.threads)
    finally:
        hog.kill()
        hog.wait()
    print(f"loaded: {loaded['wall_s']:.1f} s, {loaded['tokens_per_s']:.1f} tok/s, threads {loaded['cpu_threads']}")
    ratio = loaded["wall_s"] / idle["wall_s"]
    print(f"loaded / idle wall time: {ratio:.2f}x ({'within' if ratio <= RATIO_LIMIT else 'OVER'} the "
          f"{RATIO_LIMIT:.0f}x bound); idle / loaded decode tok/s: {idle['tokens_per_s'] / loaded['tokens_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
