"""The shipped presets of ``conf/`` (``lit_ppo.launch.presets``, composed by ``lit_ppo.launch.compose``).

Every algorithm preset composes, and its advantages on a fixed batch equal its paper's formula.
The batch: 2 prompt groups of 3 samples; rows have 2, 3 or 1 generated tokens after a 2-token
prompt. Outcome rewards r = [1, 0, 1 | 0, 0, 1]. Each expected value is computed here from the
formula with plain Python, not from lit_ppo.algos.

Trainer presets: the same `trainer=ddp` / `trainer=fsdp` command suits a CPU machine (2 gloo
processes, fp32) and a GPU machine (every visible GPU, NCCL, bf16-mixed); `trainer=gpu` is one GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from lit_ppo.algos import compute_advantages, policy_loss
from lit_ppo.algos.checks import check_names
from lit_ppo.config import PPOActorConfig
from lit_ppo.launch.compose import compose
from lit_ppo.launch.presets import conf_dir, group_options

REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
GROUPS = [[0, 1, 2], [3, 4, 5]]
LENGTHS = [2, 3, 1, 3, 2, 2]  # generated tokens per row
T = 6  # 2 prompt tokens + up to 3 generated + 1 padding


def batch_mask() -> torch.Tensor:
    mask = torch.zeros(len(LENGTHS), T, dtype=torch.bool)
    for b, n in enumerate(LENGTHS):
        mask[b, 2:2 + n] = True
    return mask


def actor_of(preset: str) -> PPOActorConfig:
    tree = compose([f"algo={preset}", "logger=none"])
    return PPOActorConfig(**tree["model"]["actor"])


def mean(xs):
    return sum(xs) / len(xs)


def std_unbiased(xs, mu):
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def token_batch_zscore(per_row: list[float], eps: float = 1e-5) -> list[float]:
    """adv_norm batch/batch: every generated token is one sample (token-weighted mean and std)."""
    tokens = [v for v, n in zip(per_row, LENGTHS) for _ in range(n)]
    mu = mean(tokens)
    sd = std_unbiased(tokens, mu)
    return [(v - mu) / (sd + eps) for v in per_row]


def group_zscore(eps: float = 1e-5, values: list[float] = REWARDS) -> list[float]:
    out = [0.0] * len(values)
    for g in GROUPS:
        rs = [values[i] for i in g]
        mu = mean(rs)
        sd = std_unbiased(rs, mu)
        for i in g:
            out[i] = (values[i] - mu) / (sd + eps)
    return out


def advantages_of(cfg: PPOActorConfig, **kwargs) -> torch.Tensor:
    mask = batch_mask()
    adv = compute_advantages(torch.tensor(REWARDS), mask, cfg, group_sizes=[3, 3], **kwargs).advantages
    assert (adv[~mask] == 0).all()
    return adv


def assert_rows(adv: torch.Tensor, per_row: list[float]) -> None:
    """Outcome-reward algorithms without a critic broadcast one value to every generated token."""
    mask = batch_mask()
    expected = torch.zeros_like(adv)
    for b, v in enumerate(per_row):
        expected[b, mask[b]] = v
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_every_algo_preset_composes_into_a_valid_actor():
    presets = group_options("algo")
    assert set(presets) >= {"ppo", "grpo", "drgrpo", "liteppo", "rloo", "gspo", "dapo", "dapo_dynamic_bs", "sapo",
                            "icepop", "kpop"}
    for preset in presets:
        needs = ["model.teacher=some-teacher"] if preset in ("opd", "kdrl") else []  # no default teacher
        tree = compose([f"algo={preset}", "logger=none", *needs])
        assert tree["model"]["algo"] == preset
        check_names(PPOActorConfig(**tree["model"]["actor"]))  # the names and each loss's rule


def test_opd_distils_the_teacher_token_by_token():
    # kl_ctl 1, k1, discount 0, reward scaled to 0, no normalisation: A_t = -(old_logp_t - teacher_logp_t) on
    # each generated token (the reference slot holds the teacher), whatever the task's reward.
    tree = compose(["algo=opd", "logger=none", "model.teacher=some-teacher"])
    assert tree["model"]["model"]["teacher"] == "some-teacher"
    cfg = PPOActorConfig(**tree["model"]["actor"])
    old, teacher, deltas = kl_batch()
    adv = advantages_of(cfg, old_logp=old, ref_logp=teacher)
    for b, row in enumerate(deltas):
        torch.testing.assert_close(adv[b, 2:2 + LENGTHS[b]], -torch.tensor(row), atol=1e-6, rtol=1e-6)


def test_kdrl_is_grpo_plus_beta_times_the_k2_reverse_kl_to_the_teacher_in_the_loss():
    # On-policy (logp = old_logp, r = 1, no clip): L = mean_t(-A_t) + 0.005 * mean_t (logp_t - T_t)^2 / 2 over the
    # N generated tokens, and dL/dlogp_t = (-A_t + 0.005 * (logp_t - T_t)) / N; A is grpo's (group, then batch z-score).
    # This is verl's policy loss plus distillation_loss_coef 0.005 times its token-mean k2 ("mse") distillation loss
    # (verl/trainer/distillation/losses.py with use_task_rewards and use_policy_gradient false).
    tree = compose(["algo=kdrl", "logger=none", "model.teacher=some-teacher"])
    assert tree["model"]["model"]["teacher"] == "some-teacher"
    cfg = PPOActorConfig(**tree["model"]["actor"])
    assert_rows(advantages_of(cfg), token_batch_zscore(group_zscore()))
    old, teacher, deltas = kl_batch()
    mask = batch_mask()
    per_row = token_batch_zscore(group_zscore())
    adv = torch.zeros(len(LENGTHS), T)
    for b, n in enumerate(LENGTHS):
        adv[b, 2:2 + n] = per_row[b]
    logp = old.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, old, adv, mask, cfg, ref_logp=teacher)
    loss.backward()
    n_tokens = sum(LENGTHS)
    tokens = [(per_row[b], d) for b, row in enumerate(deltas) for d in row]
    assert float(loss) == pytest.approx(sum(-a + 0.005 * d * d / 2 for a, d in tokens) / n_tokens, abs=1e-6)
    assert float(stats["kl_loss"]) == pytest.approx(sum(d * d / 2 for _, d in tokens) / n_tokens, rel=1e-5)
    for b, row in enumerate(deltas):
        expected = [(-per_row[b] + 0.005 * d) / n_tokens for d in row]
        torch.testing.assert_close(logp.grad[b, 2:2 + LENGTHS[b]], torch.tensor(expected), atol=1e-7, rtol=1e-5)
    assert (logp.grad[~mask] == 0).all()


@pytest.mark.parametrize("preset", ["grpo", "gspo", "sapo", "icepop", "kpop"])
def test_grpo_family_group_zscore_then_token_batch_zscore(preset):
    assert_rows(advantages_of(actor_of(preset)), token_batch_zscore(group_zscore()))


def test_drgrpo_group_mean_only_no_std():
    # A_i = r_i - mean(group): group 1 mean 2/3, group 2 mean 1/3.
    expected = [1 - 2 / 3, -2 / 3, 1 - 2 / 3, -1 / 3, -1 / 3, 1 - 1 / 3]
    assert_rows(advantages_of(actor_of("drgrpo")), expected)


def test_rloo_leave_one_out_baseline():
    # A_i = r_i - mean_{j != i} r_j
    expected = []
    for g in GROUPS:
        for i in g:
            others = [REWARDS[j] for j in g if j != i]
            expected.append(REWARDS[i] - mean(others))
    assert expected == pytest.approx([0.5, -1.0, 0.5, -0.5, -0.5, 1.0])
    assert_rows(advantages_of(actor_of("rloo")), expected)


def test_liteppo_group_mean_batch_std_of_residuals():
    residuals = []
    for g in GROUPS:
        mu = mean([REWARDS[i] for i in g])
        residuals += [REWARDS[i] - mu for i in g]
    sd = math.sqrt(sum(r * r for r in residuals) / (len(residuals) - 1))  # std around the group means
    assert_rows(advantages_of(actor_of("liteppo")), [r / (sd + 1e-5) for r in residuals])


def test_dapo_overlong_penalty_then_group_and_batch_zscore():
    cfg = actor_of("dapo")
    assert (cfg.eps_clip, cfg.eps_clip_higher) == (0.2, 0.28)
    # The arithmetic budget is 4 tokens and the buffer a quarter of it: L_ov = 1, so only a row of
    # 4 tokens would be penalised. Use a budget of 3 here: rows with 3 tokens lose (3 - 2) / 1 = 1.
    cfg = PPOActorConfig(**{**compose(["algo=dapo", "logger=none"])["model"]["actor"], "max_new_tokens": 3})
    penalised = [r - (1.0 if n == 3 else 0.0) for r, n in zip(REWARDS, LENGTHS)]
    z = [0.0] * 6
    for g in GROUPS:
        rs = [penalised[i] for i in g]
        mu, sd = mean(rs), std_unbiased(rs, mean(rs))
        for i in g:
            z[i] = (penalised[i] - mu) / (sd + 1e-5)
    assert_rows(advantages_of(cfg), token_batch_zscore(z))


def test_dapo_presets_filter_and_batch_mode():
    fixed = compose(["algo=dapo", "logger=none"])["data"]
    dynamic = compose(["algo=dapo_dynamic_bs", "logger=none"])["data"]
    assert fixed["dynamic_filter_fn"] == dynamic["dynamic_filter_fn"] == "lit_ppo.rollout.filters.mixed_outcomes"
    assert (fixed["dynamic_bs"], dynamic["dynamic_bs"]) == (False, True)


def test_ppo_gae_with_critic_values_then_batch_zscore():
    cfg = actor_of("ppo")
    assert compose(["algo=ppo", "logger=none"])["model"]["critic"] is not None
    mask = batch_mask()
    values = torch.arange(6 * T, dtype=torch.float32).reshape(6, T) / 50.0
    # gamma = lambda = 1, terminal reward, rows end with EOS (bootstrap 0): A_t = R - V_t.
    raw = torch.zeros(6, T)
    for b in range(6):
        raw[b, mask[b]] = REWARDS[b] - values[b, mask[b]]
    tokens = raw[mask].double()
    expected = torch.where(mask, (raw - tokens.mean()) / (tokens.std() + 1e-5), 0.0)
    adv = advantages_of(cfg, values=values, final_values=torch.zeros(6))
    torch.testing.assert_close(adv, expected.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("option,metric", [("icepop", "ratio"), ("kpop", "binary_kl"), ("geo_mask", "ratio")])
def test_rejection_group_adds_the_mask_to_any_preset(option, metric):
    tree = compose(["algo=rloo", f"rejection={option}", "logger=none"])
    cfg = PPOActorConfig(**tree["model"]["actor"])
    assert cfg.use_decoupled_loss and cfg.rejection_sampling.metric == metric
    assert cfg.reward_norm.mean_leave1out  # the preset's own settings are kept


def callback_args(tree: dict, class_name: str) -> dict:
    (args,) = [c["init_args"] for c in tree["trainer"]["callbacks"] if c["class_path"].endswith(class_name)]
    return args


@pytest.mark.parametrize("recipe", [r for r in group_options("recipe") if r != "none"])
def test_a_recipe_sets_every_section_it_names_and_the_command_line_still_wins(recipe):
    """conf/config.yaml's own defaults (checkpoint, samples, seed) must not override a recipe's."""
    def written(name: str, section: str) -> dict:
        """The section as the recipe's YAML writes it, over the recipes it extends, over conf/config.yaml."""
        data = yaml.safe_load((conf_dir() / "recipe" / f"{name}.yaml").read_text())
        parents = [d for d in data.get("defaults", []) if isinstance(d, str) and d != "_self_"]
        base = written(parents[0], section) if parents else yaml.safe_load(
            (conf_dir() / "config.yaml").read_text())[section]
        return {**base, **data.get(section, {})}

    checkpoint, samples = written(recipe, "checkpoint"), written(recipe, "samples")
    tree = compose([f"recipe={recipe}", "logger=none"])
    ckpt = callback_args(tree, "ModelCheckpoint")
    assert (ckpt["every_n_train_steps"], ckpt["save_top_k"]) == (checkpoint["every_n_iterations"], checkpoint["keep"])
    shown = callback_args(tree, "CompletionSamples")
    assert (shown["every_n_steps"], shown["num_samples"]) == (samples["every_n_iterations"], samples["count"])
    tree = compose([f"recipe={recipe}", "logger=none", "checkpoint.keep=5", "samples.count=2", "seed=3"])
    assert callback_args(tree, "ModelCheckpoint")["save_top_k"] == 5
    assert callback_args(tree, "CompletionSamples")["num_samples"] == 2
    assert tree["seed_everything"] == 3 and tree["data"]["seed"] == 3


