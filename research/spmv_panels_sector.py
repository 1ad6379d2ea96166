"""Panels with sector-aligned chunks: the same kernel (spmv_panels), a different builder. A chunk of
32 entries never splits the entries of one 32-byte x sector (8 columns) with the next chunk: where a
sector's entries would straddle a chunk boundary they start the next chunk, and the rest of the
chunk is padding (key 0xFFFF: no gather). Neighbouring chunks are gathered by different warps at
about the same time, so today a sector at a chunk edge is fetched twice.

Why: the uniform matrix (2M x 2M, 32 random columns a row) sits at 69.2-70.4 % of the copy against
the issue's 70 %. ncu (research/notes/spmv.md, fourth pass) counted 21M x sectors from L2 against
~16.5M for one fetch a panel, beside 16M of the key / value stream; L2 at 68.5 % of peak, DRAM 54 %.
Prediction, written before the run: ~2 padding entries a chunk (+5-7 % stream bytes), x sectors
-15-20 %; the uniform matrix between 3 % slower (if DRAM-bound) and 8 % faster (if L2-bound): 168-186
us against the library layout's ~180.
Measured at 37cf77d (logs/spmv-panels-sector-37cf77d): 187.5 us against the library layout's
180.4, +6.3 % stream bytes (+9.7 % padding against +3.35 %): slower, as the prediction's DRAM-bound
end said.
Run on the GPU: PYTHONPATH=src python3 research/spmv_panels_sector.py
"""
import numpy as np
import torch
from triton.testing import do_bench

from tilewise.bench.suites import spmv as suite
from tilewise.ops.spmv import api as op
from tilewise.ops.spmv import formats as fm
from tilewise.ops.spmv.configs import PANEL_COLS
from tilewise.ops.spmv.formats import Panels, device_panel_shape

SECTOR = 8  # fp32 columns a 32-byte sector


