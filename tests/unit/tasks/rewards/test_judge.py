"""The ``judge`` reward (lit_ppo.tasks.rewards.judge): verdicts read from the judge's reply, its template and
key reaching an OpenAI-compatible endpoint (a loopback server here), a group judged concurrently, settings
and endpoints checked before anything loads, failures in one line, replies without a verdict as invalid
rewards, and the local model's path on the real tiny model."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import time

import pytest

from lit_ppo.errors import RunStopped
from lit_ppo.models import TinyModelConfig, build_tiny
from lit_ppo.rollout.episodes.episode import checked_reward
from lit_ppo.tasks import DatasetTask
from lit_ppo.tasks.base import reward_problem
from lit_ppo.tasks.rewards.judge import JudgeConfig, LLMJudge, NoVerdict
from tests.fake_judge import MODEL, FakeJudge, grade

WHERE = "data.task_kwargs.judge"


@pytest.fixture
def fake():
    served = FakeJudge()
    yield served
    served.close()


def judge_of(fake: FakeJudge, **settings) -> LLMJudge:
    return LLMJudge.from_settings({"model": MODEL, "base_url": fake.url, **settings}, WHERE)


def judged(judge: LLMJudge, completions: list, prompts: list | None = None, answers: list | None = None) -> list:
    """The judge's values of ``completions``, as a reward call gets them."""
    prompts = prompts or ["What is 2+2?"] * len(completions)
    return asyncio.run(judge(prompts=prompts, completions=completions, answer=answers or ["4"] * len(completions),
                             completion_ids=[[]] * len(completions), trainer_state=None))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("settings, reply, expected", [
    ({}, "VERDICT: incorrect. On reflection it holds: verdict:  Correct", 1.0),  # the last match counts
    ({}, "VERDICT:INCORRECT", 0.0),
    ({"verdict": r"answer:\s*(\w+)", "labels": {" Yes ": 1, "no": -1.5}}, "ANSWER: yes", 1.0),
    ({"verdict": r"answer:\s*(\w+)", "labels": {" Yes ": 1, "no": -1.5}}, "answer: No", -1.5),
    ({"verdict": r"score:\s*(\S+)", "labels": None}, "Score: 3 at first, but final score: 8.5", 8.5),
])
def test_the_last_verdict_is_mapped_by_labels_or_read_as_a_number(settings, reply, expected):
    judge = LLMJudge(JudgeConfig(model=MODEL, **settings), WHERE)
    assert judge.reward(reply) == expected


@pytest.mark.parametrize("settings, reply, why", [
    ({}, "I cannot tell whether the answer is right: it depends on the reading of the question", "no verdict in"),
    ({"labels": {"correct": 1.0}}, "VERDICT: incorrect", "verdict 'incorrect' not a label"),
    ({"verdict": r"score:\s*(\S+)", "labels": None}, "Score: high", "verdict 'high' not a number"),
])
def test_a_reply_without_a_usable_verdict_is_an_invalid_reward_with_a_short_repr(settings, reply, why):
    value = LLMJudge(JudgeConfig(model=MODEL, **settings), WHERE).reward(reply)
    assert isinstance(value, NoVerdict) and reward_problem(value) == "not a real number"
    assert repr(value).startswith(f"<{why}") and len(repr(value)) <= 40


def test_the_template_system_message_and_key_reach_the_endpoint(fake, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    fake.reply = lambda messages: "VERDICT: correct"
    judge = judge_of(fake, api_key_env="JUDGE_KEY", system="Be strict.", max_tokens=7,
                     template="Q={prompt} A={completion} R={{{answer}}}")
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"},
            {"role": "assistant", "content": "hm"}, {"role": "user", "content": "What is 2+2?"}]
    values = judged(judge, ["4", [{"role": "assistant", "content": "5"}]], prompts=["What is 2+2?", chat])
    assert values == [1.0, 1.0]
    assert [key for key, _ in fake.requests] == ["Bearer sk-judge"] * 2
    bodies = sorted((body for _, body in fake.requests), key=lambda b: b["messages"][1]["content"])
    assert [b["messages"] for b in bodies] == [
        [{"role": "system", "content": "Be strict."}, {"role": "user", "content": f"Q=What is 2+2? A={c} R={{4}}"}]
        for c in "45"]
    assert {(b["model"], b["max_tokens"], b["temperature"]) for b in bodies} == {(MODEL, 7, 0.0)}


