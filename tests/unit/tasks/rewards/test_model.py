"""A sequence classifier directory as a reward (lit_ppo.tasks.rewards.model): its scores equal the model's
logits computed one text at a time (padding, truncation, the chat template and the normalisation
checked against them), the calls of a batch's groups share forward passes, and every bad directory or
setting fails in one line before any weight loads."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lit_ppo.models import TinyModelConfig, build_tiny
from lit_ppo.tasks.rewards import RewardCall, resolve_reward_fns, score_calls
from lit_ppo.tasks.rewards.model import RewardModel, is_model_path

WHERE = "data.task_kwargs.reward_fns[0]"
SETTINGS = "data.task_kwargs.reward_model"
W = re.escape(WHERE)


def classifier(path: Path, labels: int = 1, chat_template: bool = True) -> str:
    """A tiny Llama sequence classifier with ``labels`` labels and the tiny tokenizer, saved to ``path``."""
    from transformers import AutoModelForSequenceClassification

    policy, tokenizer = build_tiny(TinyModelConfig(), path.parent / "cache")
    config = policy.config
    config.num_labels = labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(labels)
        model = AutoModelForSequenceClassification.from_config(config)
    if not chat_template:
        tokenizer.chat_template = None
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if not chat_template:
        (path / "chat_template.jinja").unlink(missing_ok=True)
    return str(path)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return classifier(tmp_path_factory.mktemp("rm") / "my-rm")


def reward_model(path: str, **settings) -> RewardModel:
    return RewardModel.from_settings(path, settings or None, WHERE, SETTINGS)


def scored(rm: RewardModel, prompts: list, completions: list) -> list[float]:
    return asyncio.run(rm(prompts=prompts, completions=completions, completion_ids=[[]] * len(completions)))


def logits_one_by_one(path: str, texts: list[str], label: int = 0) -> list[float]:
    """Each text's logit, run alone (no padding), from the directory read afresh."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return [float(model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, label])
                for t in texts]


def chat(path: str, prompt, completion: str) -> str:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return AutoTokenizer.from_pretrained(path).apply_chat_template(
        [*messages, {"role": "assistant", "content": completion}], tokenize=False)


PROMPTS = ["1+2=", "13+29=", "7+7="]
COMPLETIONS = ["3", "42 is the answer", "14"]


def test_scores_are_the_logits_of_each_conversation_through_the_chat_template(rm_dir):
    rm = reward_model(rm_dir, batch_size=2)  # a padded batch of two, then one alone
    assert rm._model is None  # nothing loads before the first scoring
    texts = [chat(rm_dir, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scored(rm, PROMPTS, COMPLETIONS) == pytest.approx(logits_one_by_one(rm_dir, texts), abs=1e-5)
    # A prompt given as chat messages: its own messages, then the completion.
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "2+2="}]
    (value,) = scored(rm, [messages], [[{"role": "assistant", "content": "4"}]])
    assert value == pytest.approx(logits_one_by_one(rm_dir, [chat(rm_dir, messages, "4")])[0], abs=1e-5)


def test_normalised_then_squashed(rm_dir):
    raw = scored(reward_model(rm_dir), PROMPTS, COMPLETIONS)
    for squash, f in [("sigmoid", lambda x: 1 / (1 + math.exp(-x))), ("tanh", math.tanh), (None, lambda x: x)]:
        values = scored(reward_model(rm_dir, mean=0.5, std=2.0, squash=squash), PROMPTS, COMPLETIONS)
        assert values == pytest.approx([f((r - 0.5) / 2.0) for r in raw], abs=1e-5)


def test_without_a_chat_template_the_prompt_text_is_followed_by_the_completion(tmp_path):
    path = classifier(tmp_path / "plain-rm", chat_template=False)
    assert scored(reward_model(path), PROMPTS, COMPLETIONS) == pytest.approx(
        logits_one_by_one(path, [p + c for p, c in zip(PROMPTS, COMPLETIONS)]), abs=1e-5)


def test_a_long_text_keeps_its_last_max_length_tokens(rm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    text = chat(rm_dir, "1+2=", "3" * 40)
    kept = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][-16:])
    (value,) = scored(reward_model(rm_dir, max_length=16), ["1+2="], ["3" * 40])
    assert value == pytest.approx(logits_one_by_one(rm_dir, [kept])[0], abs=1e-5)