def test_groups_without_signal_get_a_positive_advantage_under_batch_normalisation():
    """docs/algorithms.md#dynamic-sampling-and-dynamic-batch-size: one group of a right answer (40 tokens) and
    seven wrong ones (90), beside three all-wrong groups (90 tokens each). The expected values are the two
    z-scores written out here: group (unbiased std), then token-weighted batch."""
    lengths, rewards = [40] + [90] * 31, [1.0] + [0.0] * 31
    group = [(r - 1 / 8) / (math.sqrt((7 / 8) ** 2 / 7 + 7 * (1 / 8) ** 2 / 7) + 1e-5) if i < 8 else 0.0
             for i, r in enumerate(rewards)]
    tokens = [a for a, n in zip(group, lengths) for _ in range(n)]
    mu = mean(tokens)
    sd = std_unbiased(tokens, mu)
    expected = [(a - mu) / (sd + 1e-5) for a in group]
    mask = torch.zeros(32, 96, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    cfg = PPOActorConfig(**compose(["algo=grpo", "logger=none"])["model"]["actor"])
    adv = compute_advantages(torch.tensor(rewards), mask, cfg, group_sizes=[8] * 4).advantages
    assert [round(float(adv[b, 0]), 2) for b in (0, 1, 8)] == [7.51, -0.92, 0.13]
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected, dtype=torch.float32), atol=1e-4, rtol=1e-4)
    assert round(float(adv[0].sum())) == 300 and round(float(adv[8:].sum())) == 282


