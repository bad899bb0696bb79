"""The ``trainer`` section: Lightning's ``Trainer`` arguments, known without importing Lightning, so that a
misspelt one is refused with the other values before Lightning loads (seconds)."""

from __future__ import annotations

TRAINER_KEYS = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run",
    "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches", "limit_val_batches",
    "limit_test_batches", "limit_predict_batches", "overfit_batches", "val_check_interval", "check_val_every_n_epoch",
    "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing", "enable_progress_bar", "enable_model_summary",
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "deterministic", "benchmark",
    "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly", "barebones", "plugins",
    "sync_batchnorm", "reload_dataloaders_every_n_epochs", "default_root_dir", "enable_autolog_hparams",
    "model_registry",
)
"""The arguments of ``lightning.Trainer`` in its signature's order (held equal to the installed Lightning's by a
test)."""
