"""The progress bar on a real terminal (a pseudo-terminal 80 columns wide): each frame fits one line, the
metrics that do not fit are left out in a fixed order, and the run summary follows the bar's last state."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

from tests.integration.conftest import FAST

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_terminal(args: list[str], cwd, columns: int, timeout: float = 300) -> list[str]:
    """The lines a terminal of ``columns`` columns shows for ``python -m lit_ppo <args>`` (stdout only),
    each frame of the bar a line of its own."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "lit_ppo", *args], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=subprocess.DEVNULL, env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # the terminal closed: the process ended
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=timeout) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = ANSI.sub("", out.decode("utf-8", "replace"))
    return [line for line in re.split(r"\r\n|\r|\n", text) if line.strip()]


def test_the_bar_fits_an_80_column_terminal_and_the_summary_follows_it(tmp_path):
    lines = run_on_terminal(["fit", *FAST], tmp_path, columns=80)
    bars = [i for i, line in enumerate(lines) if line.startswith("iteration ")]
    assert bars, lines
    for i in bars:
        assert len(lines[i]) <= 80, lines[i]
    assert re.fullmatch(r"iteration \S+ 2/2 \d:\d\d:\d\d • \d:\d\d:\d\d reward: \S+ s/it: \S+( approx_kl: \S+)?",
                        lines[bars[-1]].rstrip()), lines[bars[-1]]
    assert not any(line.startswith(" " * 20) for line in lines), lines  # no metric wrapped onto a line of its own
    assert lines.index("run summary") > bars[-1]


def test_a_wide_terminal_shows_every_metric(tmp_path):
    lines = run_on_terminal(["fit", *FAST], tmp_path, columns=160)
    last = [line for line in lines if line.startswith("iteration ")][-1]
    assert re.search(r"reward: \S+ approx_kl: \S+ entropy: \S+ length: \S+ s/it: \S+", last), last
