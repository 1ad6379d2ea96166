"""The cached Triton launch path (tilewise.runtime.triton_launch): its signature rules on the CPU;
on the GPU, every op that launches through it gives bit-identical results with the cache on
(first call: Triton's dispatch; later calls: the cached launcher) and off."""

import pytest
import torch

from tilewise.runtime import triton_launch as tl_launch

from conftest import poison


def test_signature_separates_what_triton_specializes_on():
    sig = tl_launch._sig
    assert sig(True) != sig(1) and sig(False) != sig(0)  # u1 and i32 compile differently
    assert sig(16) != sig(17) and sig(1) != sig(2)
    assert sig(1.5) == sig(2.5)  # floats are not specialized: one kernel, value passed per call
    base = torch.empty(64, dtype=torch.float32)
    assert sig(base) == (torch.float32, True)
    assert sig(base[1:]) == (torch.float32, False)  # 4 bytes past an aligned base
    assert sig(base.to(torch.bfloat16)) != sig(base)
    assert sig(None) is None and sig("tf32") == "tf32"
    with pytest.raises(TypeError):
        sig(object())  # unknown argument types take the plain path


def test_signature_of_tensor_descriptors():
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.empty(64, 64, dtype=torch.float16)
    a = TensorDescriptor.from_tensor(x, [16, 32])
    b = TensorDescriptor.from_tensor(x, [32, 32])
    c = TensorDescriptor.from_tensor(x[:32], [16, 32])
    assert tl_launch._sig(a) != tl_launch._sig(b)  # block shape
    assert tl_launch._sig(a) != tl_launch._sig(c)  # global shape
    assert tl_launch._sig(a) == tl_launch._sig(TensorDescriptor.from_tensor(x.clone(), [16, 32]))


def test_interpreter_and_switch_take_the_plain_path(monkeypatch):
    calls = []

    class Fake:  # stands in for a triton.jit function
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k)) or "plain"

    monkeypatch.setattr(tl_launch, "_INTERPRET", True)
    assert tl_launch.launch(Fake(), (3,), 1, X=2) == "plain"
    monkeypatch.setattr(tl_launch, "_INTERPRET", False)
    monkeypatch.setattr(tl_launch, "_ENABLED", False)
    assert tl_launch.launch(Fake(), (4,), 5) == "plain"
    assert calls == [((3,), (1,), {"X": 2}), ((4,), (5,), {})]
    assert not any(isinstance(f, Fake) for f in tl_launch._CACHES)  # nothing cached on either path


def test_bind_without_the_cached_path_gives_none(monkeypatch):
    calls = []

    class Fake:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append(grid) or "plain"

    monkeypatch.setattr(tl_launch, "_INTERPRET", True)
    assert tl_launch.bind(Fake(), (2,), 1) is None  # launched, nothing to bind
    monkeypatch.setattr(tl_launch, "_INTERPRET", False)
    monkeypatch.setattr(tl_launch, "_ENABLED", False)
    assert tl_launch.bind(Fake(), (3,), 1) is None
    assert calls == [(2,), (3,)]


def test_hooks_installed_send_launches_through_triton():
    from triton import knobs

    assert not tl_launch._hooks_set()  # Triton >= 3.6 keeps empty hook chains, not None

    def hook(metadata):
        return None

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
        try:
            assert tl_launch._hooks_set()
        finally:
            chain.remove(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
        try:
            assert tl_launch._hooks_set()
        finally:
            knobs.runtime.launch_enter_hook = None
    assert not tl_launch._hooks_set()


def _fake_kernel():
    class Kernel:  # what the cached path reads from a compiled kernel
        run = function = packed_metadata = None
    return Kernel()


def test_remember_records_where_each_parameter_comes_from():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def body(x_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr = 128):
        pass

    k = JITFunction(body)  # not triton.jit: under TRITON_INTERPRET that gives an interpreter object
    cache = tl_launch._Cache(k)
    x = torch.empty(4)
    tl_launch._remember(cache, k, "key", _fake_kernel(), (x, 7), {"SCALE": 0.5})
    assert not cache.broken
    assert cache.entries["key"].order == (("a", 0), ("a", 1), ("k", "SCALE"), ("c", 128))
    # A float constexpr passed positionally would be keyed by its type alone: not cached.
    bad = tl_launch._Cache(k)
    tl_launch._remember(bad, k, "key", _fake_kernel(), (x, 7, 0.5), {})
    assert bad.broken and not bad.entries
    # A tensor by keyword would be kept alive by the key: not cached.
    bad = tl_launch._Cache(k)
    tl_launch._remember(bad, k, "key", _fake_kernel(), (x,), {"n": torch.ones(1), "SCALE": 1.0})
    assert bad.broken


# --------------------------------------------------------------------------- GPU


def _both_ways(fn, out_like):
    """fn(out) with the cache off, then three times with it on (into poisoned outputs): all equal."""
    tl_launch.set_enabled(False)
    try:
        ref = fn(poison(torch.empty_like(out_like)))
    finally:
        tl_launch.set_enabled(True)
    for _ in range(3):
        got = fn(poison(torch.empty_like(out_like)))
        assert torch.equal(got, ref), "cached launch differs"
    assert not torch.isnan(ref).any()
    return ref


def _no_cache_broken():
    return not any(c.broken for c in tl_launch._CACHES.values())


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [None, "v1_tiled", "v2_persistent", "v3_tma_persistent", "v3_tma_split",
                                     "v4_streamk"])
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (333, 520, 136), (512, 512, 512), (64, 96, 4104)],
                         ids=str)