def test_without_the_key_variable_the_key_is_empty(fake, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert judged(judge_of(fake), ["4", "5"]) == [1.0, 0.0]
    assert [key for key, _ in fake.requests] == ["Bearer EMPTY"] * 2


def test_a_groups_completions_are_judged_concurrently(fake):
    fake.delay = 0.3
    judge = judge_of(fake)
    start = time.perf_counter()
    values = judged(judge, [str(i) for i in range(8)])
    assert values == [float(i == 4) for i in range(8)]
    assert time.perf_counter() - start < 1.2  # one at a time: 2.4 s


@pytest.mark.parametrize("template, needs", [(None, True), ("{prompt}: {completion}", False),
                                             ("{completion} vs {answer}", True)])
def test_needs_answer_is_whether_the_template_shows_it(template, needs):
    settings = {} if template is None else {"template": template}
    assert LLMJudge(JudgeConfig(model=MODEL, **settings), WHERE).needs_answer is needs


@pytest.mark.parametrize("settings, message", [
    ("gpt", f"{WHERE}='gpt' is invalid: must be a mapping of judge settings (model, base_url, "),
    ({"base_url": "http://x/v1"}, f"{WHERE}.model is missing"),
    ({"model": MODEL, "temprature": 1}, f"{WHERE}.temprature is not a key (did you mean {WHERE}.temperature?); "
                                        f"allowed: model, base_url, api_key_env, template, system, verdict, labels"),
    ({"model": ""}, f"{WHERE}.model='' is invalid"),
    ({"model": MODEL, "base_url": "127.0.0.1:8000/v1"}, f"{WHERE}.base_url='127.0.0.1:8000/v1' is invalid: must "
                                                        f"be an http(s) URL"),
    ({"model": MODEL, "api_key_env": ""}, f"{WHERE}.api_key_env='' is invalid"),
    ({"model": MODEL, "template": "{question}: {completion}"}, f"{WHERE}.template has the placeholder {{question}}: "
                                                               f"allowed: {{prompt}}, {{completion}}, {{answer}}"),
    ({"model": MODEL, "template": "{}: {completion}"}, f"{WHERE}.template has the placeholder {{}}"),
    ({"model": MODEL, "template": "{completion} as JSON {\"ok\": true}"}, f"{WHERE}.template has the placeholder"),
    ({"model": MODEL, "template": "{completion} }"}, f"{WHERE}.template is not a str.format template (Single '}}'"),
    ({"model": MODEL, "template": "{completion!x}"}, f"{WHERE}.template is not a str.format template"),
    ({"model": MODEL, "template": "{prompt} {answer}"}, f"{WHERE}.template has no {{completion}}"),
    ({"model": MODEL, "template": 3}, f"{WHERE}.template=3 is invalid: must be a string"),
    ({"model": MODEL, "verdict": "VERDICT: (correct"}, f"{WHERE}.verdict='VERDICT: (correct' is invalid: not a "
                                                       f"regular expression"),
    ({"model": MODEL, "verdict": "VERDICT: correct"}, f"{WHERE}.verdict='VERDICT: correct' is invalid: must be a "
                                                      f"regular expression with a group"),
    ({"model": MODEL, "labels": {"yes": "1"}}, f"{WHERE}.labels={{'yes': '1'}} is invalid: must be a mapping of "
                                               f"strings to numbers"),
    ({"model": MODEL, "labels": {"yes": math.inf}}, f"{WHERE}.labels={{'yes': inf}} is invalid: must be a non-empty"),
    ({"model": MODEL, "labels": {}}, f"{WHERE}.labels={{}} is invalid"),
    ({"model": MODEL, "max_tokens": 0}, f"{WHERE}.max_tokens=0 is invalid: must be a positive integer"),
    ({"model": MODEL, "max_tokens": 2.5}, f"{WHERE}.max_tokens=2.5 is invalid: must be an integer"),
    ({"model": MODEL, "timeout_s": 0}, f"{WHERE}.timeout_s=0 is invalid: must be a finite number > 0"),
    ({"model": MODEL, "max_retries": -1}, f"{WHERE}.max_retries=-1 is invalid: must be a finite number >= 0"),
    ({"model": MODEL, "max_retries": True}, f"{WHERE}.max_retries=True is invalid: must be an integer"),
    ({"model": MODEL, "temperature": -0.1}, f"{WHERE}.temperature=-0.1 is invalid: must be a finite number >= 0"),
])
def test_every_bad_setting_fails_in_one_line_naming_its_key(settings, message):
    with pytest.raises(ValueError) as error:
        LLMJudge.from_settings(settings, WHERE)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def dataset(tmp_path, **kwargs) -> DatasetTask:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [
        {"prompt": "What is 2+2?", "answer": "4"},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3*3?"}],
         "answer": "9"}]))
    return DatasetTask(train_path=str(path), **kwargs)


