"""A warp-specialized persistent GEMM for Hopper in Gluon, against cuBLAS and gemm(): the structure
cuBLAS and CUTLASS use on sm_90 ("cooperative" schedule), which Triton 3.6 cannot express.

One loader warp issues the TMA loads of A (BM x BK) and B (BK x BN) tiles into a ring of STAGES
shared-memory stages, tile after tile of a persistent grouped order; two consumer warpgroups each
take 64 rows of the BM = 128 row tile, run async wgmma over the K steps (one group in flight,
releasing the previous stage when it completes) and store their half of C by TMA from shared
memory while the loader already fills the next tile's stages. No TMA multicast (not in Triton
3.6's Gluon), so the L2-to-SM bytes of a tile stay those of gemm()'s 128 x 256 tile; what changes
is that loads, products and the epilogue of different tiles overlap without the software
pipeliner's per-iteration barriers.

Status: written and compiled for sm_90 on the CPU (HGMMA, setmaxnreg, no spills; run with
--compile), not yet run on a GPU. Prediction before its first run: 4096^3 / 8192^3 at 0.95-1.05x
cuBLAS (gemm() 0.96-1.10x), 3072^3 0.85-0.95x (gemm() 0.78-0.86x graph-replayed), 1536^3 no better
than gemm()'s 0.72x (L2-bound, see research/notes/matmul.md).
Run on the GPU: PYTHONPATH=src python3 research/gemm_gluon_ws.py
"""

import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m, pid_n


@gluon.jit
def _loader(a_desc, b_desc, c_desc, a_smem, b_smem, c_smem, ready, empty, M, N, K,
            GROUP_M: gl.constexpr, STAGES: gl.constexpr, which: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        for kk in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [pid_m * BM, kk * BK], ready.index(s), a_smem.index(s))
            _tma_load(b_desc, [kk * BK, pid_n * BN], ready.index(s), b_smem.index(s))
            it += 1


@gluon.jit
def _consumer(a_desc, b_desc, c_desc, a_smem, b_smem, c_smem, ready, empty, M, N, K,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, which: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    my_c = c_smem.index(which)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros([64, BN], gl.float32, layout=layout)
        for kk in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            a = a_smem.index(s).slice(which * 64, 64, dim=0)
            acc = warpgroup_mma(a, b_smem.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # The previous K step's product is done: its stage can be refilled.
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=kk > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=k_tiles > 0)
        tma.store_wait(pendings=0)  # the previous tile's store out of my_c is done
        my_c.store(acc.to(c_desc.dtype))
        fence_async_shared()
        _tma_store(c_desc, [pid_m * BM + which * 64, pid_n * BN], my_c)
    tma.store_wait(pendings=0)


@gluon.jit
def gemm_ws_kernel(a_desc, b_desc, c_desc, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMER_REGS: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers release a stage
    gl.static_assert(BM == 128, "two consumer warpgroups of 64 rows")
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, c_desc, a_smem, b_smem, c_smem, ready, empty, M, N, K, GROUP_M, STAGES, 0)),
        (_consumer, (a_desc, b_desc, c_desc, a_smem, b_smem, c_smem, ready, empty, M, N, K, GROUP_M, STAGES, 1)),
        (_loader, (a_desc, b_desc, c_desc, a_smem, b_smem, c_smem, ready, empty, M, N, K, GROUP_M, STAGES, 0)),
    ], [4, 1], [CONSUMER_REGS, 24])


CONFIGS = [(256, 64, 3), (128, 64, 4)]  # (BN, BK, STAGES); BM = 128


def _layout(block, dtype=gl.bfloat16):
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def gemm_ws(a, b, out=None, bn=256, bk=64, stages=3, regs=232):
    """a (M, K) @ b (K, N), bf16 row-major with 16-byte aligned rows; out (M, N) bf16."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    out = out if out is not None else torch.empty(M, N, device=a.device, dtype=a.dtype)
    ad = TensorDescriptor(a, [M, K], list(a.stride()), [128, bk], _layout([128, bk]))
    bd = TensorDescriptor(b, [K, N], list(b.stride()), [bk, bn], _layout([bk, bn]))
    cd = TensorDescriptor(out, [M, N], list(out.stride()), [64, bn], _layout([64, bn]))
    tiles = triton.cdiv(M, 128) * triton.cdiv(N, bn)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    gemm_ws_kernel[(min(sms, tiles),)](ad, bd, cd, M, N, K, GROUP_M=8, STAGES=stages, CONSUMER_REGS=regs, num_warps=4)
    return out


def compile_only():
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def td(block):
        return f"tensordesc<bf16[{block[0]},{block[1]}],{_layout(block)!r}>"

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for bn, bk, stages in CONFIGS:
        sig = {"a_desc": td([128, bk]), "b_desc": td([bk, bn]), "c_desc": td([64, bn]), "M": "i32", "N": "i32",
               "K": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr", "CONSUMER_REGS": "constexpr"}
        src = GluonASTSource(gemm_ws_kernel, sig, {"GROUP_M": 8, "STAGES": stages, "CONSUMER_REGS": 232})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
        counts = {n: len(re.findall(p, sass)) for n, p in (("HGMMA", r"\bHGMMA"), ("USETMAXREG", r"USETMAXREG"),
                                                            ("LDL/STL", r"\b(LDL|STL)\b"), ("UTMALDG", r"UTMALDG"),
                                                            ("UTMASTG", r"UTMASTG"))}
        print(f"BN={bn} BK={bk} stages={stages}: shared {k.metadata.shared} B, {counts}")


def main():
    from tilewise.bench.harness import time_ms, time_ms_graph
    from tilewise.ops.gemm import api as g

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):  # clocks up before the first timing
        x @ x
    for M, N, K in ((1000, 1000, 1000), (333, 520, 136), (1536, 1536, 1536), (3072, 3072, 3072), (4096, 4096, 4096),
                    (8192, 8192, 8192)):
        gen = torch.Generator(device="cuda").manual_seed(M + N + K)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        rows = [("cublas", lambda: torch.matmul(a, b, out=out)), ("gemm()", lambda: g.gemm(a, b, out=out))]
        for bn, bk, stages in CONFIGS:
            out.fill_(float("nan"))
            gemm_ws(a, b, out, bn, bk, stages)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(f"{M}x{N}x{K} gluon ws BN={bn} stages={stages}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, "wrong answer"
            rows.append((f"gluon ws {bn}x{bk}x{stages}", lambda bn=bn, bk=bk, st=stages: gemm_ws(a, b, out, bn, bk, st)))
        if M * N < 2048 * 2048 and M != 1536:
            continue  # correctness only
        flops = 2 * M * N * K
        t = {name: (time_ms(fn), time_ms_graph(fn)) for name, fn in rows}
        for name, (e, gr) in t.items():
            print(f"{M}^3 {name:28s} eager {e * 1e3:8.1f} us ({t['cublas'][0] / e:.3f}x cublas)  graph "
                  f"{gr * 1e3:8.1f} us ({t['cublas'][1] / gr:.3f}x cublas) {flops / gr / 1e9:6.1f} TFLOP/s",
                  flush=True)


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
    else:
        main()
