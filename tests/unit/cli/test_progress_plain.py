"""Progress of command-line loops in a pipe or log file (not a terminal): plain lines, not a bar that
draws nothing until it ends."""

from __future__ import annotations

from tandem.cli import progress


def test_steps_in_a_pipe_are_plain_lines_with_the_metric(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)
    with progress.step_progress("sft", 3, key="sft/loss") as on_step:
        for step in (1, 2, 3):
            on_step(step, {"sft/loss": 1.0 / step})
    out = capsys.readouterr().out
    assert "sft 1/3" in out and "sft 3/3" in out and "loss 0.3333" in out and "━" not in out


def test_counts_in_a_pipe_are_plain_lines(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 3600.0)  # only the first and the final line
    now = iter(range(10, 1000))  # a machine booted 10 s ago: its monotonic clock is near 0
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(now)))
    with progress.count_progress("eval") as on_progress:
        for done in range(1, 11):
            on_progress(done, 10)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("eval 1/10") and lines[-1].startswith("eval 10/10") and len(lines) == 2


def _terminal_run(fail: bool, moved: bool = False) -> str:
    import io

    import pytest
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80)
    if fail:
        with pytest.raises(FileNotFoundError), progress.count_progress("eval", console) as on_progress:
            if moved:
                on_progress(1, 2)
            raise FileNotFoundError("no such run")
    else:
        with progress.count_progress("eval", console) as on_progress:
            on_progress(1, 1)
    return buf.getvalue()


def test_a_failed_count_in_a_terminal_erases_its_bar():
    erase = "\x1b[1A\x1b[2K"  # cursor up one line, clear it: the error then prints where the bar was
    assert _terminal_run(fail=True).endswith(erase)
    assert erase not in _terminal_run(fail=False)  # a finished bar stays on screen
    assert erase not in _terminal_run(fail=True, moved=True)  # so does one that shows how far it got
