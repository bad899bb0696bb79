"""``python -m lit_ppo export --ckpt_path CKPT --output DIR [--adapter ADAPTER_DIR] [--overwrite]``: a
checkpoint's policy as a Hugging Face model directory (``lit_ppo.run.export``)."""

from __future__ import annotations

from lit_ppo.cli.args import ArgParser, asks_for_help, print_error
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.utils.quiet import quiet_dependencies

USAGE = "python -m lit_ppo export --ckpt_path CKPT [--output DIR] [--adapter ADAPTER_DIR] [--overwrite]"
"""Its own usage, which ``--help`` and a mistake show (``python -m lit_ppo --help`` shows the common form)."""


def parser() -> ArgParser:
    """``export``'s flags, each described."""
    out = ArgParser(USAGE, description="A checkpoint's policy as a Hugging Face model directory that transformers "
                    "and vLLM load\n(LoRA adapters merged), and / or its LoRA adapter in peft's format.")
    out.add_argument("--ckpt_path", required=True, metavar="CKPT",
                     help="the checkpoint: a run's checkpoints/last.ckpt or a periodic one (a file, or the directory "
                          "of a distributed checkpoint); verified as a resume verifies it")
    out.add_argument("--output", metavar="DIR",
                     help="the model directory to write (config, generation config, model.safetensors, tokenizer "
                          "with the chat template used in training)")
    out.add_argument("--adapter", metavar="ADAPTER_DIR",
                     help="also (or only) write the LoRA adapter of a model.lora_rank > 0 checkpoint, loadable with "
                          "PeftModel.from_pretrained(base, ADAPTER_DIR)")
    out.add_argument("--overwrite", action="store_true",
                     help="replace an existing directory (exchanged with the new one in one step once that is written "
                          "whole; without the flag an existing non-empty directory is refused)")
    return out


def main(argv: list[str]) -> int:
    """``export``; ``argv``: the command line after ``python -m lit_ppo``, ``export`` first. Returns the
    exit code (2 for bad input, 1 for a failed write, each with a one-line message)."""
    args = argv[1:]
    if asks_for_help(args):
        print(parser().format_help())
        return 0
    try:
        options = parser().parse_args(args)
        quiet_dependencies()  # the error line, if any, is all that stderr shows
        from lit_ppo.run.export import export  # torch and transformers: once the arguments parse

        paths = export(options.ckpt_path, options.output, options.overwrite, options.adapter)
    except ConfigError as e:
        print_error(str(e))
        return 2
    except RunStopped as e:
        print_error(str(e))
        return 1
    print(f"exported {options.ckpt_path} to {' and '.join(map(str, paths))}")
    return 0
