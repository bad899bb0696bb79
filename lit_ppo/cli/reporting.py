"""How a command that runs a job ends (``fit``, ``validate``, ``test``, ``sft``): every outcome one line and an
exit code, 0 when it did its whole job, 2 for bad input, 1 for a failure, 128 + the signal number when a
signal stopped it. torch, Lightning and the models load only inside these functions, once a command's
overrides compose."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lit_ppo.cli.args import print_error
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.presets import EVALUATING


def reported(subcommand: str, command: Callable[[], int]) -> int:
    """``command()``, which returns the exit code of ``subcommand``, with every way it ends as one line and an
    exit code."""
    from lit_ppo.launch.explain import explain_parser_error
    from lit_ppo.launch.run import RunFailed, choose_thread_waits
    from lit_ppo.run.processes import RUN_DIR_ENV
    from lit_ppo.utils.quiet import quiet_expected_output
    from lit_ppo.utils.stop_requests import Stopped, exit_code, signal_name

    choose_thread_waits()
    quiet_expected_output()
    try:
        return command()
    except ConfigError as e:
        print_error(str(e))
        return 2
    except Stopped as e:
        from lit_ppo.run.tracked_run import end_started_runs  # Lightning: loaded by then, once a run started

        end_started_runs("KILLED")
        where = getattr(e, "where", None) or ("during " + subcommand if subcommand in EVALUATING else
                                             "before the first iteration")
        what = (": no scores" if subcommand in EVALUATING else
                ": nothing was trained" if where == "before the first iteration" else "")
        print_error(f"stopped by {signal_name(e.signum)} {where}{what}")
        return exit_code(e.signum)
    except RunFailed as e:  # the iteration's failure, said whole; last.ckpt holds the iteration
        print_error(str(e))
        return 1
    except RunStopped as e:
        if not str(e):  # another process of the run has said why
            return 1
        log = _keep_traceback(e, os.environ.get(RUN_DIR_ENV))
        print_error(f"{e}" + (f" (traceback in {log})" if log else ""))
        return 1
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError"):
            print_error(explain_parser_error(e))
            return 2
        # Anything else failed the run: one line, the traceback kept in the run directory (or, without
        # one, shown, since it is all there is to go on).
        log = _keep_traceback(e, os.environ.get(RUN_DIR_ENV))
        if log is None:
            traceback.print_exception(e)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print_error(f"{type(e).__name__}: {reason}" + (f" (traceback in {log})" if log else ""))
        return 1


def launched(argv: list[str], verb: Callable[[], Any]) -> int:
    """``verb()``, a job of ``lit_ppo.launch.run`` run here as the command ``argv`` (the command line after
    ``python -m lit_ppo``); the exit code: 0, or 128 + the signal that stopped it."""
    from lit_ppo.launch.run import fail_if_pending
    from lit_ppo.utils.stop_requests import exit_code, received_signal

    # A DDP launcher starts the other ranks by re-running sys.argv: make it this very command.
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        verb()
    except SystemExit:  # Lightning exits after a stop signal that abandoned an iteration
        if received_signal() is None:
            raise  # the parser's own exit (--print_config, --help)
        fail_if_pending()
    finally:
        sys.argv = saved_argv
    signum = received_signal()
    return 0 if signum is None else exit_code(signum)


def _keep_traceback(error: BaseException, run_dir: str | None) -> Path | None:
    """Append the traceback of a stopped run to its run directory's ``error.log``; that file."""
    if run_dir and Path(run_dir).is_dir():
        try:
            with open(Path(run_dir) / "error.log", "a", encoding="utf-8") as log:
                log.write("".join(traceback.format_exception(error)))
        except OSError:  # the disk that failed the run may refuse the log too: the traceback goes to stderr
            return None
        return Path(run_dir) / "error.log"
    return None
