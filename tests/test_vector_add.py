import pytest
import torch

from tilewise.ops.pointwise import vector_add as va

from conftest import poison

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 31, 33, 1000, 4097, 16391, (1 << 20) + 3]


def test_reference_and_cost():
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    torch.testing.assert_close(va.reference(a, b), a + b, rtol=0, atol=0)
    c = va.cost(1 << 28, torch.float32)
    assert c.bytes == 3 * 4 * (1 << 28) and c.flops == 1 << 28
    assert va.cost(10, torch.bfloat16).bytes == 60


def test_cpu_tensors_and_unknown_variant():
    a = torch.randn(8)
    torch.testing.assert_close(va.vector_add(a, a), a + a)  # the one CPU rule: the reference
    with pytest.raises(ValueError, match="'a' is on cpu"):  # a version is a kernel
        va.VARIANTS["v1_naive"](a, a)
    with pytest.raises(ValueError, match="unknown variant 'v9'"):
        va.vector_add(a, a, variant="v9")
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        va.vector_add([1.0], a)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("variant", list(va.VARIANTS))
@pytest.mark.quick(rotate="n", per=2)
def test_variants_match_torch_add(variant, n, dtype):
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    out = poison(torch.empty_like(a))
    res = va.VARIANTS[variant](a, b, out)
    assert res is out
    # Same fp32 add and one rounding as PyTorch: bitwise equal, and no NaN left from the poison.
    torch.testing.assert_close(out, torch.add(a, b), rtol=0, atol=0)


@pytest.mark.gpu
def test_nd_shapes_and_new_output():
    a = torch.randn(3, 5, 7, device="cuda")
    b = torch.randn(3, 5, 7, device="cuda")
    out = va.vector_add(a, b)
    assert out.shape == (3, 5, 7)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    assert va.vector_add(a[:0], b[:0]).numel() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_views_fall_back_and_v2_refuses(dtype):
    base = torch.randn(4098, device="cuda", dtype=dtype)
    a, b = base[1:4098], base[:4097].clone()  # a starts one element past a 16-byte boundary
    out = poison(torch.empty_like(b))
    va.vector_add(a, b, out=out)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    for name in ("v2_vectorized", "v3_blocked"):
        with pytest.raises(ValueError, match="16-byte boundaries"):
            va.VARIANTS[name](a, b)


@pytest.mark.gpu
def test_input_errors():
    a = torch.randn(64, device="cuda")
    with pytest.raises(ValueError, match="dtype torch.int32"):
        va.vector_add(a.int(), a.int())
    with pytest.raises(ValueError, match="'b' is not contiguous"):
        va.vector_add(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda").t())
    with pytest.raises(ValueError, match="'a' has shape .* but 'b' has"):
        va.vector_add(a, a[:10])
    with pytest.raises(ValueError, match="'b' has dtype torch.float16 but 'a' has torch.float32"):
        va.vector_add(a, a.half())
    with pytest.raises(ValueError, match="'b' is on cpu"):
        va.vector_add(a, a.cpu())
    with pytest.raises(ValueError, match="'out' has dtype torch.float16"):
        va.vector_add(a, a, out=torch.empty(64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="out must be a tensor of shape"):
        va.vector_add(a, a, out=torch.empty(65, device="cuda"))
