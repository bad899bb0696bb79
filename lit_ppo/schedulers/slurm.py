"""``scheduler=slurm``: ``python -m lit_ppo fit <overrides> scheduler=slurm scheduler.nodes=2 ...`` runs
the fit as a Slurm batch job.

The submitting command validates the config exactly as a local fit does before LightningCLI starts
(no model loads), creates the run's directory and writes ``<run dir>/slurm/job.sbatch``; it submits
that with ``sbatch`` and prints the job id, or, with ``scheduler.dry_run=true``, prints the script and
stops (``sbatch`` it yourself). The script's one job step is ``srun python -m lit_ppo fit <the same
overrides>`` with the default ``scheduler=local`` and the trainer sized to the allocation:
``trainer.num_nodes`` = nodes, ``trainer.devices`` = tasks per node (one per GPU; on CPU one per node,
DDP over gloo), ``trainer.strategy=ddp`` for more than one task unless a strategy is chosen.

Inside the job everything is Lightning's and lit_ppo's ordinary machinery, nothing launches processes
but srun:

- Lightning detects its SLURMEnvironment from the SLURM_* variables srun sets (ranks, world size,
  MASTER_ADDR / MASTER_PORT from the node list and job id), so it starts no processes itself; the
  script sets ``trainer.devices`` / ``num_nodes`` from the same settings as ``--ntasks-per-node`` /
  ``--nodes``, so the two agree.
- The run directory is fixed at submission and reaches the job as ``LIT_PPO_JOB_RUN_DIR``: rank 0
  (SLURM_PROCID 0) takes it (lit_ppo.run.tracked_run.start), the other ranks receive it by broadcast at setup
  (TrackedConfig), as under any external launcher.
- Preemption: ``--signal=USR1@90`` has Slurm send SIGUSR1 to every task 90 s before the time limit.
  GracefulStop treats it like SIGTERM: every rank finishes the iteration, last.ckpt is written and the
  tasks exit with 138 (128 + SIGUSR1); the script then asks ``scontrol requeue`` for another start of
  the job (``--requeue``). A script that finds ``<run dir>/checkpoints/last.ckpt`` passes it as
  ``--ckpt_path``: the requeued job continues the run in its directory (and MLflow run), as any resume
  does. Lightning's own auto-requeue handler, which writes an HPC checkpoint from inside the signal
  handler wherever each rank happens to be in the iteration, is replaced by GracefulStop's from the
  start of training: a resume needs the state at an iteration boundary.
- SIGTERM (``scancel``, the time limit itself) stops the run as everywhere: last.ckpt, exit 143, and
  the job is not requeued.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from lit_ppo.config.scheduler import SlurmConfig
from lit_ppo.errors import ConfigError
from lit_ppo.run.loggers import tracking_uris
from lit_ppo.run.run_dir import JOB_LOGS, JOB_RUN_DIR_ENV, new_run_dir
from lit_ppo.utils.flags import flag_value

WARNING_S = 90
"""Seconds before the time limit at which Slurm sends SIGUSR1: time to finish an iteration and save."""
REQUEUE_STATUS = 128 + signal.SIGUSR1
_PLAIN = re.compile(r"[\w@%+=:,./-]+")


def sbatch_quote(text: str) -> str:
    """``text`` as one argument of an ``#SBATCH`` line: sbatch splits the line at spaces, takes '#' for
    a comment and reads backslash escapes, also within quotes (as shlex.quote, plain text stays as it is)."""
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def job_trainer(cfg: SlurmConfig, trainer: dict) -> dict:
    """The trainer settings that size the fit to the allocation (over those of ``trainer``)."""
    settings = {"accelerator": "gpu" if cfg.gpus_per_node else "cpu", "devices": cfg.tasks_per_node,
                "num_nodes": cfg.nodes}
    if cfg.nodes * cfg.tasks_per_node > 1 and trainer.get("strategy", "auto") == "auto":
        settings["strategy"] = "ddp"
    return settings


def _scheduler_override(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return key == "scheduler" or key.startswith("scheduler.")


def gpu_precision(cfg: SlurmConfig, overrides: list[str], trainer: dict) -> str | None:
    """``bf16-mixed`` for a GPU job whose trainer would run in float32 only because the submitting machine,
    which has no GPU, resolved the presets (``trainer.precision`` not given), else None."""
    given = any(o.lstrip("+~").split("=", 1)[0] == "trainer.precision" for o in overrides)
    return "bf16-mixed" if cfg.gpus_per_node and not given and trainer.get("precision") == "32-true" else None


def job_command(cfg: SlurmConfig, overrides: list[str], flags: list[str], trainer: dict) -> list[str]:
    """What each task runs: this fit with the scheduler overrides dropped (so ``scheduler=local``), the
    trainer sized to the allocation and, on GPUs, in bf16-mixed unless a precision was given, with this
    Python."""
    settings = job_trainer(cfg, trainer)
    precision = gpu_precision(cfg, overrides, trainer)
    if precision is not None:
        settings["precision"] = precision
    sized = [f"trainer.{key}={value}" for key, value in settings.items()]
    return [sys.executable, "-m", "lit_ppo", "fit", *[o for o in overrides if not _scheduler_override(o)],
            *sized, *flags]


def script(cfg: SlurmConfig, run_dir: Path, command: list[str], cwd: Path) -> str:
    """The batch script of the job whose run directory is ``run_dir`` (absolute)."""
    logs = run_dir / JOB_LOGS
    sbatch = [f"--job-name={cfg.job_name or run_dir.name}", f"--nodes={cfg.nodes}",
              f"--ntasks-per-node={cfg.tasks_per_node}"]
    if cfg.gpus_per_node:
        sbatch.append(f"--gpus-per-node={cfg.gpus_per_node}")
    sbatch += [f"--cpus-per-task={cfg.cpus_per_task}", f"--time={cfg.time}"]
    sbatch += [f"--{name}={value}" for name, value in (("partition", cfg.partition), ("account", cfg.account))
               if value is not None]
    # append: a requeued start keeps the job id and adds to the same logs
    pattern = str(logs).replace("%", "%%") + "/%j"  # %% is a literal % in sbatch's file name patterns
    sbatch += [f"--output={sbatch_quote(pattern + '.out')}", f"--error={sbatch_quote(pattern + '.err')}",
               "--open-mode=append",
               f"--signal=USR1@{WARNING_S}", "--requeue", *cfg.extra_sbatch]
    last = run_dir / "checkpoints" / "last.ckpt"
    body = f"""