@pytest.mark.quick(rotate="shape")
def test_gpu_gemm_cached_launch_is_bit_identical(variant, shape):
    from tilewise.ops.gemm import api as gt

    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = _both_ways(lambda out: gt.gemm(a, w.t(), bias=bias, activation="relu", out=out, variant=variant),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    exact = torch.relu(a.double() @ w.double().t() + bias.double())
    assert (ref.double() - exact).norm() / exact.norm() < 1e-2
    assert _no_cache_broken() and tl_launch._CACHES
    assert sum(v["hits"] for v in tl_launch.stats().values()) > 0


@pytest.mark.gpu
def test_gpu_cached_launch_follows_alignment_and_streams():
    from tilewise.ops.gemm import api as gt

    # Same shapes, a base pointer 2 bytes off: must not reuse the kernel compiled for aligned A.
    buf = torch.randn(200 * 130 + 1, device="cuda", dtype=torch.float16)
    aligned = buf[:200 * 130].view(200, 130)
    shifted = buf[1:].view(200, 130)
    b = torch.randn(130, 72, device="cuda", dtype=torch.float16)
    for a in (aligned, shifted, aligned, shifted):
        out = poison(torch.empty(200, 72, device="cuda", dtype=torch.float16))
        gt.gemm(a, b, out=out, variant="v1_tiled")
        exact = a.double() @ b.double()
        assert (out.double() - exact).norm() / exact.norm() < 2e-3
    # A side stream: the cached path launches on the current stream.
    s = torch.cuda.Stream()
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    gt.gemm(a, a, variant="v3_tma_persistent")
    with torch.cuda.stream(s):
        out = gt.gemm(a, a, variant="v3_tma_persistent")
    s.synchronize()
    exact = a.double() @ a.double()
    assert (out.double() - exact).norm() / exact.norm() < 1e-2


@pytest.mark.gpu
def test_gpu_cached_launch_from_threads():
    """Threads that launch the autotuned kernel at once, with different shapes: each signature
    must keep the config of its own launch (the miss path is serialized)."""
    import threading

    from tilewise.ops.gemm import api as gt

    shapes = [(300 + 64 * i, 200 + 32 * i, 128 + 16 * i) for i in range(6)]
    ops = []
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        ops.append((a, b, a.double() @ b.double()))
    errors = []

    def work(a, b, exact):
        try:
            for _ in range(4):
                out = gt.gemm(a, b, variant="v1_tiled")
                torch.cuda.current_stream().synchronize()
                err = ((out.double() - exact).norm() / exact.norm()).item()
                if not err < 2e-3:
                    errors.append(err)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=op) for op in ops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.gpu
