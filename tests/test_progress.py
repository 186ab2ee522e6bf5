"""Tests for ``tf_transformer.train.progress``: the tqdm bar, its postfix and log lines."""

import io
import re

from tf_transformer.train.progress import Progress


def last_frame(output):
    """The bar as last drawn: tqdm redraws the line after a carriage return."""
    return output.replace("\n", "\r").rstrip("\r").split("\r")[-1]


def test_bar_shows_steps_eta_and_the_latest_values():
    bar, log = io.StringIO(), io.StringIO()
    with Progress(total_steps=10, file=bar, log_file=log) as progress:
        progress.update(2, loss=3.0, lr=1e-2, tokens_per_sec=100)
        progress.update(3, loss=1.23456, lr=2.5e-4, tokens_per_sec=2500)
        assert progress.n == 5
    frame = last_frame(bar.getvalue())
    assert " 5/10 " in frame
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", frame), frame  # elapsed<remaining: tqdm's ETA
    assert "loss=1.2346" in frame and "lr=0.00025" in frame and "tok/s=2.50k" in frame
    assert "loss=3.0000" not in frame
    assert bar.getvalue().endswith("\n")  # closed: the bar is left on its own line
    assert log.getvalue() == ""


def test_values_left_out_are_not_shown():
    bar = io.StringIO()
    with Progress(total_steps=4, file=bar, log_file=io.StringIO()) as progress:
        progress.update(1)
        progress.update(1, loss=0.5)
    frame = last_frame(bar.getvalue())
    assert "loss=0.5000" in frame and "lr=" not in frame and "tok/s" not in frame


def test_resumed_run_starts_at_initial_step():
    bar = io.StringIO()
    with Progress(total_steps=100, initial_step=40, file=bar, log_file=io.StringIO()) as progress:
        assert progress.n == 40
        progress.update(10)
    assert " 50/100 " in last_frame(bar.getvalue())


def test_write_prints_whole_lines_apart_from_the_bar(capsys):
    bar, log = io.StringIO(), io.StringIO()
    with Progress(total_steps=3, file=bar, log_file=log) as progress:
        progress.update(1, loss=2.0)
        progress.write("epoch 1: loss 2.0")
        progress.update(1, loss=1.0)
        progress.write("epoch 2: loss 1.0")
    assert log.getvalue() == "epoch 1: loss 2.0\nepoch 2: loss 1.0\n"
    assert "epoch" not in bar.getvalue()
    # By default the lines go to standard output and the bar to standard error.
    with Progress(total_steps=2) as progress:
        progress.update(1)
        progress.write("a log line")
    out, err = capsys.readouterr()
    assert out == "a log line\n"
    assert " 1/2 " in err


def test_disabled_bar_draws_nothing_but_still_logs():
    bar, log = io.StringIO(), io.StringIO()
    with Progress(total_steps=5, disable=True, file=bar, log_file=log) as progress:
        progress.update(2, loss=1.0, lr=1e-3, tokens_per_sec=10.0)
        progress.write("still logged")
        assert progress.n == 2
    assert bar.getvalue() == ""
    assert log.getvalue() == "still logged\n"


def test_a_budgeted_run_has_no_eta_until_its_plan_sets_the_total():
    bar = io.StringIO()
    with Progress(total_steps=None, file=bar, log_file=io.StringIO()) as progress:
        progress.update(40)
        assert "<" not in last_frame(bar.getvalue())  # no total: steps and rate, no ETA
        progress.set_total(400)
        progress.update(10)
    frame = last_frame(bar.getvalue())  # closing draws the last state
    assert " 50/400 " in frame and re.search(r"\[\d\d:\d\d<\d\d:\d\d", frame), frame
