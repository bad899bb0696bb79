"""``sys.exit()`` in user code (a reward function, a filter, a task; argparse or click inside them) named
as the failure it is.

A ``SystemExit`` that leaves a reward function would otherwise end ``python -m lit_ppo fit`` with its
code, 0 for ``sys.exit()``: a sweep or a Slurm job would count the run as a success. The CLI turns it
into a failure (exit code 1) whose one line names the function that exited.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path
from types import TracebackType

_LIBRARIES = tuple(os.path.realpath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib", "purelib",
                                                                                   "platlib"))
# lit_ppo and its callbacks package, which an editable install keeps in another directory.
_OWN = tuple(os.path.realpath(p) + os.sep for p in
             [Path(__file__).parent, *importlib.util.find_spec("lit_ppo.callbacks").submodule_search_locations])


def _frames(tb: TracebackType | None):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def exiting_function(error: BaseException) -> str | None:
    """``module.function (file:line)`` of the innermost frame of ``error``'s traceback that is neither
    lit_ppo's nor the standard library's nor an installed package's (so argparse's or click's exit
    is blamed on the user function that called them); None if every frame is."""
    found = None
    for frame, line in _frames(error.__traceback__):
        path = os.path.realpath(frame.f_code.co_filename)
        if path.startswith(_OWN) or path.startswith(_LIBRARIES) or not os.path.isfile(path):
            continue
        module = frame.f_globals.get("__name__", "?")
        found = f"{module}.{frame.f_code.co_name} ({os.path.basename(path)}:{line})"
    return found


def user_exit_message(error: SystemExit, where: str) -> str:
    """One line for a ``SystemExit`` raised by user code ``where`` (e.g. "during iteration 3")."""
    code = error.code
    call = "sys.exit()" if code is None else f"sys.exit({code!r})"
    who = exiting_function(error) or "user code"
    return f"{who} called {call} {where}: exiting from user code fails the run"
