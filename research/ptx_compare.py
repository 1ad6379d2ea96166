"""Question: does a refactor of Triton kernels change the code they compile to?

Compiles a fixed set of tilewise's Triton kernels for sm_90 on any machine (no GPU: Triton's compiler
alone), strips what moves with source lines (.loc / .file / debug sections, comments), and prints one
hash of the PTX per kernel and setting as JSON. Run it on two trees and compare:

    PYTHONPATH=src python research/ptx_compare.py [--sass] > /tmp/after.json
    (cd OTHER_TREE && PYTHONPATH=src python research/ptx_compare.py) > /tmp/before.json
    python research/ptx_compare.py --diff /tmp/before.json /tmp/after.json

Same hashes: the refactor is code-neutral for these settings (a good extra check before the GPU run,
not a substitute for it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

SASS = "--sass" in sys.argv  # hash the SASS (ptxas' scheduling included) instead of the PTX
_DEBUG = re.compile(r"^\s*\.section\s+\.debug.*?^\s*}", re.M | re.S)


_TMP_LABEL = re.compile(r"^\$L__tmp\d+:$")
_NAMES = re.compile(r"%[a-z]+\d+|\$L__BB\d+_\d+")


def _code(ptx: str) -> str:
    """The PTX without what moves with source lines or inlining scopes (debug sections, .loc / .file
    lines, comments, debug labels), registers and block labels renamed in order of first use (an
    inlined helper can swap two independent instructions' register numbers)."""
    lines = [ln for ln in _DEBUG.sub("", ptx).splitlines()
             if not ln.lstrip().startswith((".loc", ".file", "//")) and not _TMP_LABEL.match(ln.strip())]
    names: dict[str, str] = {}

    def rename(m):
        kind = re.match(r"%[a-z]+|\$L__BB", m.group(0)).group(0)
        return names.setdefault(m.group(0), f"{kind}#{sum(v.startswith(kind + '#') for v in names.values())}")

    return "\n".join(_NAMES.sub(rename, ln) for ln in lines)


def _ptx_hash(fn, sig: dict, constexprs: dict, warps: int, stages: int = 1) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(sig)
    for k in constexprs:
        sig.setdefault(k, "constexpr")
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    if SASS:
        return hashlib.sha256(_sass(k.asm["cubin"]).encode()).hexdigest()[:16]
    ptx = _code(k.asm["ptx"])
    if "ld.global" not in ptx and "ld.shared" not in ptx:
        raise RuntimeError("no loads left in the PTX: the filter took too much")
    return hashlib.sha256(ptx.encode()).hexdigest()[:16]


def _sass(cubin: bytes) -> str:
    """The cubin's SASS (Triton's bundled nvdisasm) without addresses, encodings and debug lines."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout
    body = [re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", ln).strip() for ln in text.splitlines()]
    body = [ln for ln in body if ln and not ln.startswith(("//", ".section .debug", "."))]
    if not any("LDG" in ln or "LDS" in ln for ln in body):
        raise RuntimeError("no loads in the SASS: the filter took too much")
    return "\n".join(body)


def cases():
    from tilewise.ops.norm import triton_kernels as NK
    from tilewise.ops.rowwise import cross_entropy as CE
    from tilewise.ops.rowwise import softmax as SM

    f32, bf16, i32, i64 = "*fp32", "*bf16", "i32", "*i64"
    for one_pass, log, rows, block in ((True, False, 4, 1024), (True, True, 1, 4096), (False, False, 1, 8192),
                                       (False, True, 2, 4096)):
        meta = dict(ROWS=rows, BLOCK=block, LOG=log, ONE_PASS=one_pass, REVERSE=not one_pass)
        yield (f"softmax_fwd {meta}", SM._softmax_fwd_kernel,
               dict(X=bf16, Y=bf16, M=i32, N=i32, stride_xm=i32, stride_ym=i32), meta, 8)
        yield (f"softmax_bwd {meta}", SM._softmax_bwd_kernel,
               dict(Yp=bf16, DY=bf16, DX=bf16, M=i32, N=i32, stride_ym=i32, stride_dym=i32, stride_dxm=i32), meta, 8)
    for one_pass, grad, smooth in ((True, True, False), (False, True, True), (True, False, False)):
        meta = dict(ROWS=1, BLOCK=4096, ONE_PASS=one_pass, HAS_GRAD=grad, SMOOTH=smooth)
        yield (f"cross_entropy {meta}", CE._ce_kernel,
               dict(X=bf16, T=i64, LOSS=f32, DX=bf16, M=i32, N=i32, stride_xm=i32, stride_dxm=i32,
                    ignore_index=i32, smoothing="fp32", grad_scale="fp32"), meta, 8)
    for rows, block, cast in ((4, 512, True), (1, 4096, False)):
        meta = dict(BLOCK=block, ROWS=rows, CAST_FIRST=cast)
        yield (f"rms_norm_fwd {meta}", NK._rms_norm_fwd_kernel,
               dict(X=bf16, W=bf16, Y=bf16, RSTD=f32, M=i32, N=i32, stride_x=i32, stride_y=i32, eps="fp32",
                    offset="fp32"), meta, 8)
        yield (f"rms_norm_bwd {meta}", NK._rms_norm_bwd_kernel,
               dict(DY=bf16, X=bf16, W=bf16, RSTD=f32, DX=bf16, DW=f32, M=i32, N=i32, stride_dy=i32, stride_x=i32,
                    stride_dx=i32, offset="fp32"), meta, 8)
    yield from _gemm_cases()


def _gemm_cases():
    from tilewise.ops.gemm import triton_kernels as GK

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    ptrs = dict(a_ptr=bf16, b_ptr=bf16, c_ptr=bf16, bias_ptr=bf16, aux_ptr=bf16, scale_a_ptr=f32, scale_b_ptr=f32)
    mnk = dict(M=i32, N=i32, K=i32)
    strides = {f"stride_{s}": i32 for s in ("am", "ak", "bk", "bn", "cm", "cn")}
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)
    for bias, scales, aux, act in ((True, False, True, 2), (False, True, False, 1)):
        flags = dict(HAS_BIAS=bias, HAS_SCALES=scales, STORE_AUX=aux, ACTIVATION=act, PRECISION="tf32",
                     UPCAST=False)
        meta = dict(tile, **flags)
        yield f"gemm {meta}", GK._gemm_kernel, dict(ptrs, **mnk, **strides), meta, 8
        yield (f"gemm_persistent {meta}", GK._gemm_persistent_kernel, dict(ptrs, **mnk, **strides, NUM_SMS=i32),
               meta, 8)
        a_desc, b_desc = "tensordesc<bf16[128, 64]>", "tensordesc<bf16[64, 128]>"
        for tma in (False, True):
            sk = dict(meta, USE_TMA=tma, B_KMAJOR=False)
            yield (f"gemm_streamk {sk}", GK._gemm_streamk_kernel,
                   dict(a_ptr=bf16, b_ptr=bf16, a_desc=a_desc if tma else bf16, b_desc=b_desc if tma else bf16,
                        c_ptr=bf16, bias_ptr=bf16, aux_ptr=bf16, scale_a_ptr=f32, scale_b_ptr=f32, ws_ptr=f32,
                        count_ptr="*i32", **mnk, **strides, ITERS_PER_PROG=i32), sk, 8)
        c_desc = "tensordesc<bf16[128, 128]>"
        pm = dict(meta, B_KMAJOR=False)
        yield (f"gemm_tma_persistent {pm}", GK._gemm_tma_persistent_kernel,
               dict(a_desc=a_desc, b_desc=b_desc, c_desc=c_desc, aux_desc=c_desc, bias_ptr=bf16, scale_a_ptr=f32,
                    scale_b_ptr=f32, **mnk, NUM_SMS=i32, dtype_tag=i32), pm, 8)
        sm = dict(pm, BLOCK_N2=64)
        h_desc = "tensordesc<bf16[128, 64]>"
        yield (f"gemm_tma_split {sm}", GK._gemm_tma_split_kernel,
               dict(a_desc=a_desc, b_desc=b_desc, b2_desc="tensordesc<bf16[64, 64]>", c_desc=c_desc, c2_desc=h_desc, aux_desc=c_desc,
                    aux2_desc=h_desc, bias_ptr=bf16, scale_a_ptr=f32, scale_b_ptr=f32, **mnk, NUM_SMS=i32), sm, 8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    p.add_argument("--sass", action="store_true", help="compare the SASS ptxas makes, not the PTX")
    p.add_argument("--only", nargs="*", metavar="NAME", help="only the cases whose name starts with one of these")
    a = p.parse_args()
    if a.diff:
        before, after = (json.load(open(f)) for f in a.diff)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in changed:
            print(f"differs: {k}: {before.get(k)} -> {after.get(k)}")
        print(f"{len(before.keys() & after.keys()) - len(changed)} of {len(before.keys() | after.keys())} same")
        sys.exit(1 if changed else 0)
    out = {}
    for name, fn, sig, meta, warps in cases():
        if a.only and not any(name.startswith(o) for o in a.only):
            continue
        try:
            out[name] = _ptx_hash(fn, sig, meta, warps)
        except Exception as e:  # noqa: BLE001 - a setting that does not build is recorded as such
            out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
