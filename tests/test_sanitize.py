"""Every CUDA C kernel family once at small odd sizes, for compute-sanitizer.

``scripts/gpu-check --sanitize`` runs ``pytest -m sanitize`` under memcheck, racecheck, initcheck and
synccheck. The transpose, SpMV and row-wise cluster kernels have theirs in their own files
(``test_sanitizer_*``, also marked ``sanitize``). Outputs are poisoned; answers are checked against
PyTorch, so the run under the sanitizers is a correctness run too. Also part of the quick tier.
"""

import pytest
import torch

from tilewise.ops.pointwise import elementwise as ew
from tilewise.ops.embedding import api as em
from tilewise.ops.pointwise import fusion as fu
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import sgemm as mm
from tilewise.ops.pointwise import reduce as rd
from tilewise.ops.pointwise import vector_add as va

from conftest import poison

pytestmark = [pytest.mark.gpu, pytest.mark.sanitize]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _close(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_sanitize_vector_add():
    for dtype in DTYPES:
        a, b = (torch.randn(1003, device="cuda").to(dtype) for _ in range(2))
        for fn in va.VARIANTS.values():
            out = poison(torch.empty_like(a))
            fn(a, b, out)
            _close(out, a + b, dtype)


def test_sanitize_elementwise():
    for dtype in DTYPES:
        # 336 columns: v5_rows reads 16-byte rows (an (R, C) tensor and a (C,) row)
        x = torch.rand(3, 336, device="cuda").add_(0.5).to(dtype)
        y = torch.rand(3, 336, device="cuda").add_(0.5).to(dtype)
        for op in ew.MAP_OPS:
            want = ew.reference(op, x.double())
            for fn in ew.MAP_VARIANTS.values():
                out = poison(torch.empty_like(x))
                fn(op, x, out)
                _close(out, want, dtype)
        for op in ew.ZIP_OPS:
            for name, fn in ew.ZIP_VARIANTS.items():
                b = y[1] if name == "v5_rows" else y
                out = poison(torch.empty_like(x))
                fn(op, x, b, out)
                _close(out, ew.reference(op, x.double(), b.double()), dtype)
    for variant in ew.DIVERGENCE_VARIANTS:
        xs = ew.divergence_inputs(1003, "split")
        torch.testing.assert_close(ew.divergence(xs, variant, work=8), ew.divergence_reference(xs, 8),
                                   rtol=1e-5, atol=1e-5)


def test_sanitize_reduce_and_masked_mean():
    for dtype in DTYPES:
        x = torch.randn(37, 45, device="cuda").to(dtype)
        for op in ("sum", "max"):
            for dim in (0, 1):
                want = x.double().sum(dim) if op == "sum" else x.double().amax(dim)
                for fn in rd.VARIANTS.values():
                    out = poison(torch.empty(want.shape, device="cuda", dtype=dtype))
                    fn(x, dim, op, False, out)
                    torch.testing.assert_close(out.double(), want, rtol=5e-2, atol=5e-2)
    x = torch.randn(5, 13, 33, device="cuda", requires_grad=True)
    lengths = torch.tensor([13, 1, 7, 0, 12], device="cuda")
    rd.masked_mean(x, lengths).sum().backward()
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(rd.masked_mean(x.detach(), lengths), rd.masked_mean_reference(x.detach(), lengths))


def test_sanitize_matmul():
    a, b = torch.randn(33, 45, device="cuda"), torch.randn(45, 29, device="cuda")
    for fn in mm.VARIANTS.values():
        out = poison(torch.empty(33, 29, device="cuda"))
        fn(a, b, out)
        torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


def test_sanitize_embedding():
    for dtype in DTYPES:
        w = torch.randn(97, 40, device="cuda").to(dtype).requires_grad_()
        ids = torch.randint(0, 97, (3, 11), device="cuda")
        ids[0, 0] = 3
        for fn in em.VARIANTS.values():
            w.grad = None
            out = fn(ids, w, padding_idx=3)
            _close(out, w[ids].detach(), dtype)
            out.float().sum().backward()
            assert torch.isfinite(w.grad.float()).all() and float(w.grad[3].abs().sum()) == 0


def test_sanitize_fusion():
    f = fu.fuse(lambda x, y: ew.sin(x) * y + ew.relu(y))
    for dtype in DTYPES:
        x, y = (torch.randn(3, 333, device="cuda").to(dtype) for _ in range(2))
        _close(f(x, y), torch.sin(x.double()) * y.double() + torch.relu(y.double()), dtype)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="gemm_sm90 needs an sm_90 GPU")
def test_sanitize_gemm_sm90():
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(133, 72, device="cuda").to(dtype)
        b = torch.randn(72, 200, device="cuda").to(dtype)
        want = a.double() @ b.double()
        for config in sorted(gc.SM90_CONFIGS) + sorted(gc.SM90_EXTRA_CONFIGS):
            out = poison(torch.empty(133, 200, device="cuda", dtype=dtype))
            gs.gemm_sm90(a, b, out=out, config=config)
            assert float((out.double() - want).norm() / want.norm()) < 1e-2, config
    a, b = torch.randn(37, 68, device="cuda"), torch.randn(68, 132, device="cuda")
    want = a.double() @ b.double()
    for bm in (256, 192, 128, 64):
        for cluster in ((1, 2) if bm != 64 else (1,)):
            out = poison(torch.empty(37, 132, device="cuda"))
            gs.gemm_tf32(a, b, out=out, bm=bm, cluster=cluster)
            assert float((out.double() - want).norm() / want.norm()) < 3e-3