# ---------------------------------------------------------------- trainer presets

FSDP_STRATEGY = {"class_path": "lit_ppo.training.fsdp.FSDP2Strategy"}


def trainer_of(option: str) -> dict:
    return compose([f"trainer={option}"])["trainer"]


@pytest.mark.parametrize("option, strategy", [("ddp", "ddp"), ("fsdp", FSDP_STRATEGY)])
def test_multi_process_presets_on_cpu_are_two_gloo_ranks_in_fp32(monkeypatch, option, strategy):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = trainer_of(option)
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("cpu", 2, "32-true")
    assert trainer["strategy"] == strategy


@pytest.mark.parametrize("option, strategy", [("ddp", "ddp"), ("fsdp", FSDP_STRATEGY)])
def test_multi_process_presets_on_gpu_take_every_visible_gpu_in_bf16(monkeypatch, option, strategy):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = trainer_of(option)
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("gpu", "auto", "bf16-mixed")
    assert trainer["strategy"] == strategy


def test_gpu_preset_is_one_gpu_in_bf16_mixed():
    trainer = trainer_of("gpu")
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("gpu", 1, "bf16-mixed")


def test_a_key_override_beats_the_machine_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = compose(["trainer=fsdp", "trainer.devices=4", "trainer.precision=32-true"])["trainer"]
    assert (trainer["devices"], trainer["precision"]) == (4, "32-true")


