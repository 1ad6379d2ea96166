"""matmul: ``C = A @ B`` in fp32 on the CUDA cores (no tensor cores), the SGEMM progression.

A is (M, K) or (BA, M, K), B is (K, N) or (BB, K, N); a batch of 1 (or a 2-D operand) broadcasts
over the other's batch. Every kernel reads A and B through their strides, so transposed views
(``x.t()``, ``x.transpose(-1, -2)``) and expanded batches run without a copy. Any M, N, K.

Versions (``matmul.cu``); F = 2 M N K, the floor is F / fp32 peak (cuBLAS: 51 TFLOP/s on H200):
    v1_naive:      one thread per output, threadIdx.x along M: uncoalesced A reads and C writes.
                   bound: memory transactions (each FMA fetches 2 elements, mostly from L1/L2).
    v2_coalesced:  v1 with threadIdx.x along N: B reads and C writes coalesced, A broadcast.
                   bound: L1/L2 bandwidth (2 loads per FMA).
    v3_smem:       32 x 32 tiles of A and B staged in shared memory: each input element read from
                   global once per tile; bound: shared-memory bandwidth (2 smem loads per FMA).
    v4_blocktile:  128 x 128 block tile, 8 x 8 outputs per thread in registers: 16 smem loads feed
                   64 FMAs; bound: issue of FMAs and smem loads (bank conflicts on the A tile).
    v5_vectorized: v4 with 16-byte global loads/stores and the A tile transposed in smem (float4
                   smem reads of A too); bound: FMA issue with latency exposed at the barriers.
    v6_warptile:   128 x 128 x 16, warp tiles of 64 x 32 with conflict-free smem reads, double-
                   buffered (next tile fetched into registers during the compute), 2 blocks/SM.
                   bound: fp32 FMA throughput.

16-byte paths (v5, v6) are used only where the unit-stride dimension and the pointers allow them
(checked per call); otherwise the same kernels load element by element through the strides.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...cost import Cost
from ...runtime import cuda as rt
from .._checks import runs_reference
from .._memory import check_no_overlap

_SRC = Path(__file__).with_name("sgemm.cu")
_VERSIONS = ("v1_naive", "v2_coalesced", "v3_smem", "v4_blocktile", "v5_vectorized", "v6_warptile")
_MAX_GRID_Z = 65535
_MAX_GRID_Y = 65535


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PyTorch in float64 then cast back: reads A and B once, writes C once (with cuBLAS's tiling,
    each input is in fact re-read from L2 once per tile of the other operand)."""
    return torch.matmul(a.double(), b.double()).to(a.dtype)


def cost(M: int, N: int, K: int, batch: int = 1, dtype: torch.dtype = torch.float32,
         batch_a: int | None = None, batch_b: int | None = None) -> Cost:
    """2 M N K FLOPs per batch; bytes: each operand once (a broadcast operand once in all), C once."""
    itemsize = dtype.itemsize
    ba = batch if batch_a is None else batch_a
    bb = batch if batch_b is None else batch_b
    return Cost(flops=2 * batch * M * N * K, bytes=itemsize * (ba * M * K + bb * K * N + batch * M * N))


@functools.cache
def _module(device_index: int) -> rt.Module:
    return rt.load(_SRC, [f"matmul_{v}" for v in _VERSIONS], device_index=device_index)


_kernels: dict[tuple, rt.Kernel] = {}


def _kernel(version: str, device_index: int) -> rt.Kernel:
    k = _kernels.get((version, device_index))
    if k is None:
        f32 = (torch.float32,)
        p = [rt.Tensor("a", f32, contiguous=False), rt.Tensor("b", f32, contiguous=False),
             rt.Tensor("out", f32, contiguous=False),
             rt.Scalar("M", "i32"), rt.Scalar("N", "i32"), rt.Scalar("K", "i32")]
        p += [rt.Scalar(n, "i64") for n in ("sAb", "sAm", "sAk", "sBb", "sBk", "sBn", "sCb", "ldc")]
        if version in ("v5_vectorized", "v6_warptile"):
            p += [rt.Scalar(n, "i32") for n in ("vecA", "vecB", "vecC")]
        k = _module(device_index).kernel(f"matmul_{version}", p)
        _kernels[(version, device_index)] = k
    return k


def _as3d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0) if t.dim() == 2 else t


