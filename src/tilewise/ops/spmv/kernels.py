"""The kernels of ``spmv.cu``: which instantiations the module loads, their parameter lists, and
the handles the formats' builders and the launchers in ``api`` call."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...runtime import cuda as rt
from .configs import JDS_CONFIGS, MERGE_CONFIGS, PANEL_CONFIGS, PANEL_DEFAULT, PANEL_MAX_ROWS, PANEL_ROUND, \
    PANEL_ROUNDS, SUBS

_SRC = Path(__file__).with_name("spmv.cu")
THREADS = 256  # block size of every kernel but jds, merge and panels (which take theirs from the config)


@functools.cache
def _module(device_index: int) -> rt.Module:
    names = ["spmv_csr_scalar", "spmv_ell", "spmv_csr_chunks", "spmv_csr_stream", "spmv_csr_merge_fixup",
             "spmv_panels_rounds"]
    names += [f"spmv_jds<{nt},{r}>" for nt, r in JDS_CONFIGS]
    names += [f"spmv_panels<{nt},{cl},{u},{rc}>" for nt, cl, u in PANEL_CONFIGS for rc in PANEL_ROUNDS]
    names += [f"spmv_csr_vector<{s}>" for s in SUBS] + [f"spmv_csr_merge<{nt},{ipt}>" for nt, ipt in MERGE_CONFIGS]
    return rt.load(_SRC, names, device_index=device_index)


_I32, _F32 = (torch.int32,), (torch.float32,)
_PARAMS = {
    "spmv_csr_scalar": ("row_ptr:i", "col:i", "val:f", "x:f", "y:f", "M", "alpha", "beta"),
    "spmv_csr_vector": ("row_ptr:i", "col:i", "val:f", "x:f", "y:f", "M", "alpha", "beta", "long_len"),
    "spmv_csr_chunks": ("row_ptr:i", "col:i", "val:f", "x:f", "y:f", "chunk_row:i", "chunk_start:i",
                        "n_chunks", "alpha"),
    "spmv_csr_stream": ("row_ptr:i", "col:i", "val:f", "x:f", "y:f", "block_row:i", "alpha", "beta"),
    "spmv_csr_merge": ("row_ptr:i", "col:i", "val:f", "x:f", "y:f", "plan_row:i", "plan_nz:i", "carry:f",
                       "alpha", "beta"),
    "spmv_csr_merge_fixup": ("carry:f", "seg_row:i", "seg_b0:i", "seg_b1:i", "y:f", "n_seg", "alpha"),
    "spmv_ell": ("col:i", "val:f", "x:f", "y:f", "M", "K", "alpha", "beta"),
    "spmv_panels": ("key:i", "val:f", "chunk_col0:i", "panel_chunk:i", "panel_tail:i", "x:f", "y:f", "M", "R",
                    "alpha", "beta"),
    "spmv_jds": ("perm:i", "len_sorted:i", "jd_ptr:i", "col:i", "val:f", "x:f", "y:f", "M", "alpha", "beta"),
    "spmv_panels_rounds": ("row:i", "blk:i", "start:l", "slot:l", "total:l", "rows", "round_slots"),
}
_kernels: dict[tuple, rt.Kernel] = {}


def kernel(name: str, device_index: int) -> rt.Kernel:
    """The kernel ``name`` (an instantiation the module loads) on that device, built once."""
    k = _kernels.get((name, device_index))
    if k is None:
        params = []
        for p in _PARAMS[name.split("<")[0]]:
            if p.endswith(":i"):
                params.append(rt.Tensor(p[:-2], _I32))
            elif p.endswith(":l"):
                params.append(rt.Tensor(p[:-2], (torch.int64,)))
            elif p.endswith(":f"):
                params.append(rt.Tensor(p[:-2], _F32))
            elif p in ("alpha", "beta"):
                params.append(rt.Scalar(p, "f32"))
            else:
                params.append(rt.Scalar(p, "i32"))
        k = _kernels[(name, device_index)] = _module(device_index).kernel(name, params)
    return k


def panel_kernel(name: str, device_index: int) -> rt.Kernel:
    """A panels kernel, allowed the shared memory of the largest panel (once per kernel)."""
    first = (name, device_index) not in _kernels
    k = kernel(name, device_index)
    if first:
        k.set_max_dynamic_shared(PANEL_MAX_ROWS * 4)
    return k


def blocks(threads: int) -> int:
    """Blocks of THREADS that cover ``threads`` threads (at least one)."""
    return max(1, -(-threads // THREADS))


@functools.cache
def clusters_fit(device_index: int, cl: int) -> int:
    """Clusters of the default panels kernel for ``cl`` that are resident at once with the most
    shared memory a panel can take (sm_count // cl where the occupancy API cannot answer)."""
    nt, c, u = PANEL_DEFAULT[cl]
    k = panel_kernel(f"spmv_panels<{nt},{c},{u},{PANEL_ROUND}>", device_index)
    try:
        return k.max_active_clusters(cl, nt, PANEL_MAX_ROWS * 4)
    except Exception:
        return rt.sm_count(device_index) // cl
