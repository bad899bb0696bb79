"""Rewards beyond functions, as docs/bring-your-own.md shows them: its reward model example as
written (a classifier trained on preference pairs, a policy learning the preference through it), its
judge examples against a loopback OpenAI-compatible endpoint, what a judge that is down, breaks mid-run
or replies without a verdict does to a run, and its asynchronous reward against a loopback service."""

from __future__ import annotations

import re
import runpy
import shlex

import pytest
import torch

from tests.fake_judge import MODEL, FakeJudge
from tests.integration.conftest import REPO, run_dir
from tests.integration.test_bring_your_own import worked_example

pytestmark = pytest.mark.slow


def section(title: str) -> list[tuple[str, str]]:
    """The (language, text) code blocks of docs/bring-your-own.md's section ``### title``."""
    page = (REPO / "docs" / "bring-your-own.md").read_text()
    text = page.split(f"### {title}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def iteration_rewards(stdout: str) -> list[float]:
    return [float(r) for r in re.findall(r"^iteration \d+/\d+ reward ([-0-9.e]+)", stdout, re.M)]


@pytest.fixture
def fake():
    served = FakeJudge()
    yield served
    served.close()


def test_the_reward_model_example_runs_as_written_and_the_policy_learns_the_preference(cli_here, monkeypatch):
    blocks = section("A reward model")
    (script,) = [text for lang, text in blocks if lang == "python"]
    (commands,) = [text for lang, text in blocks if not lang and text.startswith("python ")]
    commands = commands.strip().splitlines()
    assert commands[:2] == ["python make_data.py", "python make_pairs.py"] and len(commands) == 4
    work = cli_here.cwd
    monkeypatch.chdir(work)
    monkeypatch.setenv("LIT_PPO_CACHE", str(work / "cache"))
    files, _ = worked_example()
    (work / "make_data.py").write_text(files["make_data.py"])
    runpy.run_path(str(work / "make_data.py"))
    (work / "make_pairs.py").write_text(script)
    runpy.run_path(str(work / "make_pairs.py"))
    rm = shlex.split(commands[2])[3:]
    assert rm[0] == "rm"
    trained = cli_here(*rm, "logger=none")
    assert trained.returncode == 0, trained.stderr[-3000:]
    (model_dir,) = work.glob("runs/lit_ppo/rm-dataset-tiny-*/model")

    # The reward model learned the preference: every odd answer above every even one, on unseen prompts.
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": "12+34="},
                                            {"role": "assistant", "content": str(d)}], tokenize=False)
             for d in range(10)]
    with torch.no_grad():
        scores = model(**tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)).logits[:, 0]
    assert min(scores[1::2]) > max(scores[0::2])

    placeholder = "runs/lit_ppo/rm-dataset-tiny-<time>/model"
    assert placeholder in commands[3]
    fit = shlex.split(commands[3].replace(placeholder, str(model_dir.relative_to(work))))[3:]
    assert fit[0] == "fit" and "trainer.max_steps=20" in fit
    fit = [a for a in fit if not a.startswith(("trainer.max_steps=", "trainer.val_check_interval="))] + [
        "trainer.max_steps=8", "trainer.val_check_interval=8", "logger=none"]
    result = cli_here(*fit)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = iteration_rewards(result.stdout)
    # The reward is the sigmoid of the logit normalised by the statistics model/ records: about 0.73 at best.
    assert len(rewards) == 8 and sum(rewards[-2:]) / 2 > max(0.7, rewards[0] + 0.1), rewards
    eval_line = re.search(r"^eval at iteration 8: accuracy ([0-9.]+) .*rewards/model/mean ([0-9.]+)", result.stdout,
                          re.M)
    assert eval_line and float(eval_line.group(1)) >= 0.9, result.stdout


def judge_command(fake: FakeJudge) -> list[str]:
    """The docs' judge command, pointed at the loopback judge, for the tiny model at the smallest scale."""
    (commands,) = [text for lang, text in section("An LLM judge") if not lang and text.startswith("vllm serve")]
    serve, fit = commands.strip().splitlines()
    served = serve.split()[2]
    args = shlex.split(fit.replace(served, MODEL).replace("http://127.0.0.1:8000/v1", fake.url))[3:]
    assert args[0] == "fit" and "model=my-model" in args
    return [a for a in args if a != "model=my-model"] + [
        "trainer.max_steps=2", "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=4",
        "logger=none", "eval.max_problems=2", "checkpoint.every_n_iterations=1"]


def judge_data(work) -> None:
    (work / "train.jsonl").write_text("".join(f'{{"prompt": "{a}+{a}=", "answer": "{2 * a}"}}\n' for a in range(8)))


def test_the_judge_example_trains_against_an_openai_compatible_endpoint(cli_here, fake):
    judge_data(cli_here.cwd)
    graded = []
    fake.reply = lambda messages: graded.append(messages) or "Looks right. VERDICT: correct"
    result = cli_here(*judge_command(fake))
    assert result.returncode == 0, result.stderr[-3000:]
    assert iteration_rewards(result.stdout) == [1.0, 1.0]
    assert len(graded) == 2 * 4  # two iterations of 2 prompts x 2 samples (no test split)
    assert "Reference answer:\n" in graded[0][-1]["content"] and graded[0][-1]["role"] == "user"


