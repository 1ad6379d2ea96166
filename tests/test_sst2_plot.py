"""loss_curve.png through the plotting child (sst2/plot.py), and its fallbacks."""

import math

import pytest

from tilewise.sst2 import plot

PNG = b"\x89PNG\r\n\x1a\n"
LOSSES = [0.7 - 0.002 * i + 0.01 * math.sin(i) for i in range(250)]
HISTORY = [{"steps": 125, "dev_accuracy": 0.61}, {"steps": 125, "dev_accuracy": 0.7}]


def _is_png(path):
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 1000


def test_the_child_draws_the_figure(tmp_path):
    p = plot.Plotter.start()
    assert p.proc is not None
    assert p.write(LOSSES, HISTORY, tmp_path / "loss_curve.png") is True
    assert _is_png(tmp_path / "loss_curve.png")
    assert p.proc is None  # used once; close() is then a no-op
    p.close()


def test_a_dead_child_falls_back_to_drawing_here(tmp_path):
    p = plot.Plotter.start()
    p.proc.kill()
    p.proc.wait()
    assert p.write(LOSSES, HISTORY, tmp_path / "loss_curve.png") is False
    assert _is_png(tmp_path / "loss_curve.png")


def test_a_child_that_fails_leaves_the_drawing_to_this_process(tmp_path):
    """The child exits non-zero (here: a path it cannot write to, a directory), so the run draws itself
    and raises the same error the child met: nothing is silently missing."""
    target = tmp_path / "a_dir"
    target.mkdir()
    p = plot.Plotter.start()
    with pytest.raises(OSError):
        p.write(LOSSES, HISTORY, target)
    assert p.proc is None


def test_close_ends_an_unused_child():
    p = plot.Plotter.start()
    proc = p.proc
    p.close()
    assert proc.returncode == 0 and p.proc is None


def test_no_child_draws_in_process(tmp_path):
    assert plot.Plotter(None).write(LOSSES, [], tmp_path / "x.png") is False
    assert _is_png(tmp_path / "x.png")
