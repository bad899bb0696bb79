"""The progress bar on a real terminal (a pseudo-terminal 80 columns wide): each frame fits one line, the
metrics that do not fit are left out in a fixed order, the evaluations count their problems, and the run summary
follows the bar's last state. Elsewhere (stdout not a terminal) the evaluations' plain lines."""

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
    lines = run_on_terminal(["fit", *FAST, "eval.batch_size=2"], tmp_path, columns=80)
    bars = [i for i, line in enumerate(lines) if line.startswith("iteration ")]
    assert bars, lines
    for i in bars:
        assert len(lines[i]) <= 80, lines[i]
    assert re.fullmatch(r"iteration \S+ 2/2 \d:\d\d:\d\d • \d:\d\d:\d\d reward: \S+ s/it: \S+( approx_kl: \S+)?",
                        lines[bars[-1]].rstrip()), lines[bars[-1]]
    assert not any(line.startswith(" " * 20) for line in lines), lines  # no metric wrapped onto a line of its own
    # Each evaluation's bar counts its 4 problems, 2 at a time, with the time left.
    evaluations = [line.rstrip() for line in lines if re.match(r"eval +\S+ \d/4 ", line)]
    assert all(len(line) <= 80 for line in evaluations), evaluations
    assert any(re.fullmatch(r"eval +\S+ 2/4 \d:\d\d:\d\d • \d:\d\d:\d\d", line) for line in evaluations), evaluations
    assert re.fullmatch(r"eval +\S+ 4/4 \d:\d\d:\d\d • 0:00:00", evaluations[-1]), evaluations
    assert lines.index("run summary") > bars[-1]


def test_a_wide_terminal_shows_every_metric(tmp_path):
    lines = run_on_terminal(["fit", *FAST], tmp_path, columns=160)
    last = [line for line in lines if line.startswith("iteration ")][-1]
    assert re.search(r"reward: \S+ approx_kl: \S+ entropy: \S+ length: \S+ s/it: \S+", last), last


def progress_lines(stdout: str) -> list[tuple[int, int, str | None]]:
    """``(done, of, eta)`` of each plain line of an evaluation's progress in ``stdout``, in order."""
    return [(int(done), int(of), eta) for done, of, eta in
            re.findall(r"^eval (\d+)/(\d+) problems(?: eta (\d:\d\d:\d\d))?$", stdout, re.M)]


def test_validate_counts_its_problems_a_line_per_tenth_with_an_eta(cli_here):
    # 40 problems in 20 batches of 2: a line at the start and at each tenth, not one per batch.
    result = cli_here("validate", "algo=grpo", "eval.max_problems=40", "eval.batch_size=2", "eval.k=0")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress_lines(result.stdout)
    assert [(done, of) for done, of, _ in lines] == [(n, 40) for n in range(0, 41, 4)], result.stdout
    assert not lines[0][2] and all(eta for _, _, eta in lines[1:])  # an eta once there is a pace
    assert lines[-1][2] == "0:00:00"
    assert result.stdout.index("eval 40/40 problems") < result.stdout.index("eval/accuracy")  # then the scores


def test_the_evaluations_of_a_fit_count_their_problems(cli_here):
    result = cli_here("fit", *FAST, "eval.batch_size=2")  # 4 problems: before training and after iteration 2
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress_lines(result.stdout)
    assert [(done, of) for done, of, _ in lines] == [(0, 4), (2, 4), (4, 4)] * 2, result.stdout
    assert all(eta for _, _, eta in lines[1::3] + lines[2::3])
    out = result.stdout
    assert out.index("eval 4/4 problems") < out.index("eval at iteration 0:") < out.index("iteration 1/2 ")
    assert out.index("iteration 2/2 ") < out.rindex("eval 0/4 problems") < out.index("eval at iteration 2:")