def test_an_endpoint_down_at_start_fails_the_task_in_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ValueError) as error:
        dataset(tmp_path, reward_fns=["judge"], judge={"model": MODEL, "base_url": url})
    assert re.fullmatch(rf"{WHERE}.base_url='{url}': nothing answers at {url} \(\[Errno \d+\] Connection refused\): "
                        rf"start the server \(e.g. vllm serve {MODEL}\) or fix the URL", str(error.value))


def test_an_endpoint_that_refuses_the_key_or_lacks_the_model_fails_at_start(fake, monkeypatch):
    fake.key = "sk-right"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    with pytest.raises(ValueError, match=rf"^{WHERE}.base_url='{fake.url}': GET {fake.url}/models answered HTTP "
                                         rf"401: set OPENAI_API_KEY to the endpoint's key$"):
        judge_of(fake)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-right")
    fake.models = ["a", "b"]
    with pytest.raises(ValueError, match=rf"^{WHERE}.model='{MODEL}' is not served at {WHERE}.base_url='{fake.url}': "
                                         rf"it serves a, b; set {WHERE}.model to one of them$"):
        judge_of(fake)


def test_an_endpoint_that_is_not_the_apis_root_fails_at_start(tmp_path):
    # A web page at base_url answers 200 with no model list: the probe says where the API's root is.
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(ValueError) as error:
            dataset(tmp_path, reward_fns=["judge"], judge={"model": MODEL, "base_url": url})
    finally:
        server.shutdown()
        server.server_close()
    assert str(error.value) == (f"{WHERE}.base_url='{url}': GET {url}/models answered '<html>hello<..., not the "
                                f"OpenAI API's list of models: base_url must be the API's root, e.g. "
                                f"http://host:8000/v1")


def test_a_request_past_its_timeout_or_failing_stops_in_one_line(fake):
    judge = judge_of(fake, timeout_s=0.2, max_retries=0)
    fake.delay = 1.0
    with pytest.raises(RuntimeError, match=rf"^judge at {fake.url} did not answer within 0.2 s \(0 retries\)$"):
        judged(judge, ["4"])
    fake.delay, fake.status = 0.0, 500
    fake.requests.clear()
    with pytest.raises(RuntimeError, match=rf"^judge at {fake.url} answered HTTP 500 \(1 retries\)$"):
        judged(judge_of(fake, max_retries=1), ["4"])
    assert len(fake.requests) == 2  # the client's own retry


