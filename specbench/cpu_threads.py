"""How many intra-op threads torch may use on a CPU it shares: the cores this process may run on, less the load
other processes put on them, so that a busy neighbour does not make every parallel op wait on a starved thread.

Why: torch starts one intra-op thread per core and each op waits for its slowest thread. With one other busy
process on a 2-core machine, the thread sharing a core with it runs at half speed or less and every op waits
for it: a default `specbench run` measured 428 s there against 20 s idle, and 26 s with one thread. So a run
takes the cores it may use (``os.sched_getaffinity``, a cgroup CPU quota) minus the other processes' load,
and says when the machine is oversubscribed (the 1-minute load average above the core count), since its
speeds are then not comparable with a quiet machine's."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

THREADS_ENV = "OMP_NUM_THREADS"  # the user's own cap, honoured like --threads
_SAMPLES = 5  # readings of the runnable-task count, _SAMPLE_GAP_S apart; their median is the current load
_SAMPLE_GAP_S = 0.02


@dataclass(frozen=True)
class ThreadPolicy:
    """A decision: ``threads`` for torch, from ``source`` ("--threads", "OMP_NUM_THREADS" or "load"), with
    the readings it came from."""

    threads: int
    source: str
    usable_cores: int
    other_load: float  # runnable tasks of other processes, now (a median of a few readings)
    load_1min: float | None  # None where the platform has no load average
    oversubscribed: bool  # load_1min above usable_cores

    def record(self) -> dict:
        """The environment record's "cpu_threads" field."""
        return asdict(self)

    def note(self) -> str | None:
        """A clause for the run's summary line when the machine is oversubscribed or the threads were capped."""
        if self.oversubscribed:
            return (f"CPU oversubscribed: 1-minute load {self.load_1min:.1f} on {self.usable_cores} usable cores; "
                    f"torch ran {self.threads} thread(s) ({self.source}); speeds here are not comparable with a "
                    "quiet machine's")
        if self.source == "load" and self.threads < self.usable_cores:
            return (f"CPU shared: other processes keep {self.other_load:.1f} cores busy, so torch ran "
                    f"{self.threads} of {self.usable_cores} threads (--threads N to choose)")
        return None


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, lowered by a cgroup v2 CPU quota where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def _cgroup_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> float | None:
    """The cgroup v2 CPU quota in cores ("max" or no file: none)."""
    try:
        quota, period = path.read_text(encoding="ascii").split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def load_1min() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def other_load(path: Path = Path("/proc/loadavg")) -> float:
    """Runnable tasks other than this reading one, now: the median of a few readings of /proc/loadavg's
    running count (the 1-minute average lags a new neighbour by a minute, and includes this process's own
    earlier runs). 0 where the file does not exist."""
    readings = []
    for i in range(_SAMPLES):
        try:
            running = int(path.read_text(encoding="ascii").split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        readings.append(max(0, running - 1))  # the count includes the task reading it
        if i + 1 < _SAMPLES:
            time.sleep(_SAMPLE_GAP_S)
    return float(sorted(readings)[len(readings) // 2])


def decide(requested: int | None = None, *, cores: int, others: float, load: float | None,
           env_threads: str | None = None) -> ThreadPolicy:
    """The thread count: ``requested`` (--threads) wins, then a valid OMP_NUM_THREADS, else the usable
    ``cores`` less the ``others``' load (rounded: half a core busy still slows a thread), at least 1."""
    oversubscribed = load is not None and load > cores
    if requested is not None:
        threads, source = requested, "--threads"
    elif env_threads and env_threads.strip().isdigit() and int(env_threads) >= 1:
        threads, source = int(env_threads), THREADS_ENV
    else:
        threads, source = max(1, min(cores, cores - math.floor(others + 0.5))), "load"
    return ThreadPolicy(threads=threads, source=source, usable_cores=cores, other_load=others, load_1min=load,
                        oversubscribed=oversubscribed)


_applied: ThreadPolicy | None = None


def decide_here(requested: int | None = None) -> ThreadPolicy:
    """The decision from this machine's readings now (nothing is set)."""
    return decide(requested, cores=usable_cores(), others=other_load(), load=load_1min(),
                  env_threads=os.environ.get(THREADS_ENV))


def apply_policy(requested: int | None = None) -> ThreadPolicy:
    """Decide from this machine's readings and set torch's intra-op threads; the environment record of the
    runs that follow carries the decision."""
    global _applied
    import torch

    policy = decide_here(requested)
    torch.set_num_threads(policy.threads)
    _applied = policy
    return policy


def thread_record() -> dict:
    """The environment record's "cpu_threads": the decision apply_policy made, or (none made: the pytest plugin,
    a library caller) torch's own thread count with this moment's readings."""
    if _applied is not None:
        return _applied.record()
    import torch

    cores, load = usable_cores(), load_1min()
    return ThreadPolicy(threads=torch.get_num_threads(), source="torch default", usable_cores=cores,
                        other_load=other_load(), load_1min=load,
                        oversubscribed=load is not None and load > cores).record()
