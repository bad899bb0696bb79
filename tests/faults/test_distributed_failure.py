"""Under DDP a failure is reported once, by the rank that failed: the rank that loses its peer in a
collective adds no traceback of its own, and the command's exit code is the failure's."""

from __future__ import annotations

import pytest

from tests.integration.conftest import run_cli

TASK = '''
import os

from lit_ppo.tasks.arithmetic import ArithmeticTask


class BreaksOnRankOne(ArithmeticTask):
    """Rank 1's reward raises in the second iteration; rank 0's never does."""

    calls = 0

    def reward(self, problem, completion):
        BreaksOnRankOne.calls += 1
        if os.environ.get("LOCAL_RANK") == "1" and BreaksOnRankOne.calls > 4:
            raise RuntimeError("the reward service is down")
        return super().reward(problem, completion)
'''


@pytest.mark.slow
def test_a_failure_on_rank_one_is_one_line_from_rank_one(tmp_path):
    (tmp_path / "rank_task.py").write_text(TASK)
    done = run_cli(["fit", "logger=none", "trainer=ddp", "trainer.max_steps=3", "data.batch_size=2",
                    "gconfig.n_samples=2", "eval.max_problems=4", "trainer.enable_progress_bar=false",
                    "data.task=rank_task.BreaksOnRankOne"], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "RuntimeError: the reward service is down" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Connection closed by peer" not in done.stderr