def test_the_task_sums_the_judge_with_the_other_rewards(fake, tmp_path):
    task = dataset(tmp_path, reward_fns=["judge"], judge={"model": MODEL, "base_url": fake.url})
    plain, chat = task.problems("train")
    assert task.score_group(plain, ["4", "5", " 4 "], [[]] * 3, 0).rewards == [1.0, 0.0, 1.0]
    assert task.score_group(chat, ["9", "3"], [[]] * 2, 0).rewards == [1.0, 0.0]
    assert "Problem:\nWhat is 3*3?\n" in fake.requests[-1][1]["messages"][0]["content"]  # the last user message

    fake.reply = lambda messages: grade([{"content": messages[-1]["content"].replace("\nfour\n", "\n4\n")}])
    both = dataset(tmp_path, reward_fns=["exact_match", "judge"], reward_weights=[1.0, 2.0],
                   judge={"model": MODEL, "base_url": fake.url})
    scores = both.score_group(plain, ["4", "5", "four"], [[]] * 3, 0)
    assert scores.terms == {"exact_match": [1.0, 0.0, 0.0], "judge": [1.0, 0.0, 1.0]}
    assert scores.rewards == [3.0, 0.0, 2.0]

    fake.delay = 1.0
    timed = dataset(tmp_path, reward_fns=["judge"], judge={"model": MODEL, "base_url": fake.url, "timeout_s": 0.2,
                                                           "max_retries": 0})
    with pytest.raises(RunStopped, match=rf"^reward function 'judge' raised RuntimeError: judge at {fake.url} did "
                                         rf"not answer within 0.2 s \(0 retries\) for prompt 'What is 2\+2\?'"):
        timed.score_group(plain, ["4"], [[]], 0)


def test_a_reply_without_a_verdict_follows_on_invalid_reward(fake, tmp_path):
    fake.reply = lambda messages: "Hard to say."
    task = dataset(tmp_path, reward_fns=["exact_match", "judge"], judge={"model": MODEL, "base_url": fake.url})
    problem = task.problems("train")[0]
    scores = task.score_group(problem, ["4"], [[]], 0)
    assert math.isnan(scores.terms["judge"][0])
    (value,) = scores.rewards
    with pytest.raises(RunStopped) as error:
        checked_reward(value, task="dataset", prompt=problem.prompt, completion="4", on_invalid="error")
    assert str(error.value) == ("task 'dataset' returned reward <no verdict in 'Hard to say.'> for prompt 'What is "
                                "2+2?' (completion '4'): not a real number; rewards must be finite real numbers (set "
                                "data.on_invalid_reward=drop to drop such groups)")
    assert math.isnan(checked_reward(value, task="dataset", prompt=problem.prompt, completion="4", on_invalid="drop"))


# ---------------------------------------------------------------------------------------------
# the local model: the real tiny model, its replies random but greedy
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model, tokenizer = build_tiny(TinyModelConfig(), tmp_path_factory.mktemp("cache"))
    path = tmp_path_factory.mktemp("judge")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_a_local_judge_generates_the_groups_judged_at_once_together_and_greedily(tiny_dir):
    """Two groups awaited together: one left-padded ``generate`` of all six conversations, each reply what
    the model gives that conversation alone, greedily (the same twice)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    judge = LLMJudge.from_settings({"model": tiny_dir, "labels": None, "verdict": r"(\d)", "max_tokens": 3,
                                    "template": "{prompt}={completion}"}, WHERE)
    replies = []
    judge.reward = lambda reply: replies.append(reply) or reply  # the raw replies

    async def two_groups():
        return await asyncio.gather(judge(prompts=["1+2"] * 2, completions=["3", "12"], answer=["3"] * 2),
                                    judge(prompts=["4+40"] * 4, completions=["44", "5", "9", "0"], answer=["44"] * 4))

    first = asyncio.run(two_groups())
    assert judge._batched.computations == 1
    assert asyncio.run(two_groups()) == first and judge._batched.computations == 2
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    alone = []
    for prompt, completion in [("1+2", "3"), ("1+2", "12"), ("4+40", "44"), ("4+40", "5"), ("4+40", "9"),
                               ("4+40", "0")]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": f"{prompt}={completion}"}],
                                            add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        alone.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    assert replies[:6] == alone


def test_a_local_directory_that_is_not_a_model_fails_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=rf"^{WHERE}.model='{tmp_path}' has no config.json: must be a Hugging "
                                         rf"Face model directory \(without {WHERE}.base_url the judge is a local "
                                         rf"causal LM\)$"):
        LLMJudge.from_settings({"model": str(tmp_path)}, WHERE)
