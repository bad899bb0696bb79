"""How torch's threads wait for each other on a machine whose cores other processes use too.

Between two parallel regions, GNU OpenMP (torch's CPU thread pool) keeps its threads spinning for a while
(``GOMP_SPINCOUNT``, 300000 turns) so that the next region starts at once: on an idle machine that is the
fastest. When other processes keep the cores busy, a spinning thread burns the time slice that the thread it
waits for needs, and each of the thousands of small regions of a generate waits for the scheduler: beside two
busy processes a SmolLM2 generate took 6.5x its idle time with spinning threads and 2x with sleeping ones
(``OMP_WAIT_POLICY=PASSIVE``), which cost 14-37% on the idle machine (docs/running.md, "A shared machine").

So a run measures, before torch loads (GNU OpenMP reads its environment once, when it loads), how much CPU
time other processes took since this process started (``measure_from_now``), and lets the threads sleep when
that is half a core or more. A second run started beside this one counts: its start keeps a core busy.
"""

from __future__ import annotations

import os
import sys
import time

CONTENDED_CORES = 0.5
"""Other processes' mean CPU use, in cores, from which torch's threads sleep while they wait."""
SHORTEST_WINDOW_S = 0.25
"""The shortest span the measurement covers: the kernel counts CPU time in ticks of 10 ms."""
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""GNU OpenMP's waiting settings: either one in the environment is the user's choice, left as it is."""
DEFAULT_SPINCOUNT = 300000
"""GNU OpenMP's own spin count (what ``GOMP_SPINCOUNT`` keeps on a busy machine)."""


def cpu_ticks() -> tuple[float, int, int]:
    """(now, the CPU time of the whole machine, of this process), the last two in clock ticks: what is not
    idle in /proc/stat (a virtual machine's stolen time counts, as another guest took it) and this process's
    user + system time."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    with open("/proc/self/stat") as stat:
        own = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return time.monotonic(), user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


_start: tuple[float, int, int] | None = None


def measure_from_now() -> None:
    """Start the measurement (the command line does at its start; else the first ``choose_wait_policy``)."""
    global _start
    try:
        _start = cpu_ticks()
    except OSError:  # no /proc: not Linux
        _start = None


def others_cores(start: tuple[float, int, int], end: tuple[float, int, int]) -> float:
    """Other processes' mean CPU use between two ``cpu_ticks``, in cores."""
    seconds = end[0] - start[0]
    ticks = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / seconds) if seconds > 0 else 0.0


def torch_threads() -> int:
    """The threads torch will take: ``OMP_NUM_THREADS``, else the cores this process may run on."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def choose_wait_policy() -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in this process's environment (its ranks and workers inherit it) when
    other processes used ``CONTENDED_CORES`` or more since ``measure_from_now``; the ``note:`` line saying so,
    or None (idle, torch already loaded, one thread, or the user's own setting)."""
    if any(key in os.environ for key in USER_SETTINGS) or "torch" in sys.modules or torch_threads() < 2:
        return None
    if _start is None:
        measure_from_now()
        if _start is None:
            return None
    waited = time.monotonic() - _start[0]
    if waited < SHORTEST_WINDOW_S:
        time.sleep(SHORTEST_WINDOW_S - waited)
    busy = others_cores(_start, cpu_ticks())
    if busy < CONTENDED_CORES:
        return None
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return (f"note: other processes keep {busy:.1f} of this machine's {os.cpu_count()} cores busy, so torch's "
            f"threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE); GOMP_SPINCOUNT={DEFAULT_SPINCOUNT} keeps "
            "them spinning")
