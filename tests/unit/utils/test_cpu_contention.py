"""How torch's threads wait: spinning on an idle machine, sleeping (OMP_WAIT_POLICY=PASSIVE) when other processes
keep the cores busy, measured from /proc before torch loads; the user's own setting wins."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from lit_ppo.utils import cpu_contention

CLOCK = os.sysconf("SC_CLK_TCK")
PROBE = """
import os, sys
{before}
from lit_ppo.utils import cpu_contention
cpu_contention.measure_from_now()
print(cpu_contention.choose_wait_policy())
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def test_other_processes_use_is_the_machines_cpu_time_less_this_processes_over_the_seconds_between():
    # In 2 s the machine used 3 CPU-seconds, this process 1: the others 1 core.
    assert cpu_contention.others_cores((10.0, 5000, 300), (12.0, 5000 + 3 * CLOCK, 300 + CLOCK)) == 1.0
    assert cpu_contention.others_cores((10.0, 5000, 300), (10.5, 5000 + CLOCK // 4, 300)) == 0.5
    # The two counters tick apart: this process's count may run ahead of the machine's for a tick.
    assert cpu_contention.others_cores((10.0, 5000, 300), (11.0, 5001, 302)) == 0.0
    assert cpu_contention.others_cores((10.0, 5000, 300), (10.0, 5000, 300)) == 0.0


def test_the_counters_are_this_machines_and_this_processes_cpu_time():
    start = cpu_contention.cpu_ticks()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # 0.3 CPU-seconds of this process
        pass
    end = cpu_contention.cpu_ticks()
    own = end[2] - start[2]
    assert own >= 0.2 * CLOCK
    assert end[1] - start[1] >= own - 2  # the machine's busy time holds this process's
    assert end[0] > start[0]


@pytest.mark.parametrize(("others", "passive"), [(0.4, False), (0.6, True), (1.9, True)])
def test_threads_sleep_from_half_a_core_used_by_others(others, passive, monkeypatch):
    for key in cpu_contention.USER_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # threads that wait for each other, whatever the cores
    monkeypatch.delitem(sys.modules, "torch")  # as before a run loads it
    ticks = iter([(100.0, 0, 50), (101.0, round(others * CLOCK) + 10, 60)])
    monkeypatch.setattr(cpu_contention, "cpu_ticks", lambda: next(ticks))
    cpu_contention.measure_from_now()
    note = cpu_contention.choose_wait_policy()
    if passive:
        assert note == (f"note: other processes keep {others:.1f} of this machine's {os.cpu_count()} cores busy, so "
                        "torch's threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE); GOMP_SPINCOUNT=300000 "
                        "keeps them spinning")
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    else:
        assert note is None and "OMP_WAIT_POLICY" not in os.environ


def probe(env: dict[str, str], before: str = "") -> list[str]:
    """choose_wait_policy's note and the OMP_WAIT_POLICY it leaves, in a fresh interpreter of 2 torch threads
    beside two busy processes (torch not loaded unless ``before`` loads it)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        base = {k: v for k, v in os.environ.items() if k not in cpu_contention.USER_SETTINGS}
        base["OMP_NUM_THREADS"] = "2"
        result = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env={**base, **env},
                                capture_output=True, text=True, timeout=120)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_beside_two_busy_processes_the_threads_sleep():
    note, policy = probe({})
    assert re.fullmatch(r"note: other processes keep [\d.]+ of this machine's \d+ cores busy, so torch's threads sleep "
                        r"while they wait \(OMP_WAIT_POLICY=PASSIVE\); GOMP_SPINCOUNT=300000 keeps them spinning", note)
    assert policy == "PASSIVE"


@pytest.mark.parametrize(("env", "policy"), [({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
                                             ({"GOMP_SPINCOUNT": "300000"}, "None"),
                                             ({"OMP_NUM_THREADS": "1"}, "None")])
def test_the_users_setting_or_a_single_thread_is_left_as_it_is(env, policy):
    assert probe(env) == ["None", policy]


def test_nothing_changes_once_torch_has_loaded():
    """GNU OpenMP read its environment when torch loaded: a later setting would claim what did not happen."""
    assert probe({}, before="import torch") == ["None", "None"]
