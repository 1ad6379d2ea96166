"""loss_curve.png, drawn by a child process that ``tilewise train`` starts with the run.

Importing matplotlib and drawing the first figure took 0.69 s on the CPU host after training (0.13 s
for a second figure in the same process): seconds at the end of every short run. The child imports
matplotlib while the run trains and then waits on its stdin; at the end the run sends the losses as
one JSON message and waits only for the drawing. Where the child is gone (it failed to start, or
died), the run draws in its own process as before: the picture never depends on the child.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .._files import write_atomic

_CHILD = "from tilewise.sst2 import plot; plot.child()"
WAIT_S = 60.0  # the drawing itself takes ~0.1 s; this only bounds a stuck child


def draw(step_losses: Sequence[float], history: Sequence[dict], path: Path) -> None:
    """The training loss by step (and a running mean) with each epoch's dev accuracy, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step_losses = list(step_losses)
    fig, ax = plt.subplots(figsize=(7, 4))
    if step_losses:
        ax.plot(range(1, len(step_losses) + 1), step_losses, lw=0.5, alpha=0.4, label="train loss (step)")
        w = max(1, len(step_losses) // 100)
        if w > 1:
            sm = [sum(step_losses[i:i + w]) / w for i in range(0, len(step_losses) - w + 1, w)]
            ax.plot([i + w for i in range(0, len(step_losses) - w + 1, w)], sm, lw=1.5, label=f"mean of {w}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    if history:
        ax2 = ax.twinx()
        steps, acc, total = [], [], 0
        for h in history:
            total += h["steps"]
            steps.append(total)
            acc.append(100 * h["dev_accuracy"])
        ax2.plot(steps, acc, "o-", color="tab:green", label="dev accuracy")
        ax2.set_ylabel("dev accuracy (%)")
        ax2.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title("SST-2 classifier")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getbuffer())


def child() -> None:
    """The child: matplotlib first (the slow part), then one message {"step_losses", "history", "path"}
    from stdin. A closed stdin without a message (the run stopped) ends it quietly. Python's bytecode as
    the ``tilewise`` command keeps it (``_bytecode``), as warmup's children do."""
    from .. import _bytecode

    _bytecode.enable()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401 - imported now, used by draw

    text = sys.stdin.read()
    if not text.strip():
        return
    msg = json.loads(text)
    draw(msg["step_losses"], msg["history"], Path(msg["path"]))


class Plotter:
    """A started child (``start``) that draws one figure (``write``); ``close`` ends it unused."""

    def __init__(self, proc: subprocess.Popen | None):
        self.proc = proc

    @classmethod
    def start(cls) -> "Plotter":
        from .. import settings

        try:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD], env=settings.child_environment(),
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
        except OSError:
            proc = None
        return cls(proc)

    def write(self, step_losses: Sequence[float], history: Sequence[dict], path: Path) -> bool:
        """Draw to ``path``: through the child if it is alive and succeeds, else in this process. True when
        the child drew it."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.communicate(json.dumps({"step_losses": list(step_losses), "history": list(history),
                                             "path": str(path)}), timeout=WAIT_S)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if proc.returncode == 0 and Path(path).is_file():
                return True
        elif proc is not None:
            proc.wait()
        draw(step_losses, history, path)
        return False

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.communicate("", timeout=5)  # an empty message: the child ends without drawing
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
