"""SST-2 accuracy sweep of the classifier (issue 8: dev >= 82 % with GloVe, or the sweep that says
this architecture cannot). One process, one device call: the data are read once, every run is
``tilewise.sst2.train`` (so the best setting is reproduced by ``tilewise train`` with the printed
options), on the fastest path there is (``--graph``: the whole step in a CUDA graph).

Stages (each run: GloVe 50-d init, batch 64, seed 0, EPOCHS (10) epochs; the best
epoch is chosen ON DEV, and dev is also what is reported: GLUE hides SST-2's test labels, so the
numbers are optimistic by the selection; the final epoch's accuracy is reported beside it):

    1  the current defaults (constant lr 1e-3, dropout 0.3, weight decay 0.01), then
       lr {1e-3, 2e-3, 5e-3} x dropout {0.2, 0.5}, cosine decay to 0 over the run;
    2  one change at a time around stage 1's best: weight decay {0, 1e-4, 0.1}, embedding lr
       x5 / x10 / x0.2, the embedding frozen for the first epoch, embedding dropout {0.2, 0.4},
       H {512, 1024}, linear decay, min_count 2 (a smaller vocabulary: rarer words become <unk>);
    3  the stage-2 changes that helped (>= +0.2 points), all together;
    4  the best setting again with seeds 1 and 2 (how much of a difference is seed noise), and with
       --backend tilewise from seed 0 (the issue wants it within 1 point of torch's).

A time budget (``--budget-s``, 200 s after imports, of which ``--tilewise-reserve-s`` 75 s is kept
for the tilewise re-run) stops the sweep before it would overrun; runs that did not fit are listed.

    PYTHONPATH=src python research/sst2_sweep.py --data-dir .data/sst2 --out $OUT/sweep.json

Writes the JSON table (setting -> best dev accuracy, its epoch, final accuracy, seconds, the
`tilewise train` command) after every run, and prints it as a table at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from tilewise import sst2  # noqa: E402
from tilewise.sst2.commands import train_args  # noqa: E402

# The TrainConfig fields a setting may change (each has a short name in a run's name).
_SHORT = {"lr": "lr", "embedding_lr": "elr", "weight_decay": "wd", "hidden": "H", "dropout": "do",
          "embed_dropout": "edo", "lr_schedule": "", "freeze_embeddings_epochs": "freeze",
          "min_count": "minc", "embedding_init": "", "epochs": "ep", "batch_size": "bs", "seed": "seed",
          "backend": "", "word_dropout": "wdo", "ema": "ema"}


def command(data_dir: str, setting: dict, graph: bool) -> str:
    # --graph / --no-graph always: the CLI's default is graphs on a GPU
    return shlex.join(["tilewise", "train", *train_args({"data_dir": data_dir, **setting, "graph": graph})])


def name_of(setting: dict) -> str:
    return " ".join(f"{_SHORT[k]}{v}" for k, v in setting.items() if k != "batch_size")


class Sweep:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.graph = args.graph
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="sst2_sweep_"))
        self.longest = 0.0

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def run(self, stage: str, setting: dict, *, budget_factor: float = 1.0, reserve: float = 0.0) -> dict | None:
        """Train one setting (unless it ran already, or would not fit in the budget less
        ``reserve`` seconds kept for later runs); record and return its row."""
        s = {"epochs": self.args.epochs, "batch_size": 64, "seed": 0, "backend": "torch",
             "embedding_init": self.args.embedding_init, **setting}
        name = name_of(s)
        for r in self.rows:
            if r["setting"] == s:
                return r
        est = self.longest * budget_factor
        if self.left() - reserve < est:
            self.skipped.append(f"{stage}: {name} (about {est:.0f} s needed, {self.left() - reserve:.0f} s left)")
            print(f"[sweep] skip {name}: budget", flush=True)
            return None
        cfg = sst2.TrainConfig(data_dir=self.args.data_dir, glove_cache=self.args.glove_cache, graph=self.graph,
                             device="cuda" if torch.cuda.is_available() else "cpu", progress=False, plot=False,
                             output_dir=str(self.work / f"run{len(self.rows)}"), max_steps=self.args.max_steps,
                             **s)
        t = time.perf_counter()
        try:
            m = sst2.train(cfg)
        except Exception as e:
            if cfg.graph and s["backend"] == "tilewise":
                print(f"[sweep] {name}: --graph failed ({type(e).__name__}: {e}); this run again eager", flush=True)
                traceback.print_exc()
                self.graph = False
                try:
                    return self.run(stage, setting, budget_factor=budget_factor, reserve=reserve)
                finally:
                    self.graph = True
            if self.graph and s["backend"] == "torch":
                # Keep the sweep alive: say why, and go on without graphs (slower, same numbers).
                print(f"[sweep] {name}: --graph failed ({type(e).__name__}: {e}); eager from now on", flush=True)
                traceback.print_exc()
                self.graph = False
                return self.run(stage, setting, budget_factor=budget_factor, reserve=reserve)
            print(f"[sweep] {name}: failed: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            row = {"stage": stage, "name": name, "setting": s, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            self.rows.append(row)
            self.save()
            return None
        secs = time.perf_counter() - t
        if s["backend"] == "torch":
            self.longest = max(self.longest, secs)
        ep = m["epochs"]
        row = {"stage": stage, "name": name, "setting": s,
               "best_dev_accuracy": m["best_dev_accuracy"], "best_epoch": m["best_epoch"],
               "final_dev_accuracy": m["final_dev_accuracy"],
               "dev_accuracy_per_epoch": [e["dev_accuracy"] for e in ep],
               "train_loss_per_epoch": [round(e["train_loss"], 4) for e in ep],
               "examples_per_second": ep[-1]["examples_per_second"] if ep else None,
               "seconds": round(secs, 1), "graph": cfg.graph,
               "ops": m.get("ops", {}), "command": command(self.args.data_dir, s, cfg.graph)}
        self.rows.append(row)
        print(f"[sweep] {stage:>2} {100 * row['best_dev_accuracy']:.2f}% at epoch {row['best_epoch']} "
              f"(final {100 * row['final_dev_accuracy']:.2f}%) {secs:5.1f} s  {name}", flush=True)
        self.save()
        return row

    def best(self, rows=None) -> dict:
        ok = [r for r in (rows if rows is not None else self.rows)
              if "best_dev_accuracy" in r and r["setting"]["backend"] == "torch" and r["setting"]["seed"] == 0]
        return max(ok, key=lambda r: r["best_dev_accuracy"])

    def save(self):
        out = {"note": "best epoch chosen on dev, and dev accuracy reported (GLUE's SST-2 test labels are "
                       "hidden); final_dev_accuracy is the last epoch's, without selection",
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "elapsed_s": round(time.perf_counter() - self.t0, 1),
               "runs": self.rows, "skipped": self.skipped}
        if any("best_dev_accuracy" in r for r in self.rows):
            b = self.best()
            out["best"] = {"name": b["name"], "best_dev_accuracy": b["best_dev_accuracy"],
                           "best_epoch": b["best_epoch"], "command": b["command"]}
        p = Path(self.args.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, p)


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def run_grid(sw: "Sweep", grid: dict, seeds: list[int], args) -> None:
    """Every combination of ``grid`` for every seed (torch backend), ranked by the mean over seeds
    of the final epoch's dev accuracy; the best combination again on the tilewise backend."""
    keys = list(grid)
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))]
    table = []
    for combo in combos:
        rows = [sw.run("G", {**combo, "seed": seed, "backend": "torch"}) for seed in seeds]
        rows = [r for r in rows if r is not None and "final_dev_accuracy" in r]
        if len(rows) == len(seeds):
            table.append((combo, _mean([r["final_dev_accuracy"] for r in rows]),
                          _mean([r["best_dev_accuracy"] for r in rows]), [r["final_dev_accuracy"] for r in rows]))
    table.sort(key=lambda t: -t[1])
    print(f"\n[grid] {len(table)} of {len(combos)} settings ran on all seeds {seeds}; ranked by the mean final "
          f"dev accuracy (no epoch chosen on dev); 'best-epoch' = mean of each run's best epoch (chosen on dev)")
    print(f"{'final %':>8} {'best-epoch %':>12}  {'per seed (final)':24s} setting")
    for combo, fin, best, per in table:
        print(f"{100 * fin:8.2f} {100 * best:12.2f}  {' '.join(f'{100 * a:.2f}' for a in per):24s} {name_of(combo)}")
    if table and torch.cuda.is_available() and not args.no_tilewise:
        combo = table[0][0]
        tw = [sw.run("G", {**combo, "seed": seed, "backend": "tilewise"}, budget_factor=2.0) for seed in seeds]
        tw = [r for r in tw if r is not None and "final_dev_accuracy" in r]
        if tw:
            print(f"[grid] best setting on the tilewise backend: mean final {100 * _mean([r['final_dev_accuracy'] for r in tw]):.2f}% "
                  f"(torch {100 * table[0][1]:.2f}%), per seed "
                  + " ".join(f"{100 * r['final_dev_accuracy']:.2f}" for r in tw) + f"; {tw[0]['command']}")
    out = Path(args.out).with_name(Path(args.out).stem + "-grid.json")
    out.write_text(json.dumps([{"setting": c, "mean_final": f, "mean_best_epoch": b, "final_per_seed": p}
                               for c, f, b, p in table], indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=".data/sst2")
    ap.add_argument("--glove-cache", default=None,
                    help="GloVe extract (.npz); default: DATA_DIR/../glove50_sst2.npz when it exists")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sst2_sweep.json"))
    ap.add_argument("--work-dir", default=None, help="where the runs' checkpoints go (default: a temp dir)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--embedding-init", choices=("glove", "random"), default="glove")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="start no run that would end past this many seconds (after imports)")
    ap.add_argument("--tilewise-reserve-s", type=float, default=75.0,
                    help="seconds of the budget kept for the tilewise re-run (Triton autotuning, maybe eager)")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="eager steps (slower)")
    ap.add_argument("--no-tilewise", action="store_true", help="skip the tilewise re-run of the best setting")
    ap.add_argument("--max-steps", type=int, default=None, help="steps per epoch (smoke tests)")
    ap.add_argument("--stages", default="1234", help="which stages to run (e.g. 12)")
    ap.add_argument("--confirm", default=None,
                    help="a JSON setting (TrainConfig fields, e.g. '{\"hidden\": 1024, \"lr\": 0.005}') to run "
                         "instead of the stages: seeds 0, 1, 2 on the torch and the tilewise backends")
    ap.add_argument("--grid", default=None,
                    help="a JSON object of lists (TrainConfig fields, e.g. '{\"hidden\": [512, 1024], \"epochs\": [1, 2]}'): "
                         "every combination on the torch backend for each of --seeds, ranked by the mean over "
                         "seeds of the LAST epoch's dev accuracy (no epoch chosen on dev); then the best "
                         "combination on the tilewise backend for the same seeds")
    ap.add_argument("--seeds", default="0,1,2", help="seeds of --grid (comma separated)")
    args = ap.parse_args(argv)
    if args.glove_cache is None:
        g = Path(args.data_dir).resolve().parent / "glove50_sst2.npz"
        args.glove_cache = str(g) if g.is_file() else None
    if not torch.cuda.is_available():
        args.graph = False
        print("[sweep] no GPU: eager on the CPU (slow; for smoke tests)", flush=True)
    sw = Sweep(args)
    # Time kept back from the torch runs for the tilewise re-run of the best setting.
    keep = args.tilewise_reserve_s if ("4" in args.stages and not args.no_tilewise
                                       and torch.cuda.is_available()) else 0.0

    # Confirmation of one setting (e.g. the CPU sweep's best, logs/sst2-sweep-cpu.json): seed noise
    # and the tilewise backend against torch from the same seeds.
    if args.confirm:
        setting = json.loads(args.confirm)
        if not isinstance(setting, dict) or set(setting) - set(_SHORT):
            raise SystemExit(f"--confirm: a JSON object of {sorted(_SHORT)}, got {args.confirm!r}")
        for backend in ("torch", "tilewise"):
            if backend == "tilewise" and (args.no_tilewise or not torch.cuda.is_available()):
                continue
            for seed in (0, 1, 2):
                sw.run("C", {**setting, "seed": seed, "backend": backend},
                       budget_factor=2.0 if backend == "tilewise" else 1.0)
        args.stages = ""

    if args.grid:
        grid = json.loads(args.grid)
        if not isinstance(grid, dict) or set(grid) - set(_SHORT) or not all(isinstance(v, list) for v in grid.values()):
            raise SystemExit(f"--grid: a JSON object of lists over {sorted(_SHORT)}, got {args.grid!r}")
        run_grid(sw, grid, [int(v) for v in args.seeds.split(",")], args)
        sw.save()
        for s_ in sw.skipped:
            print(f"  skipped (budget): {s_}")
        return 0

    # Stage 1: the defaults, then lr x dropout under cosine decay.
    if "1" in args.stages:
        sw.run("1", {"lr": 1e-3, "dropout": 0.3, "weight_decay": 0.01, "lr_schedule": "constant"}, reserve=keep)
        for lr in (1e-3, 2e-3, 5e-3):
            for do in (0.2, 0.5):
                sw.run("1", {"lr": lr, "dropout": do, "weight_decay": 0.01, "lr_schedule": "cosine"}, reserve=keep)
    base = dict(sw.best()["setting"]) if sw.rows else {"lr": 2e-3, "dropout": 0.5, "weight_decay": 0.01,
                                                      "lr_schedule": "cosine"}
    base = {k: v for k, v in base.items() if k not in ("epochs", "batch_size", "seed", "backend", "embedding_init")}
    base_acc = sw.best()["best_dev_accuracy"] if sw.rows else 0.0

    # Stage 2: one change at a time around the best of stage 1.
    changes = [{"weight_decay": 0.0}, {"weight_decay": 1e-4}, {"weight_decay": 0.1},
               {"embedding_lr": 5 * base["lr"]}, {"embedding_lr": 10 * base["lr"]},
               {"embedding_lr": 0.2 * base["lr"]}, {"freeze_embeddings_epochs": 1},
               {"embed_dropout": 0.2}, {"embed_dropout": 0.4}, {"hidden": 512}, {"hidden": 1024},
               {"lr_schedule": "linear"}, {"min_count": 2}]
    helped: list[tuple[dict, float]] = []
    if "2" in args.stages:
        for ch in changes:
            r = sw.run("2", {**base, **ch}, reserve=keep)
            if r is not None and r["best_dev_accuracy"] >= base_acc + 0.002:
                helped.append((ch, r["best_dev_accuracy"]))

    # Stage 3: the changes that helped, together; of several weight decays or embedding lrs that
    # helped, the best one.
    if "3" in args.stages and len(helped) > 1:
        combo = dict(base)
        for key in ("weight_decay", "embedding_lr"):
            group = [(c, a) for c, a in helped if key in c]
            if group:
                combo.update(max(group, key=lambda ca: ca[1])[0])
        for c, _ in helped:
            if not {"weight_decay", "embedding_lr"} & set(c):
                combo.update(c)
        sw.run("3", combo, reserve=keep)

    # Stage 4: seed noise, and the tilewise backend from the same seed.
    if "4" in args.stages and sw.rows:
        best = {k: v for k, v in sw.best()["setting"].items()
                if k not in ("epochs", "batch_size", "backend", "embedding_init")}
        for seed in (1, 2):
            sw.run("4", {**best, "seed": seed}, reserve=keep)
        if keep:
            # The tilewise step autotunes its Triton GEMMs on its first shapes: allow it 2x a torch run.
            sw.run("4", {**best, "seed": 0, "backend": "tilewise"}, budget_factor=2.0)
        b = sw.best()
        print("[sweep] the best setting on the tilewise backend, from the same seed: "
              + b["command"].replace("--backend torch", "--backend tilewise"), flush=True)

    sw.save()
    print(f"\n[sweep] {len(sw.rows)} runs in {time.perf_counter() - sw.t0:.0f} s; best epoch chosen on dev")
    print(f"{'stage':>5} {'best dev %':>10} {'epoch':>5} {'final %':>7} {'s':>6}  setting")
    for r in sw.rows:
        if "best_dev_accuracy" in r:
            print(f"{r['stage']:>5} {100 * r['best_dev_accuracy']:10.2f} {r['best_epoch']:5d} "
                  f"{100 * r['final_dev_accuracy']:7.2f} {r['seconds']:6.1f}  {r['name']}")
        else:
            print(f"{r['stage']:>5} {'failed':>10}  {r['name']}: {r['error']}")
    for s in sw.skipped:
        print(f"  skipped (budget): {s}")
    if sw.rows and any("best_dev_accuracy" in r for r in sw.rows):
        b = sw.best()
        print(f"best: {100 * b['best_dev_accuracy']:.2f}% at epoch {b['best_epoch']}: {b['command']}")
    print(f"table: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