cd {shlex.quote(str(cwd))}
export {JOB_RUN_DIR_ENV}={shlex.quote(str(run_dir))}
# A requeued start continues the run from its last completed iteration (a file, or a directory of
# shards under trainer=fsdp).
last={shlex.quote(str(last))}
resume=()
if [ -e "$last" ]; then resume=(--ckpt_path "$last"); fi
# --kill-on-bad-exit: a task that fails ends the others at once, not at the time limit.
srun --kill-on-bad-exit=1 {shlex.join(command)} "${{resume[@]}}"
status=$?
# {REQUEUE_STATUS} = 128 + SIGUSR1: the time limit is near and last.ckpt is written: start the job again.
if [ "$status" -eq {REQUEUE_STATUS} ]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit "$status"
"""
    return "#!/bin/bash\n" + "".join(f"#SBATCH {line}\n" for line in sbatch) + body


def notes(cfg: SlurmConfig, overrides: list[str], tree: dict) -> list[str]:
    """What the submitter should know about the job it submits: its time limit, a precision chosen for
    its GPUs, a SQLite tracking store shared by the nodes."""
    out = [f"time limit: {cfg.time} (scheduler.time); {WARNING_S} s before it the run saves last.ckpt and "
           f"the job is requeued to continue"]
    trainer = tree.get("trainer") or {}
    if gpu_precision(cfg, overrides, trainer) is not None:
        out.append(f"note: the job trains on {cfg.gpus_per_node} GPUs per node in trainer.precision=bf16-mixed "
                   f"(give trainer.precision=32-true for float32)")
    sqlite = [uri for uri in tracking_uris(tree) if uri.startswith("sqlite:")]
    if cfg.nodes > 1 and sqlite:
        out.append(f"warning: {cfg.nodes} nodes track to {sqlite[0]}, a SQLite file: on a shared filesystem its "
                   f"locks may fail or stall; set MLFLOW_TRACKING_URI to an MLflow server (mlflow server) or a "
                   f"database for multi-node jobs")
    return out


def submit(cfg: SlurmConfig, overrides: list[str], flags: list[str], tree: dict) -> int:
    """Write the job's script into a new run directory and submit it (or print it); the exit code."""
    if flag_value(flags, "--ckpt_path") is not None:
        raise ConfigError("--ckpt_path is not supported with scheduler=slurm: the job resumes its own run "
                          "from last.ckpt; resume an earlier run with scheduler=local")
    sbatch = shutil.which("sbatch")
    if sbatch is None and not cfg.dry_run:
        raise ConfigError("scheduler=slurm: sbatch is not on PATH (submit from a Slurm login node, or write "
                          "the script with scheduler.dry_run=true)")
    run_dir = new_run_dir(tree).absolute()
    path = run_dir / "slurm" / "job.sbatch"
    path.parent.mkdir()
    trainer = tree.get("trainer") or {}
    text = script(cfg, run_dir, job_command(cfg, overrides, flags, trainer), Path.cwd())
    path.write_text(text)
    print(f"run directory: {run_dir}\nbatch script: {path}", file=sys.stderr, flush=True)
    for line in notes(cfg, overrides, tree):
        print(line, file=sys.stderr, flush=True)
    if cfg.dry_run:
        print(text, end="", flush=True)
        return 0
    result = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        reason = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}").splitlines()
        raise ConfigError(f"sbatch refused {path}: {reason[0]}")
    job_id = result.stdout.strip().split(";")[0]
    print(f"submitted Slurm job {job_id}; logs: {run_dir / 'slurm' / job_id}.out, .err", flush=True)
    return 0
