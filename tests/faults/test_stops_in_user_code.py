"""Stops that come from user code or arrive while it runs: an agent that raises KeyboardInterrupt fails its episode
(one line, exit code 1), an ``async def`` agent that blocks its event loop is stopped by data.episode_timeout_s,
and two stop signals, during iteration 1 or while an agent blocks, end with the closing line and 143 and no
traceback. Signals are sent by the user code itself once the first is handled, so each lands where the test
says."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENTS = textwrap.dedent('''
    import os
    import signal
    import time

    from lit_ppo.utils.stop_requests import received_signal


    def send_signals_once():
        """SIGTERM, then SIGTERM again once the first is handled (two at once would reach Python as one)."""
        if os.path.exists("signalled"):
            return
        open("signalled", "w").close()
        for _ in range(2):
            handled = received_signal()
            os.kill(os.getpid(), signal.SIGTERM)
            while received_signal() is handled:  # the first is recorded; the second raises out of the wait
                time.sleep(0.01)
            time.sleep(0.2)


    def interrupts(client, problem):
        client.chat.completions.create(messages=[{"role": "user", "content": problem.prompt}])
        raise KeyboardInterrupt


    async def interrupts_async(client, problem):
        await client.chat.completions.create(messages=[{"role": "user", "content": problem.prompt}])
        raise KeyboardInterrupt


    async def blocks(client, problem):
        time.sleep(120)


    async def blocks_then_signalled(client, problem):
        send_signals_once()
        time.sleep(120)


    def signalled_filter(group):
        send_signals_once()
        return True
''')
SMALL = ["logger=none", "trainer.max_steps=2", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=2",
         "trainer.enable_progress_bar=false"]


def fit(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "user_agents.py").write_text(AGENTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LIT_PPO_"))}
    env.update(LIT_PPO_CACHE=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", *SMALL, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=200)
    return done, time.monotonic() - start


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("agent", ["interrupts", "interrupts_async"])
def test_an_agent_that_raises_keyboard_interrupt_fails_in_one_line(tmp_path, agent):
    done, _ = fit(tmp_path, "data=agent", f"data.task_kwargs.agent=user_agents.{agent}")
    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = errors(done)
    assert line.startswith(f"error: agent user_agents.{agent} raised KeyboardInterrupt on problem "), line
    assert "fix the agent, or set data.on_invalid_reward=drop" in line
    assert "Traceback" not in done.stderr and "close_episode" not in done.stderr and "sys.exit" not in done.stderr


def test_an_async_agent_that_blocks_its_event_loop_is_stopped_by_the_episode_timeout(tmp_path):
    done, seconds = fit(tmp_path, "data=agent", "data.task_kwargs.agent=user_agents.blocks",
                        "data.episode_timeout_s=2")
    assert done.returncode == 1, done.stderr[-3000:]
    assert errors(done) == [
        "error: agent user_agents.blocks blocked the event loop of its episodes for more than "
        "data.episode_timeout_s=2 s (an async def agent that calls time.sleep or blocking I/O), which stops every "
        "episode on it: await instead (asyncio.sleep, an async client), or make it a plain def, which runs in a "
        f"thread of its own (traceback in {next(tmp_path.glob('runs/*/*'))}/error.log)"]
    assert "Traceback" not in done.stderr
    assert seconds < 60  # the agent sleeps 120 s: it is left behind, not waited for


@pytest.mark.parametrize("where", ["filter", "blocking agent"])
def test_a_second_sigterm_during_iteration_one_ends_with_the_closing_line(tmp_path, where):
    args = (["data.dynamic_filter_fn=user_agents.signalled_filter"] if where == "filter" else
            ["data=agent", "data.task_kwargs.agent=user_agents.blocks_then_signalled"])
    done, seconds = fit(tmp_path, "eval.before_training=false", *args)
    assert done.returncode == 143, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert "received SIGTERM again: abandoning iteration 1" in lines
    assert lines[-1] == "stopped by SIGTERM before the first iteration completed: nothing was trained", lines[-5:]
    assert "Traceback" not in done.stderr and "Task was destroyed" not in done.stderr
    assert not list(tmp_path.glob("runs/*/*/checkpoints/*.ckpt"))
    assert seconds < 60
