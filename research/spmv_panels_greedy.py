"""Panels whose rounds are packed greedily: the same kernel (spmv_panels), another builder. The
library cuts a panel's column-ordered chunks into rounds at fixed positions and turns every entry
that repeats a row inside its round into a hole (padding) there, the entry itself going to the
atomic tail: the 3.4 % of the uniform matrix's nonzeros in the tail are also 3.4 % of holes in the
stream. Here each panel is walked in column order and an entry whose row is already in the current
round is passed over (to the tail) without taking a slot, so a round holds 2,048 entries and no
holes; chunks still start a new column block on a fresh chunk (chunk_col0).

Why: the uniform matrix sits at 69.2-70.4 % of the copy against the issue's 70 %. Sector-aligned
chunks (spmv_panels_sector.py: +6.3 % stream bytes for fewer x-sector fetches) ran 3.9 % slower
(180.4 -> 187.5 us, logs/spmv-panels-sector-37cf77d): the stream's bytes cost more than the x
sectors bought, so fewer stream bytes should pay.
Prediction, written before the run: the stream from 529 MB (+3.35 % over the nonzeros) to ~513 MB,
the tail about as long as now; 175-179 us against the library layout's ~180 (70.5-72 %).
Measured at fbc741a (logs/spmv-panels-greedy-fbc741a): stream 513.3 MB (+0.25 % padding), tail
67,108 chunks (64,953 before); 176.8 us (71.2 % of the copy) against 180.8 (69.6 %), all seven
interleaved runs apart. The library version (spmv_panels_rounds, a CUDA walk a block a panel, and
the same walk on the host for CPU tensors; CPU tests passed) is commit be19ff5, reverted because
no device time was left to run its GPU tests: `git checkout be19ff5 -- src/tilewise/ops/spmv/spmv.cu
src/tilewise/ops/spmv/api.py tests/test_spmv.py` brings it back; run `pytest -m gpu tests/test_spmv.py` first.
Run on the GPU: PYTHONPATH=src python3 research/spmv_panels_greedy.py
"""
import multiprocessing as mp
import time

import numpy as np
import torch
from spmv_panels_sector import compare, uniform

from tilewise.ops.spmv import formats as fm
from tilewise.ops.spmv.configs import PANEL_COLS, PANEL_ROUND
from tilewise.ops.spmv.formats import Panels


def greedy_panel(args):
    """One panel's entries (rows and column blocks, column order): each entry's slot in the rounds
    part (-1: passed over, to the tail) and the panel's slot count (whole rounds)."""
    rows, blks, n_rows, round_slots = args
    rows_l, blks_l = rows.tolist(), blks.tolist()
    out = [-1] * len(rows_l)
    stamp = [-1] * n_rows
    pos, end, rid, cur = 0, round_slots, 0, -1
    for i, r in enumerate(rows_l):
        b = blks_l[i]
        if b != cur:  # a new column block starts a new chunk
            cur = b
            pos = (pos + 31) & ~31
        while pos >= end:
            end += round_slots
            rid += 1
        if stamp[r] == rid:
            continue
        stamp[r] = rid
        out[i] = pos
        pos += 1
    total = -(-pos // round_slots) * round_slots
    return np.asarray(out, dtype=np.int64), total


def build_greedy(A, rows: int, cluster: int) -> Panels:
    t0 = time.perf_counter()
    M, N = A.shape
    dev = A.device
    P = max(1, -(-M // rows))
    NB = max(1, -(-N // PANEL_COLS))
    lengths = A.row_lengths().long()
    r = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=A.nnz)
    c = A.col.long()
    panel = r // rows
    order = torch.sort(panel * (NB * PANEL_COLS) + c, stable=True)[1]
    panel, c, rl, v = panel[order], c[order], r[order] - panel[order] * rows, A.val[order]
    counts = torch.bincount(panel, minlength=P).cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(counts)])
    rl_h, blk_h = rl.cpu().numpy().astype(np.int32), (c // PANEL_COLS).cpu().numpy().astype(np.int32)
    jobs = [(rl_h[starts[p]:starts[p + 1]], blk_h[starts[p]:starts[p + 1]], rows, 32 * PANEL_ROUND) for p in range(P)]
    with mp.get_context("fork").Pool(min(16, P)) as pool:
        res = pool.map(greedy_panel, jobs)
    local = np.concatenate([q[0] for q in res])
    totals = np.array([q[1] for q in res], dtype=np.int64)
    poff = np.concatenate([[0], np.cumsum(totals)])[:-1]
    panel_h = np.repeat(np.arange(P), counts)
    kept_h = local >= 0
    slot_h = np.where(kept_h, poff[panel_h] + local, -1)
    kept = torch.from_numpy(kept_h).to(dev)
    slot = torch.from_numpy(slot_h[kept_h]).to(dev)
    total = int(totals.sum())
    k = (c[kept] % PANEL_COLS) * 65536 + rl[kept]
    key = torch.full((total,), 0xFFFF, dtype=torch.int32, device=dev)
    key[slot] = torch.where(k >= 2**31, k - 2**32, k).to(torch.int32)
    val = torch.zeros(total, dtype=torch.float32, device=dev)
    val[slot] = v[kept]
    n_chunks = total // 32
    chunk_col0 = torch.zeros(n_chunks, dtype=torch.int64, device=dev)
    chunk_col0[slot // 32] = (c[kept] // PANEL_COLS) * PANEL_COLS
    per_panel = torch.from_numpy(totals // 32).to(dev)
    chunk_panel = torch.repeat_interleave(torch.arange(P, device=dev), per_panel, output_size=n_chunks)
    rounds_part = (key, val, chunk_col0, chunk_panel, per_panel)
    moved = ~kept
    tail = fm._panel_chunks(panel[moved], c[moved], rl[moved], v[moved], P, NB, 1)
    parts = [rounds_part, tail]
    chunk_key = torch.cat([q[3] * 2 + i for i, q in enumerate(parts)])
    corder = torch.sort(chunk_key, stable=True)[1]
    key = torch.cat([q[0].view(-1, 32) for q in parts])[corder].reshape(-1)
    val = torch.cat([q[1].view(-1, 32) for q in parts])[corder].reshape(-1)
    chunk_col0 = torch.cat([q[2] for q in parts])[corder].to(torch.int32)
    per = torch.stack([q[4] for q in parts]).sum(0)
    panel_chunk = torch.zeros(P + 1, dtype=torch.int64, device=dev)
    panel_chunk[1:] = torch.cumsum(per, 0)
    panel_tail = panel_chunk[:-1] + per_panel
    if key.is_cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return Panels(key, val, chunk_col0, panel_chunk.to(torch.int32), panel_tail.to(torch.int32), rows, cluster,
                  A.shape, A.nnz, True, PANEL_ROUND, A.stats, ms)


def main():
    A, rows, cl = uniform()
    compare(A, {"library": Panels.from_csr(A), "greedy": build_greedy(A, rows, cl)}, rounds=7)


if __name__ == "__main__":
    main()