def test_gpu_cached_launch_under_graph_capture():
    from tilewise.ops.gemm import api as gt

    a = torch.randn(700, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 384, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(700, 384, device="cuda", dtype=torch.bfloat16)
    gt.gemm(a, b, out=out)  # first call: plain path, compiles and fills the cache
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gt.gemm(a, b, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gt.gemm(a, b, out=out)
    poison(out)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    exact = a.double() @ b.double()
    assert (out.double() - exact).norm() / exact.norm() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kind", ["plain", "causal", "bias"])
@pytest.mark.quick(rotate="D")
def test_gpu_attention_cached_launch_is_bit_identical(D, kind):
    from tilewise.ops.attention.api import flash_attention

    g = torch.Generator(device="cuda").manual_seed(D)
    q, k, v = (torch.randn(2, 3, 300, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    bias = torch.randn(3, 300, 300, device="cuda", dtype=torch.bfloat16, generator=g) if kind == "bias" else None

    def run(out):
        return out.copy_(flash_attention(q, k, v, causal=kind == "causal", bias=bias))

    _both_ways(run, q)
    assert _no_cache_broken()
    q.requires_grad_(True)
    tl_launch.set_enabled(False)
    try:
        flash_attention(q, k, v, causal=kind == "causal", bias=bias).float().square().sum().backward()
        ref = q.grad.clone()
    finally:
        tl_launch.set_enabled(True)
    for _ in range(2):
        q.grad = None
        flash_attention(q, k, v, causal=kind == "causal", bias=bias).float().square().sum().backward()
        assert torch.equal(q.grad, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4097, 1000), (64, 50257), (3, 7)], ids=str)
def test_gpu_softmax_and_cross_entropy_cached_launch(shape):
    from tilewise.ops.rowwise.cross_entropy import cross_entropy
    from tilewise.ops.rowwise.softmax import softmax

    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, shape[1], (shape[0],), device="cuda")
    _both_ways(lambda out: out.copy_(softmax(x)), x)
    _both_ways(lambda out: out.copy_(cross_entropy(x, t).expand_as(out)), x)


@pytest.mark.gpu
def test_gpu_bound_launch_honours_hooks_and_the_switch():
    """A gemm() plan's bound launch goes through Triton's dispatch while a launch hook is
    installed (a profiler sees it) or the cached path is off, with the same result."""
    from triton import knobs

    from tilewise.bench.harness import rel_error
    from tilewise.ops.gemm import api as gt
    from tilewise.ops.gemm import route as gr

    a = torch.randn(300, 136, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(136, 200, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        ref = gt.gemm(a, b)
    plan = gr.PLANS[gr.plan_key(a, b, None, None, None, "tf32", None)]
    assert plan.bound is not None
    seen = []

    def hook(*args, **kwargs):
        seen.append(1)

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        got = gt.gemm(a, b)
    finally:
        if hasattr(chain, "add"):
            chain.remove(hook)
        else:
            knobs.runtime.launch_enter_hook = None
    assert seen and torch.equal(got, ref)
    tl_launch.set_enabled(False)
    try:
        assert torch.equal(gt.gemm(a, b), ref)
    finally:
        tl_launch.set_enabled(True)
    assert rel_error(ref, a.double() @ b.double()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (1536, 1536, 264), (200, 312, 96)], ids=str)
def test_gpu_direct_launcher_matches_kernel_run(shape, monkeypatch):
    """Bound's raw-launcher path (Triton 3.6: descriptors encoded once per address) against
    kernel.run, on two operand sets taken in turn (the encoded maps must follow the address)."""
    from tilewise.ops.gemm import api as gt
    from tilewise.ops.gemm import route as gr

    M, N, K = shape
    sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
             torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()) for _ in range(2)]
    results = {}
    for direct in (False, True):
        monkeypatch.setattr(tl_launch, "_DIRECT_ON", direct)
        gr.PLANS.clear()
        got = []
        for i in range(6):
            a, b = sets[i % 2]
            out = poison(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
            got.append(gt.gemm(a, b, out=out))
        plan = gr.PLANS[gr.plan_key(a, b, None, None, None, "tf32", out)]
        if direct and tl_launch._DIRECT and tl_launch._DIRECT[0] is not None:
            assert plan.bound.raw is not None
        if not direct:
            assert plan.bound.raw is None
        results[direct] = got
    for x, y in zip(results[False], results[True]):
        assert torch.equal(x, y)
    for i, (a, b) in enumerate(sets):
        exact = a.double() @ b.double()
        assert (results[True][i].double() - exact).norm() / exact.norm() < 1e-2
    gr.PLANS.clear()


def test_signature_of_gluon_tensor_descriptors():
    gluon_hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    x = torch.empty(64, 64, dtype=torch.bfloat16)
    lay = gl.NVMMASharedLayout.get_default_for([16, 32], gl.bfloat16)
    lay64 = gl.NVMMASharedLayout.get_default_for([16, 64], gl.bfloat16)
    a = gluon_hopper.TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 32], lay)
    b = gluon_hopper.TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 64], lay64)
    c = gluon_hopper.TensorDescriptor(x.clone(), list(x.shape), list(x.stride()), [16, 32], lay)
    assert tl_launch._sig(a) != tl_launch._sig(b) and tl_launch._sig(a) == tl_launch._sig(c)
    hash(tl_launch._sig(a))