# Two reward functions of the same 6 rows: correctness (REWARDS) and a format reward, weighted 1 and 0.5;
# the format reward gave None (NaN) for row 4, which GDPO reads as 0.
FORMAT = [1.0, 1.0, 0.0, 1.0, math.nan, 0.0]
WEIGHTS = [1.0, 0.5]


def test_gdpo_each_reward_group_zscored_then_the_weighted_sum_batch_zscored():
    eps = 1e-4
    columns = [group_zscore(eps, values) for values in (REWARDS, [0.0 if math.isnan(v) else v for v in FORMAT])]
    summed = [WEIGHTS[0] * a + WEIGHTS[1] * b for a, b in zip(*columns)]
    mu = mean(summed)
    sd = std_unbiased(summed, mu)  # over the rows, not the tokens
    expected = [(s - mu) / (sd + eps) for s in summed]
    terms = torch.tensor([REWARDS, FORMAT]).T
    adv = advantages_of(actor_of("gdpo"), reward_terms=terms, reward_weights=torch.tensor(WEIGHTS))
    assert_rows(adv, expected)
    # GRPO on the same rewards sums first: the format reward's differences within a group vanish where
    # the sums tie. GDPO keeps them: rows 0 and 2 (both right, one well formatted) differ.
    assert expected[0] != pytest.approx(expected[2])


