"""What the console shows besides the run itself: nothing.

Dependencies print lines that are not about this run: a deprecation inside Lightning's own pytree
helper, advertisements for a cloud logger and model registry, transformers' weight-loading bar (garbled in a log
file, and the run prints its own progress), and vLLM's ``<Layer>: Failed to load weights`` for
layers without trainable weights (the rotary embedding's cache) on every weight push, which reads
like a failure. The engine checks every push itself (VLLMEngine.update_weights names any parameter
a push misses), so these lines carry no information here. vLLM's own start-up report (some thirty
lines of configuration, memory and kernel notes) is left out too: its errors still show
(``VLLM_LOGGING_LEVEL``, ERROR unless set), on stderr (``VLLM_LOGGING_STREAM``): stdout carries only
the run's own lines.
"""

from __future__ import annotations

import logging
import os
import warnings

_NOISE = {
    "lightning.pytorch.utilities.rank_zero": ("litlogger", "litmodels"),
    "vllm.model_executor.model_loader.reload.layerwise": ("Failed to load weights",),
    # A prompt longer than the tokenizer's model_max_length: RolloutDataModule.setup measures every prompt
    # against the model's context itself and refuses, in one line, what does not fit.
    "transformers.tokenization_utils_base": ("Token indices sequence length is longer",),
}
"""Logger name -> message fragments dropped from it."""


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def quiet_dependencies() -> None:
    """Drop the dependency lines above (idempotent). Loads none of them: the checks before a run stay quick."""
    import sys

    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # transformers takes this setting when it is imported
    if "transformers.utils.logging" in sys.modules:  # imported already: it holds the setting of its own
        sys.modules["transformers.utils.logging"].disable_progress_bar()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is first imported, after this
    # stdout is the run's own (progress, scores, the summary): what vLLM logs goes to stderr with the rest.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    for name, fragments in _NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(fragments))


# Lightning notes about choices LitPPO makes on purpose: checkpoints hold the weights after the
# iteration's update (what resuming needs), and the step pulls its own batch (dataloader_iter) so
# that nothing is generated ahead of the weight push; sys.argv holds the command beside LightningCLI's
# args on purpose (a DDP launcher re-runs it).
EXPECTED_WARNINGS = ("Using ModelCheckpoint with manual optimization", "You are using the `dataloader_iter` step",
                     "Found `dataloader_iter` argument", "Found .* module\\(s\\) in eval mode",
                     "LightningCLI's args parameter is intended",
                     "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
                     # A resume continues the run's own checkpoints directory (checkpoint.keep goes on there);
                     # a branch keeps its checkpoints in its new run directory, deleting none of the old run's.
                     "Checkpoint directory .* exists and is not empty", "The dirpath has changed from",
                     # eval/* are sums that on_validation_epoch_end all-reduces itself.
                     "It is recommended to use `self.log\\('eval/")


def quiet_expected_output() -> None:
    """Silence what a run would print that says nothing to its user: the expected Lightning warnings and
    the dependencies' logs."""
    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    quiet_dependencies()