def aligned_slots(seg: torch.Tensor, c: torch.Tensor, n_seg: int):
    """Entries sorted by (segment, column): each entry's slot inside its segment and the segment's
    chunk count, next-fit by sector groups (a group that would cross a 32-slot boundary starts the
    next chunk). Vectorized over segments, one step a group (numpy on the host)."""
    seg_h, sec_h = seg.cpu().numpy(), (c // SECTOR).cpu().numpy()
    n = seg_h.size
    new = np.ones(n, dtype=bool)
    new[1:] = (seg_h[1:] != seg_h[:-1]) | (sec_h[1:] != sec_h[:-1])
    gid = np.cumsum(new) - 1                      # group of each entry
    gstart = np.flatnonzero(new)                  # first entry of each group
    gsize = np.diff(np.append(gstart, n))
    gseg = seg_h[gstart]
    # each group's index inside its segment
    seg_first_group = np.searchsorted(gseg, np.arange(n_seg))
    gidx = np.arange(gstart.size) - seg_first_group[gseg]
    width = int(gidx.max()) + 1 if gstart.size else 1
    sizes = np.zeros((n_seg, width), dtype=np.int64)
    sizes[gseg, gidx] = gsize
    pos = np.zeros(n_seg, dtype=np.int64)
    starts = np.zeros((n_seg, width), dtype=np.int64)
    for j in range(width):
        g = sizes[:, j]
        pad = (g > 0) & (g <= 32) & ((pos % 32) + g > 32)
        pos = np.where(pad, (pos + 31) // 32 * 32, pos)
        starts[:, j] = pos
        pos = pos + g
    chunks = (pos + 31) // 32
    slot = starts[gseg[gid], gidx[gid]] + (np.arange(n) - gstart[gid])
    dev = seg.device
    return torch.from_numpy(slot).to(dev), torch.from_numpy(chunks).to(dev)


def panel_chunks_aligned(panel, c, rl, v, P: int, NB: int, round_chunks: int):
    """fm._panel_chunks with sector-aligned chunks (same returns)."""
    dev = panel.device
    seg = panel * NB + c // PANEL_COLS
    local, seg_chunks = aligned_slots(seg, c, P * NB)
    seg_chunks = seg_chunks.view(P, NB).clone()
    if round_chunks > 1:
        seg_chunks[:, -1] += (-seg_chunks.sum(1)) % round_chunks
    per_panel = seg_chunks.sum(1)
    seg_chunks = seg_chunks.view(-1)
    slots = seg_chunks * 32
    pstart = torch.cumsum(slots, 0) - slots
    slot = pstart[seg] + local
    total = int(slots.sum())
    k = (c % PANEL_COLS) * 65536 + rl
    key = torch.full((total,), 0xFFFF, dtype=torch.int32, device=dev)
    key[slot] = torch.where(k >= 2**31, k - 2**32, k).to(torch.int32)
    val = torch.zeros(total, dtype=torch.float32, device=dev)
    val[slot] = v
    seg_of_chunk = torch.repeat_interleave(torch.arange(P * NB, device=dev), seg_chunks, output_size=total // 32)
    return key, val, (seg_of_chunk % NB) * PANEL_COLS, seg_of_chunk // NB, per_panel, slot


def build(A, aligned: bool) -> Panels:
    """Panels.from_csr's build (rounds of PANEL_ROUND chunks, default panel shape), with the rounds
    part laid out by ``panel_chunks_aligned`` when ``aligned``."""
    orig = fm._panel_chunks
    if aligned:
        fm._panel_chunks = lambda panel, c, rl, v, P, NB, rc: (panel_chunks_aligned if rc > 1 else orig)(
            panel, c, rl, v, P, NB, rc)
    try:
        return Panels.from_csr(A)
    finally:
        fm._panel_chunks = orig


def compare(A, layouts: dict, rounds: int = 5):
    """Each Panels layout of A checked twice against float64 on a NaN-poisoned y, then timed beside
    cuSPARSE in ``rounds`` interleaved rounds of a short do_bench each (L2 flushed between calls);
    one line a layout (stream bytes, padding, tail, build time) and one a timing."""
    M, N = A.shape
    floor = op.cost(M, N, A.nnz).bytes
    x = torch.randn(N, device="cuda")
    ref = torch.sparse_csr_tensor(A.row_ptr, A.col, A.val.double(), (M, N)) @ x.double()
    for name, F in layouts.items():
        tail = int((F.panel_chunk[1:] - F.panel_tail).sum())
        print(f"{name}: {F.key.numel() // 32} chunks, stream {F.key.numel() * 8 / 1e6:.1f} MB "
              f"({F.key.numel() / A.nnz - 1:+.2%} padding), tail {tail} chunks, build {F.build_ms:.0f} ms", flush=True)
        for _ in range(2):
            y = torch.full((M,), float("nan"), device="cuda")
            op.spmv(F, x, y)
            err = ((y.double() - ref).norm() / ref.norm()).item()
            assert y.isfinite().all() and err < 1e-5, (name, err)
    Ac = torch.sparse_csr_tensor(A.row_ptr, A.col, A.val, (M, N))
    fns = {"cusparse": lambda: Ac @ x}
    ys = {k: torch.empty(M, device="cuda") for k in layouts}
    for k, F in layouts.items():
        fns[k] = lambda F=F, y=ys[k]: op.spmv(F, x, y)
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(do_bench(fn, warmup=5, rep=40, return_mode="median"))
    base = float(np.median(times["cusparse"]))
    for k, t in times.items():
        ms = float(np.median(t))
        print(f"{k:9s} {ms * 1e3:7.1f} us  {floor / ms / 1e6:7.0f} GB/s  {floor / ms / 1e6 / 4260:.1%} of 4.26 TB/s  "
              f"{base / ms:.2f}x cusparse  (runs {' '.join(f'{v * 1e3:.1f}' for v in t)})", flush=True)


def uniform():
    """The bench suite's uniform matrix and its default panel shape (rows, cluster), printed."""
    print(torch.cuda.get_device_name(), flush=True)
    A = suite.make_matrix("uniform")
    M, N = A.shape
    rows, cl = device_panel_shape(M)
    print(f"uniform {M} x {N}, nnz {A.nnz}, panels of {rows} rows x {cl} CTAs; floor "
          f"{op.cost(M, N, A.nnz).bytes / 1e6:.1f} MB", flush=True)
    return A, rows, cl


def main():
    A, _, _ = uniform()
    compare(A, {"library": build(A, False), "aligned": build(A, True)})


if __name__ == "__main__":
    main()