def test_gdpo_with_one_reward_is_grpo_without_the_advantage_normalisation():
    assert_rows(advantages_of(actor_of("gdpo")), group_zscore(eps=1e-4))
    one = torch.tensor([REWARDS]).T
    assert_rows(advantages_of(actor_of("gdpo"), reward_terms=one, reward_weights=torch.ones(1)), group_zscore(eps=1e-4))


def kl_batch() -> tuple[torch.Tensor, torch.Tensor, list[list[float]]]:
    """old and reference log-probs of the batch's tokens, and each row's deltas old - ref on its tokens."""
    old = torch.zeros(len(LENGTHS), T)
    ref = torch.zeros(len(LENGTHS), T)
    deltas = []
    for b, n in enumerate(LENGTHS):
        row = []
        for k in range(n):
            old[b, 2 + k], ref[b, 2 + k] = -0.5 - 0.1 * k - 0.05 * b, -1.0 + 0.2 * k
            row.append(float(old[b, 2 + k] - ref[b, 2 + k]))
        deltas.append(row)
    return old, ref, deltas


def token_zscore(values: list[list[float]], eps: float = 1e-5) -> list[list[float]]:
    flat = [v for row in values for v in row]
    mu = mean(flat)
    sd = std_unbiased(flat, mu)
    return [[(v - mu) / (sd + eps) for v in row] for row in values]


@pytest.mark.parametrize("preset, estimator, baseline", [
    ("reinforce_plus_plus", lambda d: d, [0.0] * 6),
    ("reinforce_plus_plus_baseline", lambda d: d * d / 2, [2 / 3] * 3 + [1 / 3] * 3),
])
def test_reinforce_plus_plus_kl_in_each_tokens_reward_then_returns_z_scored_over_the_batch(preset, estimator,
                                                                                            baseline):
    # Token t's reward: -0.001 K(old - ref), plus the row's outcome R (minus its group's mean for the baseline
    # variant) on its last token; A_t = the undiscounted return sum_{s >= t}, then z-scored over all tokens.
    old, ref, deltas = kl_batch()
    cfg = actor_of(preset)
    returns = []
    for b, row in enumerate(deltas):
        rewards = [-0.001 * estimator(d) for d in row]
        rewards[-1] += REWARDS[b] - baseline[b]
        returns.append([sum(rewards[k:]) for k in range(len(rewards))])
    expected = token_zscore(returns)
    adv = advantages_of(cfg, old_logp=old, ref_logp=ref)
    for b, row in enumerate(expected):
        torch.testing.assert_close(adv[b, 2:2 + LENGTHS[b]], torch.tensor(row), atol=1e-5, rtol=1e-5)