def test_the_docs_score_judge_reads_a_number(fake, tmp_path):
    """The docs' 0-10 judge, as the command line composes it: its regular expression reads the score."""
    from lit_ppo.launch.compose import compose
    from lit_ppo.tasks import DatasetTask

    (line,) = [text.strip() for lang, text in section("An LLM judge") if not lang and "SCORE" in text]
    override = shlex.split(line.replace("http://127.0.0.1:8000/v1", fake.url).replace("my-judge", MODEL))[0]
    judge_data(tmp_path)
    tree = compose(["data=dataset", f"data.task_kwargs.train_path={tmp_path / 'train.jsonl'}",
                    "data.task_kwargs.reward_fns=[judge]", override])
    kwargs = tree["data"]["task_kwargs"]
    fake.reply = lambda messages: "Fine work. SCORE 7"
    task = DatasetTask(**kwargs)
    (problem,) = task.problems("train")[:1]
    assert task.score_group(problem, ["2"], [[]], 0).rewards == [7.0]
    assert "The answer: 2" in fake.requests[-1][1]["messages"][-1]["content"]


def test_a_judge_that_is_down_is_refused_before_any_model_loads(cli_here, fake):
    judge_data(cli_here.cwd)
    command = judge_command(fake)
    fake.close()
    for verb in ("fit", "validate"):
        result = cli_here(verb, *command[1:])
        assert result.returncode == 2, result.stderr[-3000:]
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
        assert f"data.task_kwargs.judge.base_url='{fake.url}': nothing answers at {fake.url}" in line
        assert "start the server (e.g. vllm serve judge-model) or fix the URL" in line
        assert not list(cli_here.cwd.glob("runs/*/*/checkpoints"))


def test_a_judge_that_breaks_mid_run_stops_it_in_one_line_and_the_run_resumes(cli, fake):
    """In a real process: the exit code, stderr and the checkpoint as a user sees them."""
    judge_data(cli.cwd)
    calls = []

    def reply(messages):
        calls.append(1)
        if len(calls) == 4:  # iteration 1's last request: the server breaks after it
            fake.status = 500
        return "VERDICT: correct"

    fake.reply = reply
    command = [a for a in judge_command(fake) if not a.startswith("trainer.max_steps=")] + [
        "trainer.max_steps=3", "data.task_kwargs.judge.max_retries=0"]
    result = cli(*command)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert f"reward function 'judge' raised RuntimeError: judge at {fake.url} answered HTTP 500 (0 retries)" in line
    checkpoints = run_dir(cli.cwd) / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 1
    fake.status, fake.reply = 200, lambda messages: "VERDICT: incorrect"
    resumed = cli(*command, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert iteration_rewards(resumed.stdout) == [0.0, 0.0]  # iterations 2 and 3


def test_replies_without_a_verdict_stop_the_run_or_drop_their_groups(cli_here, fake):
    judge_data(cli_here.cwd)
    fake.reply = lambda messages: "I cannot tell."
    stopped = cli_here(*judge_command(fake))
    assert stopped.returncode == 1
    (line,) = [x for x in stopped.stderr.splitlines() if x.startswith("error:")]
    assert "returned reward <no verdict in 'I cannot tell.'> for prompt" in line
    assert "data.on_invalid_reward=drop" in line

    def reply(messages):  # no verdict for the prompts of an odd number
        a = int(re.search(r"Problem:\n(\d+)\+", messages[-1]["content"]).group(1))
        return "I cannot tell." if a % 2 else "VERDICT: incorrect"

    fake.reply, fake.requests[:] = reply, []
    dropped = cli_here(*judge_command(fake), "data.on_invalid_reward=drop")
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    assert iteration_rewards(dropped.stdout) == [0.0, 0.0]  # only the groups with a verdict trained
    assert any("I cannot tell." == reply(body["messages"]) for _, body in fake.requests)  # and some had none


def test_the_async_service_reward_example_scores_a_batch_concurrently(tmp_path, monkeypatch):
    """docs/bring-your-own.md's asynchronous reward, against a loopback scoring service that takes 0.5 s a
    request: sixteen prompt groups are scored in about one request's time, each with the service's values."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lit_ppo.tasks import DatasetTask

    page = (REPO / "docs" / "bring-your-own.md").read_text()
    (example,) = [text for text in re.findall(r"```python\n(.*?)```", page, re.S)
                  if text.startswith("# service_rewards.py")]

    class Scorer(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(0.5)
            data = json.dumps({"scores": [len(c) for c in body["completions"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(ThreadingHTTPServer):
        request_queue_size = 64  # sixteen connects at once must not overflow the listen backlog (5)

    server = Server(("127.0.0.1", 0), Scorer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "service_rewards.py").write_text(example)
        judge_data(tmp_path)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv("SCORER_URL", f"http://127.0.0.1:{server.server_address[1]}/score")
        task = DatasetTask(train_path="train.jsonl", reward_fns=["service_rewards.service_score"], reward_timeout_s=60)
        problems = list(task.problems("train"))
        completions = [["1", "22", "333"] for _ in problems] * 2  # sixteen groups
        problems = problems * 2
        start = time.monotonic()
        scores = task.score_groups(problems, completions, [[[]] * 3 for _ in problems], 0)
        took = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert [s.rewards for s in scores] == [[1.0, 2.0, 3.0]] * 16
    assert took < 2.0  # sixteen requests of 0.5 s at once (8 s one after another)