def _check(a, b, out, cpu=False):
    """Shapes, dtypes, devices, the output. Returns (a3, b3, out3, result): 3-D views and what to return."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"matmul: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            raise ValueError(f"matmul: '{name}' must be 2-D (rows, cols) or 3-D (batch, rows, cols), "
                             f"got shape {tuple(t.shape)}")
    a3, b3 = _as3d(a), _as3d(b)
    if a3.shape[2] != b3.shape[1]:
        raise ValueError(f"matmul: inner dimensions differ: 'a' is {tuple(a.shape)} (K={a3.shape[2]}), "
                         f"'b' is {tuple(b.shape)} (K={b3.shape[1]})")
    ba, bb = a3.shape[0], b3.shape[0]
    if ba != bb and ba != 1 and bb != 1:
        raise ValueError(f"matmul: batch sizes {ba} (a) and {bb} (b) cannot broadcast (one must be 1 or equal)")
    batch = max(ba, bb)
    for name, t in (("a", a), ("b", b)):
        if not t.is_cuda and not (cpu and t.device.type == "cpu"):
            raise ValueError(f"matmul: '{name}' is on {t.device}; tilewise kernels need CUDA tensors "
                             f"(use tilewise.matmul for CPU tensors)")
        if t.dtype != torch.float32:
            raise ValueError(f"matmul: '{name}' has dtype {t.dtype}; the CUDA C matmul takes float32 "
                             f"(use tilewise.gemm for float16 / bfloat16 / fp8 on tensor cores)")
    if a.device != b.device:
        raise ValueError(f"matmul: 'a' is on {a.device} but 'b' is on {b.device}")
    M, N = a3.shape[1], b3.shape[2]
    for name, v in (("M", M), ("N", N), ("K", a3.shape[2])):
        if v >= 2**31:
            raise ValueError(f"matmul: {name} = {v} does not fit in 32 bits")
    shape = (M, N) if a.dim() == 2 and b.dim() == 2 else (batch, M, N)
    if out is None:
        out = torch.empty(shape, device=a.device, dtype=torch.float32)
    else:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
            raise ValueError(f"matmul: out must be a tensor of shape {shape}")
        if out.dtype != torch.float32 or out.device != a.device:
            raise ValueError(f"matmul: out must be float32 on {a.device}, got {out.dtype} on {out.device}")
        if not out.is_contiguous():
            raise ValueError("matmul: out must be contiguous")
        check_no_overlap("matmul", "out", out, a=a, b=b)
    return a3, b3, _as3d(out), out


def _launch(version: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    a3, b3, c3, result = _check(a, b, out)
    batch, M, N = c3.shape
    K = a3.shape[2]
    if batch == 0 or M == 0 or N == 0:
        return result
    sAb = a3.stride(0) if a3.shape[0] > 1 else 0
    sBb = b3.stride(0) if b3.shape[0] > 1 else 0
    sAm, sAk = a3.stride(1), a3.stride(2)
    sBk, sBn = b3.stride(1), b3.stride(2)
    sCb, ldc = M * N, N
    k = _kernel(version, a.get_device())
    extra: tuple = ()
    if version in ("v1_naive", "v2_coalesced"):
        block = (32, 32)
        gx, gy = (-(-M // 32), -(-N // 32)) if version == "v1_naive" else (-(-N // 32), -(-M // 32))
    elif version == "v3_smem":
        block, (gx, gy) = (32, 32), (-(-N // 32), -(-M // 32))
    else:
        block, (gx, gy) = 256, (-(-N // 128), -(-M // 128))
        if version in ("v5_vectorized", "v6_warptile"):
            vec_a = sAk == 1 and sAm % 4 == 0 and sAb % 4 == 0 and a3.data_ptr() % 16 == 0
            vec_b = sBn == 1 and sBk % 4 == 0 and sBb % 4 == 0 and b3.data_ptr() % 16 == 0
            vec_c = ldc % 4 == 0 and c3.data_ptr() % 16 == 0
            extra = (int(vec_a), int(vec_b), int(vec_c))
    if gy > _MAX_GRID_Y:
        raise ValueError(f"matmul.{version}: the output is too large for this version's grid "
                         f"({gy} > {_MAX_GRID_Y} blocks along y); use v3_smem or later")
    # The batch runs on grid.z (at most 65535): larger batches go in chunks.
    for z0 in range(0, batch, _MAX_GRID_Z):
        nz = min(_MAX_GRID_Z, batch - z0)
        az = a3[z0:z0 + nz] if sAb else a3
        bz = b3[z0:z0 + nz] if sBb else b3
        k((gx, gy, nz), block, az, bz, c3[z0:z0 + nz], M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, sCb, ldc,
          *extra)
    return result


def _make(version: str):
    def fn(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _launch(version, a, b, out)

    fn.__name__ = version
    fn.__doc__ = f"matmul version {version}; see matmul() for shapes."
    return fn


VARIANTS = {v: _make(v) for v in _VERSIONS}
v1_naive, v2_coalesced, v3_smem, v4_blocktile, v5_vectorized, v6_warptile = (VARIANTS[v] for v in _VERSIONS)
FASTEST = "v6_warptile"


def matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
           variant: str | None = None) -> torch.Tensor:
    """``a @ b`` in float32 on the CUDA cores (TF32 never used).

    a:       CUDA float32, (M, K) or (BA, M, K); any strides (transposed views need no copy). CPU
             tensors run the PyTorch reference (float64 inside; any variant).
    b:       CUDA float32, (K, N) or (BB, K, N); any strides. BA and BB are equal, or one is 1
             (that operand is shared by the whole batch); a 2-D operand is shared likewise.
    out:     optional contiguous float32 tensor of the result's shape to write into.
    variant: ``None`` (the fastest, v6_warptile) or a key of ``VARIANTS``.
    Returns (M, N) when both are 2-D, else (max(BA, BB), M, N); float32, contiguous.
    """
    if variant is None:
        variant = FASTEST
    if variant not in VARIANTS:
        raise ValueError(f"matmul: unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    if runs_reference("matmul", {"a": a, "b": b, "out": out}):
        *_, result = _check(a, b, out, cpu=True)
        return result.copy_(reference(a, b).reshape(result.shape))
    return VARIANTS[variant](a, b, out)