def test_cispo_is_grpo_with_the_clipped_weight_loss():
    cfg = actor_of("cispo")
    assert (cfg.policy_loss, cfg.eps_clip, cfg.eps_clip_higher) == ("cispo", 1.0, 4.0)
    assert_rows(advantages_of(cfg), token_batch_zscore(group_zscore()))


def test_geo_mask_drops_rows_whose_geometric_mean_weight_leaves_one_percent():
    # l_t = prox - behave. Row 0: [.005, .005] -> exp(.005) = 1.005 kept; row 1: [.02, 0] -> exp(.01) = 1.01005
    # dropped; row 2: [-.011, -.009] -> exp(-.01) = .99005 kept. Kept rows weigh each token by their geometric
    # mean; r = 1, A = 1: L = -(2 * e^.005 + 2 * e^-.01) / 6, every token in N.
    from lit_ppo.algos import policy_loss

    cfg = PPOActorConfig(**compose(["algo=grpo", "rejection=geo_mask", "logger=none"])["model"]["actor"])
    behave = -torch.tensor([[0.005, 0.005], [0.02, 0.0], [-0.011, -0.009]])
    zeros = torch.zeros(3, 2)
    mask = torch.ones(3, 2, dtype=torch.bool)
    loss, stats = policy_loss(zeros.clone().requires_grad_(True), zeros, torch.ones(3, 2), mask, cfg,
                                 behave_logp=behave)
    assert float(loss) == pytest.approx(-(2 * math.exp(0.005) + 2 * math.exp(-0.01)) / 6, rel=1e-5)
    assert float(stats["filtered_fraction"]) == pytest.approx(2 / 6)


def test_dppo_is_the_trust_region_mask_on_the_truncated_ratio():
    cfg = actor_of("dppo")
    assert (cfg.policy_loss, cfg.eps_clip, cfg.eps_clip_higher) == ("cispo", 1.0, 19.0)
    assert (cfg.trust_region_mask.divergence, cfg.trust_region_mask.low, cfg.trust_region_mask.high) == (
        "binary_tv", 0.15, 0.15)
    assert_rows(advantages_of(cfg), token_batch_zscore(group_zscore()))


def test_gmpo_and_m2po_presets():
    gmpo = actor_of("gmpo")
    assert (gmpo.policy_loss, gmpo.importance_sampling_level, gmpo.eps_clip, gmpo.eps_clip_higher,
            gmpo.loss_agg_mode) == ("gmpo", "sequence", 0.4, 0.4, "seq-mean-token-mean")
    m2po = actor_of("m2po")
    assert (m2po.policy_loss, m2po.use_decoupled_loss, m2po.m2_threshold, m2po.ppo_n_minibatches) == (
        "unclipped", True, 0.04, 1)
    for cfg in (gmpo, m2po):
        assert_rows(advantages_of(cfg), token_batch_zscore(group_zscore()))



def test_gpg_group_mean_residual_scaled_by_the_share_of_rows_with_signal():
    # Rewards [1, 1, 1 | 1, 0, 0]: the first group is uniform (M = 3 of B = 6), alpha = 6 / 3 = 2;
    # A_i = 2 (r_i - mean_g): [0, 0, 0 | 4/3, -2/3, -2/3], broadcast to the row's tokens, no batch z-score.
    cfg = actor_of("gpg")
    assert (cfg.policy_loss, cfg.gpg_alpha, cfg.adv_norm) == ("gpg", True, None)
    mask = batch_mask()
    adv = compute_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]), mask, cfg, group_sizes=[3, 3]).advantages
    assert_rows(adv, [0.0, 0.0, 0.0, 4 / 3, -2 / 3, -2 / 3])
    # The shared batch has no uniform group: alpha = 1, the group-mean residuals as they are.
    assert_rows(advantages_of(cfg), [1 - 2 / 3, -2 / 3, 1 - 2 / 3, -1 / 3, -1 / 3, 1 - 1 / 3])


