"""The command line's two kinds of arguments: Hydra ``key=value`` overrides and ``--flag [value]`` pairs."""

from __future__ import annotations

import re

from lit_ppo.errors import ConfigError

_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}[A-Za-z_][\w-]*(\.[\w-]+)*(@[\w.]+)?$")
_VALUELESS_FLAGS = ("--print_config", "-h", "--help")
"""Flags that take no separate value (``--print_config=skip_null`` carries its own)."""


def split_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """``(overrides, flags)``: Hydra ``key=value`` overrides and LightningCLI ``--flag [value]`` pairs.

    A bare word that is neither is a mistake, most often the tail of an unquoted value with spaces.
    """
    overrides: list[str] = []
    flags: list[str] = []
    takes_value = False
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            flags.append(arg)
            takes_value = "=" not in arg and arg not in _VALUELESS_FLAGS
        elif takes_value:  # the value of the flag before it, e.g. --ckpt_path .../epoch=0-step=2.ckpt
            flags.append(arg)
            takes_value = False
        elif "=" not in arg:
            before = args[i - 1] if i else ""
            hint = (f" (it follows {before!r}: quote a value that has spaces, e.g. 'data.system_prompt=You are a "
                    f"tutor')") if "=" in before else ""
            raise ConfigError(f"{arg!r} is neither key=value nor a --flag{hint}")
        elif not _OVERRIDE_KEY.match(arg.split("=", 1)[0]):
            raise ConfigError(f"override {arg!r} is malformed: expected key=value with a dotted key, "
                              f"e.g. actor.eps_clip=0.2")
        else:
            overrides.append(arg)
    return overrides, flags


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in ``flags`` (the last one given), or None."""
    value = None
    for i, flag in enumerate(flags):
        if flag == name:
            if i + 1 >= len(flags) or flags[i + 1].startswith("-"):
                raise ConfigError(f"{name} needs a value")
            value = flags[i + 1]
        elif flag.startswith(name + "="):
            value = flag.split("=", 1)[1]
    return value
