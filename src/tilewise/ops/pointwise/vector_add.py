"""vector_add: ``out = a + b`` elementwise over contiguous tensors of the same shape.

Versions (``vector_add.cu``):
    v1_naive:      the lecture's kernel, one thread per element, ceil(n / 256) blocks of 256.
                   bound: copy bandwidth, with 4-byte (fp32) or 2-byte accesses per thread.
    v2_vectorized: 16-byte loads/stores (4 fp32 or 8 fp16/bf16 per access), a grid-stride loop
                   over the blocks that are resident at once (one full wave), 2 independent
                   16-byte loads per operand in flight per thread.
                   bound: copy bandwidth (3 x n x itemsize bytes, no arithmetic to speak of).
    v3_blocked:    v2 without the grid-stride loop: each block owns one contiguous chunk of
                   256 x 8 vectors, so the blocks in flight touch one window of memory.
                   bound: copy bandwidth. On the H200 the grid-stride loop costs ~5 % against
                   this and the ld.cs/st.cs streaming hints another ~6 % (docs/tuning/pointwise.md,
                   "vector_add: one chunk per block, plain loads").

fp16 and bf16 add in fp32 and round once, so results equal ``torch.add`` bit for bit.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from .._checks import check_kernel_inputs, into_out, runs_reference
from .layout import DTYPES

_SRC = Path(__file__).with_name("vector_add.cu")
_THREADS = 256


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PyTorch: reads a and b once, writes out once (3 x n x itemsize bytes)."""
    return torch.add(a, b)


def cost(n: int, dtype: torch.dtype = torch.float32) -> Cost:
    itemsize = dtype.itemsize
    return Cost(flops=n, bytes=3 * n * itemsize)


@functools.cache
def _module(device_index: int) -> rt.Module:
    names = [f"vector_add_{v}<{rt.ctype(d)}>" for v in ("v1_naive", "v2_vectorized", "v3_blocked")
             for d in DTYPES]
    return rt.load(_SRC, names, device_index=device_index)


_kernels: dict[tuple, rt.Kernel] = {}


def _kernel(version: str, dtype: torch.dtype, device_index: int) -> rt.Kernel:
    k = _kernels.get((version, dtype, device_index))
    if k is None:
        p = (rt.Tensor("a", (dtype,)), rt.Tensor("b", (dtype,)), rt.Tensor("out", (dtype,)),
             rt.Scalar("n", "i64"))
        k = _module(device_index).kernel(f"vector_add_{version}<{rt.ctype(dtype)}>", p)
        _kernels[(version, dtype, device_index)] = k
    return k


def _check(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, cpu: bool = False) -> torch.Tensor:
    """What the kernel's own parameter checks cannot see: shapes, and a's device and dtype (which
    pick the kernel). b's and out's device, dtype and contiguity are checked by the kernel call."""
    check_kernel_inputs("vector_add", {"a": a, "b": b}, cpu=cpu)
    if b.dtype != a.dtype:  # (the kernel's own check would name only 'b')
        raise ValueError(f"vector_add: 'b' has dtype {b.dtype} but 'a' has {a.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"vector_add: 'a' has shape {tuple(a.shape)} but 'b' has {tuple(b.shape)}")
    if out is None:
        return torch.empty_like(a, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor) or out.shape != a.shape:
        raise ValueError(f"vector_add: out must be a tensor of shape {tuple(a.shape)}")
    return out



def _run_v1(a, b, out):
    n = a.numel()
    k = _kernel("v1_naive", a.dtype, a.get_device())
    if n:
        k((n + _THREADS - 1) // _THREADS, _THREADS, a, b, out, n)
    return out


_grid_v2: dict[tuple, int] = {}


def _run_v2(a, b, out):
    n = a.numel()
    k = _kernel("v2_vectorized", a.dtype, a.get_device())
    if n:
        key = (a.dtype, a.get_device())
        wave = _grid_v2.get(key)
        if wave is None:
            # Only as many blocks as are resident at once (registers allow 6 of 8 per SM here):
            # a grid-stride loop over more leaves a second, partial wave that finishes late.
            wave = _grid_v2[key] = k.resident_grid(_THREADS)
        per_vec = 16 // a.element_size()
        k(max(1, min(wave, -(-(n // per_vec) // _THREADS))), _THREADS, a, b, out, n)
    return out

def _run_v3(a, b, out):
    n = a.numel()
    k = _kernel("v3_blocked", a.dtype, a.get_device())
    if n:
        per_block = _THREADS * 8 * (16 // a.element_size())
        k(max(1, -(-n // per_block)), _THREADS, a, b, out, n)
    return out


def v1_naive(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _run_v1(a, b, _check(a, b, out))


def _check_vec16(name: str, a, b, out) -> torch.Tensor:
    out = _check(a, b, out)
    if not rt.aligned16(a, b, out):
        raise ValueError(f"vector_add.{name}: a, b and out must start on 16-byte boundaries "
                         "(a view with an offset does not); use v1_naive or vector_add()")
    return out


def v2_vectorized(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _run_v2(a, b, _check_vec16("v2_vectorized", a, b, out))


def v3_blocked(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _run_v3(a, b, _check_vec16("v3_blocked", a, b, out))


VARIANTS = {"v1_naive": v1_naive, "v2_vectorized": v2_vectorized, "v3_blocked": v3_blocked}


def vector_add(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
               variant: str | None = None) -> torch.Tensor:
    """``a + b`` on the GPU.

    a, b:    CUDA tensors of one shape (any), contiguous, float32 / float16 / bfloat16; CPU tensors
             run the PyTorch reference (any variant).
    out:     optional contiguous tensor of that shape and dtype to write into.
    variant: ``None`` (the fastest that applies: v3_blocked when all three pointers are
             16-byte aligned, else v1_naive), or a key of ``VARIANTS``.
    Returns ``out`` (a new tensor when not given), same shape and dtype as ``a``.
    """
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"vector_add: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    if runs_reference("vector_add", {"a": a, "b": b, "out": out}):
        _check(a, b, out, cpu=True)
        return into_out("vector_add", reference(a, b), out)
    if variant is not None:
        return VARIANTS[variant](a, b, out)
    out = _check(a, b, out)
    return _run_v3(a, b, out) if rt.aligned16(a, b, out) else _run_v1(a, b, out)