def test_clip_cov_and_kl_cov_presets():
    clip_cov, kl_cov = actor_of("clip_cov"), actor_of("kl_cov")
    assert (clip_cov.policy_loss, clip_cov.clip_cov.ratio, clip_cov.clip_cov.low, clip_cov.clip_cov.high) == (
        "ppo", 0.0002, 1.0, 5.0)
    assert (kl_cov.policy_loss, kl_cov.kl_cov.ratio, kl_cov.kl_cov.coef) == ("unclipped", 0.002, 1.0)
    for cfg in (clip_cov, kl_cov):
        assert_rows(advantages_of(cfg), token_batch_zscore(group_zscore()))



def verl_rf_baseline(deltas: list[list[float]], beta: float, estimator) -> list[list[float]]:
    """verl's ``adv_estimator=reinforce_plus_plus_baseline`` with ``use_kl_in_reward`` by hand
    (verl/trainer/ppo/ray_trainer.py apply_kl_penalty, then verl/trainer/ppo/core_algos.py
    compute_reinforce_plus_plus_baseline_outcome_advantage): each row's total reward R_b - beta sum_t K_t, centred on
    its group's mean total, put on every token, then whitened over the batch's tokens (verl_F.masked_whiten:
    (x - mean) / sqrt(unbiased var + 1e-8))."""
    totals = [REWARDS[b] - beta * sum(estimator(d) for d in row) for b, row in enumerate(deltas)]
    centred = [0.0] * len(totals)
    for g in GROUPS:
        mu = mean([totals[i] for i in g])
        for i in g:
            centred[i] = totals[i] - mu
    tokens = [[centred[b]] * len(row) for b, row in enumerate(deltas)]
    flat = [v for row in tokens for v in row]
    mu = mean(flat)
    var = sum((v - mu) ** 2 for v in flat) / (len(flat) - 1)
    return [[(v - mu) / math.sqrt(var + 1e-8) for v in row] for row in tokens]


def k2(d: float) -> float:
    return d * d / 2


@pytest.mark.parametrize("beta, measured", [(0.0, 0.0), (0.001, 1.48e-4), (0.1, 0.0169)])
def test_reinforce_plus_plus_baseline_beside_verls(beta, measured):
    # lit_ppo centres R on the group mean and adds the KL's reward-to-go on each token; verl centres each row's total
    # (R plus all its KL rewards) on the group mean and puts it on every token. Before the whitening the two differ on
    # token t of row b by exactly -sum_{s < t} kl_bs + mean_g(sum_s kl_s) (kl = -beta K); whitened, by the largest
    # |difference| measured below on this batch (per-token k2 from 0 to 0.125): none without a KL reward (up to the
    # whitening's eps), 1.5e-4 at the preset's beta 0.001, 0.017 at beta 0.1.
    old, ref, deltas = kl_batch()
    fields = {**compose(["algo=reinforce_plus_plus_baseline", "logger=none"])["model"]["actor"], "kl_ctl": beta}
    raw = advantages_of(PPOActorConfig(**{**fields, "adv_norm": None}), old_logp=old, ref_logp=ref)
    kl = [[-beta * k2(d) for d in row] for row in deltas]
    group_kl = {b: mean([sum(kl[i]) for i in g]) for g in GROUPS for b in g}
    for b, row in enumerate(deltas):
        verl_raw = REWARDS[b] + sum(kl[b]) - mean([REWARDS[i] + sum(kl[i]) for g in GROUPS if b in g for i in g])
        ours = [verl_raw - sum(kl[b][:t]) + group_kl[b] for t in range(len(row))]
        torch.testing.assert_close(raw[b, 2:2 + LENGTHS[b]], torch.tensor(ours), atol=1e-6, rtol=1e-6)
    adv = advantages_of(PPOActorConfig(**fields), old_logp=old, ref_logp=ref)
    verl = verl_rf_baseline(deltas, beta, k2)
    gap = max(abs(float(adv[b, 2 + t]) - v) for b, row in enumerate(verl) for t, v in enumerate(row))
    assert gap == pytest.approx(measured, abs=1e-4 if beta == 0 else 0.05 * measured)