def test_a_classifier_with_several_labels_scores_the_named_label(tmp_path):
    path = classifier(tmp_path / "two-labels", labels=2)
    texts = [chat(path, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scored(reward_model(path, label=1), PROMPTS, COMPLETIONS) == pytest.approx(
        logits_one_by_one(path, texts, label=1), abs=1e-5)
    with pytest.raises(ValueError, match=rf"^{W}='{path}' has 2 labels: set {SETTINGS}.label to the one whose "
                                         r"logit is the reward \(0 to 1\)$"):
        reward_model(path)
    with pytest.raises(ValueError, match=rf"^{SETTINGS}.label=2 is invalid for '{path}': it has 2 label\(s\), 0 to 1$"):
        reward_model(path, label=2)


def test_the_groups_of_a_batch_share_forward_passes(rm_dir, monkeypatch):
    fns = resolve_reward_fns([rm_dir], None, "x", reward_model={"batch_size": 4})
    rm = fns[0].fn
    assert fns[0].metric == "my-rm" and not fns[0].takes_answer
    rows = []
    forward = type(rm._loaded_model()).forward

    def counted(model, input_ids=None, **kwargs):
        rows.append(input_ids.shape[0])
        return forward(model, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(rm._loaded_model()), "forward", counted)
    calls = [RewardCall([p] * 3, ["1", "22", "333"], [[]] * 3, {}, [""] * 3) for p in PROMPTS]
    groups = score_calls(fns, calls, step=0)
    assert rm._batched.computations == 1 and rows == [4, 4, 1]  # nine texts of three groups, four at a time
    texts = [chat(rm_dir, p, c) for p in PROMPTS for c in ["1", "22", "333"]]
    assert [r for g in groups for r in g.rewards] == pytest.approx(logits_one_by_one(rm_dir, texts), abs=1e-5)


def test_offload_keeps_the_weights_in_cpu_memory_between_scorings(rm_dir, monkeypatch):
    rm = reward_model(rm_dir, offload=True, device="cpu")
    model = rm._loaded_model()
    moves = []
    to = type(model).to

    def recorded(self, *args, **kwargs):
        moves.append(str(args[0]))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "to", recorded)
    scored(rm, PROMPTS, COMPLETIONS)
    scored(rm, PROMPTS, COMPLETIONS)
    assert moves == ["cpu", "cpu"] * 2  # to the device to score (here the CPU), back to the CPU after
    assert next(model.parameters()).device.type == "cpu"


def test_dtype(rm_dir):
    rm = reward_model(rm_dir, dtype="bfloat16")
    scored(rm, PROMPTS[:1], COMPLETIONS[:1])
    assert next(rm._model.parameters()).dtype == torch.bfloat16


def test_entries_that_name_directories():
    assert is_model_path("./rm") and is_model_path("org/reward-model") and is_model_path("/abs/rm")
    assert not is_model_path("my_rewards.correct") and not is_model_path("exact_match")


def test_a_directory_that_is_not_a_reward_model_fails_in_one_line(tmp_path, rm_dir):
    policy, tokenizer = build_tiny(TinyModelConfig(), tmp_path / "cache")
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    tail = re.escape(": a reward model directory holds a sequence classifier, as TRL's RewardTrainer saves it "
                     "(config.json's architectures such as LlamaForSequenceClassification, and the weights of its "
                     "score head)") + "$"
    with pytest.raises(ValueError, match=rf"^{W}='{tmp_path}/policy' is a causal LM \(config.json's architectures: "
                                         rf"LlamaForCausalLM\), not a sequence classifier{tail}"):
        reward_model(str(tmp_path / "policy"))
    # A causal LM whose config.json names no class (transformers then builds a classifier from it, whose score
    # head the weights lack): told by its weights.
    config = json.loads((tmp_path / "policy" / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "policy" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"^{W}='{tmp_path}/policy' is a causal LM \(its weights are a "
                                         rf"LlamaForCausalLM's, and config.json names no architectures\), not a "
                                         rf"sequence classifier{tail}"):
        reward_model(str(tmp_path / "policy"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=rf"^{W}='{tmp_path}/empty' has no config.json: must be a Hugging Face "
                                         rf"model directory{tail}"):
        reward_model(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=rf"^{W}='{tmp_path}/missing' is not a directory{tail}"):
        reward_model(str(tmp_path / "missing"))
    # A classifier saved without its head: transformers would start it from random weights.
    headless = Path(classifier(tmp_path / "headless"))
    weights = load_file(headless / "model.safetensors")
    del weights["score.weight"]
    save_file(weights, headless / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"^{W}='{headless}' lacks the weight score.weight that config.json's "
                                         rf"LlamaForSequenceClassification has{tail}"):
        reward_model(str(headless))


@pytest.mark.parametrize("settings, message", [
    ({"device": "tpu"}, f"{SETTINGS}.device='tpu' is invalid: must be auto, cpu, cuda or cuda:N"),
    ({"dtype": "int8"}, f"{SETTINGS}.dtype='int8' is invalid: must be one of 'auto', 'float32', 'bfloat16', "
                        f"'float16'"),
    ({"batch_size": 0}, f"{SETTINGS}.batch_size=0 is invalid"),
    ({"max_length": -1}, f"{SETTINGS}.max_length=-1 is invalid"),
    ({"label": -1}, f"{SETTINGS}.label=-1 is invalid: must be a label index >= 0, or null"),
    ({"std": 0}, f"{SETTINGS}.std=0 is invalid"),
    ({"squash": "relu"}, f"{SETTINGS}.squash='relu' is invalid: must be one of 'sigmoid', 'tanh'"),
    ({"offload": "yes"}, f"{SETTINGS}.offload='yes' is invalid: must be true or false"),
    ({"devcie": "cpu"}, f"{SETTINGS}.devcie is not a setting of a reward model: allowed: device, dtype, batch_size"),
    ("cpu", f"{SETTINGS}='cpu' is invalid: must be a mapping of device, dtype"),
])
def test_every_bad_setting_fails_in_one_line_naming_its_key(rm_dir, settings, message):
    with pytest.raises(ValueError) as e:
        resolve_reward_fns([rm_dir], None, "x", reward_model=settings)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_cuda_where_there_is_none_fails_in_one_line(rm_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match=rf"^{SETTINGS}.device='cuda': this machine has no CUDA device; use auto or "
                                         r"cpu$"):
        resolve_reward_fns([rm_dir], None, "x", reward_model={"device": "cuda"})


def test_settings_that_no_entry_uses_are_refused():
    with pytest.raises(ValueError, match=rf"^{SETTINGS} is set but no entry of data.task_kwargs.reward_fns is a reward "
                                         r"model directory: add one, or remove data.task_kwargs.reward_model$"):
        resolve_reward_fns(["exact_match"], None, "x", reward_model={"squash": "sigmoid"})
