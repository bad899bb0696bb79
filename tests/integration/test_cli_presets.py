"""Every preset trains 2 RL iterations through the CLI on the tiny model: grpo (the default) and ppo
(the critic) in a real subprocess, where stderr shows any dependency noise; the other presets through
the same entry point in this process (``cli_here``), which saves each a new interpreter's imports."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.launch.presets import group_options

from .conftest import FAST, run_dir

PRESETS = group_options("algo")
IN_A_SUBPROCESS = ("grpo", "ppo")
WITH_A_REFERENCE = {"reinforce_plus_plus": "reference model", "reinforce_plus_plus_baseline": "reference model",
                    "opd": "teacher", "kdrl": "teacher"}
"""The presets that build a reference (actor.kl_ctl or actor.kl_loss_coef > 0) -> what it is."""


def iterations_done(cwd) -> int:
    """The global step of the run's last.ckpt: the iterations the run made."""
    last = run_dir(cwd) / "checkpoints" / "last.ckpt"
    return torch.load(last, map_location="cpu", weights_only=True)["global_step"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_fits_two_iterations(cli, cli_here, preset, request, capfd):
    extra = {"dapo": ["data.max_attempts_factor=50"],
             "opd": [f"model.teacher={request.getfixturevalue('teacher')}"],
             "kdrl": [f"model.teacher={request.getfixturevalue('teacher')}"]}.get(preset, [])
    capfd.readouterr()  # building the teacher is the test's own output, not the run's
    subprocess_ = preset in IN_A_SUBPROCESS
    # Each preset trains here; the untrained policy's evaluation is another test's (test_compare_sweep).
    result = (cli if subprocess_ else cli_here)("fit", f"algo={preset}", *FAST, "eval.before_training=false", *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    if subprocess_:  # Lightning logs through a handler made at import, which pytest's capture does not see
        assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout
    assert iterations_done(cli.cwd) == 2
    # Piped output: one plain progress line per iteration, and no dependency noise.
    lines = [line for line in result.stdout.splitlines() if line.startswith("iteration ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"], result.stdout
    assert all(f" {name} " in lines[-1] for name in ("reward", "approx_kl", "entropy", "length", "s/it")), lines[-1]
    # TRL's kl (the KL to the reference or teacher) beside the policy's change, on the console and in the summary.
    reference = WITH_A_REFERENCE.get(preset)
    assert (" kl " in lines[-1]) == (reference is not None), lines[-1]
    summary = result.stdout.splitlines()[result.stdout.splitlines().index("run summary"):]
    assert any(line.startswith("  approx_kl ") and line.endswith("the policy's change per update (actor/approx_kl)")
               for line in summary), summary
    kl_rows = [line for line in summary if line.startswith("  kl ")]
    assert len(kl_rows) == (reference is not None), summary
    assert all(row.endswith(f"KL to the {reference}, TRL's kl (actor/kl_ref)") for row in kl_rows), kl_rows
    assert "eval at iteration 0" not in result.stdout  # eval.before_training=false
    for noise in ("litlogger", "LeafSpec", "Loading weights", "Failed to load weights"):
        assert noise not in result.stderr, noise
    config = (run_dir(cli.cwd) / "config.yaml").read_text()
    assert f"algo: {preset}" in config


@pytest.mark.slow
def test_ppo_with_kl_reference_and_rejection_group(cli_here):
    result = cli_here("fit", "algo=ppo", "rejection=icepop", "actor.kl_ctl=0.05", "+actor.kl_estimator=k3", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    assert iterations_done(cli_here.cwd) == 2
    last = [line for line in result.stdout.splitlines() if line.startswith("iteration ")][-1]
    assert " kl " in last and " approx_kl " in last, last  # the KL to the reference beside the policy's change


@pytest.mark.slow
@pytest.mark.parametrize("preset, extra", [
    ("cispo", ["rejection=icepop"]),
    ("dppo", ["rejection=kpop", "actor.top_entropy_quantile=0.2"]),
    ("reinforce_plus_plus_baseline", ["rejection=geo_mask"]),
    ("m2po", ["rejection=icepop"]),
    ("gmpo", ["rejection=kpop"]),
    ("kl_cov", ["rejection=icepop"]),
])
def test_the_newer_presets_take_a_rejection_mask_under_asynchronous_rollouts(cli_here, preset, extra):
    result = cli_here("fit", f"algo={preset}", *extra, "rollout.max_head_offpolicyness=1", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    assert iterations_done(cli_here.cwd) == 2
    config = (run_dir(cli_here.cwd) / "config.yaml").read_text()
    assert "use_decoupled_loss: true" in config and "max_head_offpolicyness: 1" in config


@pytest.mark.slow
@pytest.mark.parametrize("method, passes", [("recompute", 2), ("loglinear", 0), ("linear", 0)])
def test_an_approximated_proximal_policy_skips_the_recomputing_pass(cli_here, monkeypatch, method, passes):
    """algo=icepop under asynchronous rollouts: 'recompute' makes one forward pass without gradients per
    iteration before the update, the approximations none."""
    import lit_ppo.training.module as module

    calls = []
    stitched = module.stitched_passes
    monkeypatch.setattr(module, "stitched_passes", lambda *a, **k: calls.append(1) or stitched(*a, **k))
    result = cli_here("fit", "algo=icepop", f"actor.prox_logp_method={method}", "rollout.max_head_offpolicyness=1",
                      *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    assert iterations_done(cli_here.cwd) == 2 and len(calls) == passes


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["actor.kl_loss_coef=0.05"], ["model.teacher={teacher}", "actor.kl_loss_coef=0.1"]])
def test_a_kl_term_in_the_loss_to_the_reference_or_a_teacher(cli_here, teacher, capfd, extra):
    capfd.readouterr()  # building the teacher is the test's own output, not the run's
    result = cli_here("fit", "algo=grpo", *[a.format(teacher=teacher) for a in extra], *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    assert iterations_done(cli_here.cwd) == 2