# ====================================================================== beside verl and TRL
# (docs/algorithms.md#lit_ppo-beside-verl-and-trl-loss-by-loss)


def actor_with(*overrides: str) -> PPOActorConfig:
    return PPOActorConfig(**compose([*overrides, "logger=none"])["model"]["actor"])


def peer_group_advantage(eps: float | None) -> list[float]:
    """TRL's GRPOTrainer (scale_rewards='group': (r - mean_g) / (nanstd_g + 1e-4), Bessel-corrected) and verl's
    compute_grpo_outcome_advantage ((r - mean_g) / (torch.std_g + 1e-6); without norm_adv_by_std_in_grpo, or TRL's
    scale_rewards='none', r - mean_g), by hand; no normalisation after it."""
    out = [0.0] * len(REWARDS)
    for g in GROUPS:
        rs = [REWARDS[i] for i in g]
        mu = mean(rs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in rs) / (len(rs) - 1))
        for i in g:
            out[i] = REWARDS[i] - mu if eps is None else (REWARDS[i] - mu) / (sd + eps)
    return out


@pytest.mark.parametrize("overrides, eps", [
    (["algo=grpo", "actor.adv_norm=null", "actor.reward_norm.eps=1e-4"], 1e-4),  # TRL's GRPOTrainer defaults
    (["algo=gdpo"], 1e-4),  # the same with one reward function
    (["algo=grpo", "actor.adv_norm=null", "actor.reward_norm.eps=1e-6"], 1e-6),  # verl's adv_estimator=grpo
    (["algo=drgrpo"], None),  # TRL scale_rewards='none'; verl norm_adv_by_std_in_grpo=False
])
def test_group_advantages_equal_trls_and_verls(overrides, eps):
    assert_rows(advantages_of(actor_with(*overrides)), peer_group_advantage(eps))


def test_grpo_preset_differs_from_trl_and_verl_by_its_token_batch_zscore():
    # lit_ppo's grpo z-scores the group advantages once more over the batch's tokens (AReaL's example); on this batch
    # that moves a row's advantage by up to 0.39.
    ours = token_batch_zscore(group_zscore())
    gap = max(abs(a - b) for a, b in zip(ours, peer_group_advantage(1e-4)))
    assert gap == pytest.approx(0.39, abs=0.01)


def test_reinforce_plus_plus_equals_verls_up_to_the_whitening_eps():
    # verl's adv_estimator=reinforce_plus_plus (compute_reinforce_plus_plus_outcome_advantage, gamma 1) with
    # use_kl_in_reward and kl_penalty=kl (k1): the return sum_{s >= t} of R_b - beta K, whitened over the batch's tokens
    # by (x - mean) / sqrt(var + 1e-8) where lit_ppo divides by std + 1e-5.
    old, ref, deltas = kl_batch()
    returns = []
    for b, row in enumerate(deltas):
        rewards = [-0.001 * d for d in row]
        rewards[-1] += REWARDS[b]
        returns.append([sum(rewards[k:]) for k in range(len(rewards))])
    flat = [v for row in returns for v in row]
    mu = mean(flat)
    var = sum((v - mu) ** 2 for v in flat) / (len(flat) - 1)
    verl = [[(v - mu) / math.sqrt(var + 1e-8) for v in row] for row in returns]
    adv = advantages_of(actor_of("reinforce_plus_plus"), old_logp=old, ref_logp=ref)
    for b, row in enumerate(verl):
        torch.testing.assert_close(adv[b, 2:2 + LENGTHS[b]], torch.tensor(row), atol=1e-4, rtol=1e-4)
