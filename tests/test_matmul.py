import pytest
import torch

from tilewise.bench.harness import rel_error
from tilewise.ops.gemm import sgemm as mm
from tilewise.runtime import cuda as rt

from conftest import poison

FP32_TOL = 2e-5  # ||out - ref|| / ||ref|| against float64, fp32 accumulation over K <= 4097
SHAPES = [(1, 1, 1), (31, 33, 17), (33, 31, 1), (129, 127, 131), (1000, 257, 333), (4097, 33, 31), (65, 4097, 9)]


# --------------------------------------------------------------------------- CPU


def test_reference_and_cost():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    torch.testing.assert_close(mm.reference(a, b), a @ b)
    assert mm.reference(a, b).dtype == torch.float32
    c = mm.cost(4096, 4096, 4096)
    assert c.flops == 2 * 4096**3 and c.bytes == 4 * 3 * 4096**2
    # A broadcast operand is read once, not once per batch.
    c = mm.cost(10, 20, 30, batch=4, batch_a=1)
    assert c.flops == 2 * 4 * 10 * 20 * 30 and c.bytes == 4 * (10 * 30 + 4 * 30 * 20 + 4 * 10 * 20)


def test_bad_input_is_rejected_with_the_reason():
    a = torch.randn(4, 5)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        mm.matmul(a, torch.randn(6, 3))
    with pytest.raises(ValueError, match="cannot broadcast"):
        mm.matmul(torch.randn(2, 4, 5), torch.randn(3, 5, 6))
    with pytest.raises(ValueError, match="must be 2-D .* or 3-D"):
        mm.matmul(torch.randn(5), torch.randn(5, 2))
    b = torch.randn(5, 3)
    torch.testing.assert_close(mm.matmul(a, b), (a.double() @ b.double()).float())  # the one CPU rule
    with pytest.raises(ValueError, match="'a' is on cpu"):  # a version is a kernel
        mm.VARIANTS["v1_naive"](a, b, None)
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        mm.matmul([[1.0]], a)
    with pytest.raises(ValueError, match="unknown variant 'v9'"):
        mm.matmul(a, torch.randn(5, 3), variant="v9")


def test_every_version_is_a_variant_and_compiles_without_spills(fresh_cache):
    assert list(mm.VARIANTS) == list(mm._VERSIONS) and mm.FASTEST in mm.VARIANTS
    src = rt.OPS_DIR / "gemm" / "sgemm.cu"
    declared = rt.name_expressions_for(src)
    assert sorted(declared) == sorted(f"matmul_{v}" for v in mm._VERSIONS)
    res = {r.name: r for r in rt.compile_file(src, arch="sm_90", name_expressions=declared).resources}
    for v in mm._VERSIONS:
        r = res[f"matmul_{v}"]
        assert not r.spills and r.stack_bytes == 0, r
    # Two blocks of v6 per SM need <= 128 registers and 2 x its shared memory within 228 KiB.
    assert res["matmul_v6_warptile"].registers <= 128
    assert 2 * res["matmul_v6_warptile"].shared_bytes <= 228 * 1024


# --------------------------------------------------------------------------- GPU


def _ref(a, b):
    return torch.matmul(a.double(), b.double())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("variant", list(mm.VARIANTS))
@pytest.mark.quick(rotate="shape", per=2)
def test_variants_match_float64(variant, shape):
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    out = poison(torch.empty(M, N, device="cuda"))
    res = mm.VARIANTS[variant](a, b, out)
    assert res is out
    assert rel_error(out, _ref(a, b)) < FP32_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(mm.VARIANTS))
@pytest.mark.parametrize("layout", ["at", "bt", "both", "sliced"])
def test_strided_views_without_copy(variant, layout):
    M, N, K = 131, 67, 45
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(K, M, device="cuda", generator=g).t() if layout in ("at", "both") else \
        torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(N, K, device="cuda", generator=g).t() if layout in ("bt", "both") else \
        torch.randn(K, N, device="cuda", generator=g)
    if layout == "sliced":  # odd row strides and a misaligned start: the 16-byte paths must step aside
        a = torch.randn(M, K + 3, device="cuda", generator=g)[:, 1:K + 1]
        b = torch.randn(K, N + 5, device="cuda", generator=g)[:, 2:N + 2]
    out = poison(torch.empty(M, N, device="cuda"))
    mm.VARIANTS[variant](a, b, out)
    assert rel_error(out, _ref(a, b)) < FP32_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(mm.VARIANTS))
def test_batched_and_broadcast(variant):
    g = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(5, 33, 70, device="cuda", generator=g)
    b = torch.randn(5, 70, 129, device="cuda", generator=g)
    b1 = torch.randn(1, 70, 129, device="cuda", generator=g)
    w = torch.randn(70, 129, device="cuda", generator=g)
    for x, y in ((a, b), (a, b1), (a[:1], b), (a, w), (a[0], b), (a, b1.expand(5, 70, 129)),
                 (a.transpose(1, 2).contiguous().transpose(1, 2), b)):
        out = mm.VARIANTS[variant](x, y)
        assert out.shape == (5, 33, 129)
        assert rel_error(out, _ref(x, y)) < FP32_TOL


@pytest.mark.gpu
def test_k_zero_sizes_one_and_empty():
    a = torch.randn(7, 0, device="cuda")
    b = torch.randn(0, 9, device="cuda")
    for v in mm.VARIANTS:
        out = poison(torch.empty(7, 9, device="cuda"))
        mm.VARIANTS[v](a, b, out)
        assert torch.equal(out, torch.zeros(7, 9, device="cuda")), v
    assert mm.matmul(torch.randn(0, 4, device="cuda"), torch.randn(4, 3, device="cuda")).shape == (0, 3)
    x = torch.randn(1, 1, device="cuda")
    assert torch.allclose(mm.matmul(x, x), x * x)


@pytest.mark.gpu
def test_large_batch_runs_in_chunks():
    a = torch.randn(70000, 2, 3, device="cuda")
    b = torch.randn(70000, 3, 2, device="cuda")
    out = mm.matmul(a, b, variant="v3_smem")
    assert rel_error(out, _ref(a, b)) < FP32_TOL


@pytest.mark.gpu
def test_gpu_input_errors():
    a = torch.randn(8, 8, device="cuda")
    with pytest.raises(ValueError, match="dtype torch.float16"):
        mm.matmul(a.half(), a.half())
    with pytest.raises(ValueError, match="out must be a tensor of shape"):
        mm.matmul(a, a, out=torch.empty(8, 9, device="cuda"))
    with pytest.raises(ValueError, match="out must be contiguous"):
        mm.matmul(a, a, out=torch.empty(8, 8, device="cuda").t())
    with pytest.raises(ValueError, match="'b' is on cpu"):
        mm.matmul(a, a.cpu())
    with pytest.raises(ValueError, match="'out' shares memory with 'a'"):
        mm.matmul(a, a.clone(), out=a)
    buf = torch.randn(16, 8, device="cuda")
    mm.matmul(buf[:8], a, out=buf[8:])  # disjoint rows of one buffer
    torch.testing.assert_close(buf[8:], buf[:8] @ a, rtol=1e-4, atol=1e-4)
