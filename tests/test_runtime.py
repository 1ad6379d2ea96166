import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from tilewise.runtime import cuda as rt

TEMPLATE_SRC = textwrap.dedent(r"""
    #include "tilewise_common.cuh"
    template <typename T>
    __global__ void scale(const T* x, T* y, float s, long long n) {
      long long i = tw::global_thread_id();
      if (i < n) y[i] = tw::from_float<T>(s * tw::to_float(x[i]));
    }
""")


# --------------------------------------------------------------------------- compile check (CPU)


def test_every_package_kernel_compiles_for_sm90_without_spills(fresh_cache):
    sources = rt.package_sources()
    assert sources, "no .cu files found in tilewise/ops"
    res = rt.check_package("sm_90")
    for src in sources:
        names = rt.name_expressions_for(src)
        assert names, f"{src.name} declares no '// tilewise-instantiate:' kernels"
        for n in names:
            assert any(r.name == n for r in res), f"no ptxas report for {n}"
    for r in res:
        assert r.arch in ("sm_90", "sm_90a")  # sources marked `// tilewise-arch: sm_90a` build for it
        assert r.registers > 0, r
        assert not r.spills, f"{r.name} spills: {r.spill_store_bytes} B stored, {r.spill_load_bytes} B loaded"


def test_check_fails_on_a_declared_kernel_without_a_report(monkeypatch):
    src = rt.OPS_DIR / "pointwise" / "vector_add.cu"
    monkeypatch.setattr(rt, "package_sources", lambda: [src])
    real = rt._check_one

    def lossy(path, arch):  # a ptxas log that lost one kernel's lines
        res, missing = real(path, arch)
        return res[1:], sorted({*missing, res[0].name})

    monkeypatch.setattr(rt, "_check_one", lossy)
    with pytest.raises(rt.CompileError, match="reported no resources for vector_add"):
        rt.check_package("sm_90", jobs=1)


def test_nvrtc_own_cache_is_off_so_ptxas_always_reports():
    """NVRTC 12.9+ caches compiles, and a hit skips ptxas and its -v report: on the H200 `check`
    found no resources for matmul.cu's kernels once the tests had compiled them (397a6eb)."""
    opts = rt._program_options("k.cu", "sm_90", ())
    assert rt.nvrtc_version() < (12, 9) or opts.no_cache is True


def test_cli_check_reports_kernels(fresh_cache):
    p = subprocess.run([sys.executable, "-m", "tilewise", "check", "--arch", "sm_90"], capture_output=True,
                       text=True, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "vector_add_v2_vectorized<float>" in p.stdout


def test_check_for_another_arch_skips_the_sm90a_sources(fresh_cache, monkeypatch):
    """``check --arch sm_80``: the sm_90a-only GEMM sources are left out with a note, the rest
    compile (here: vector_add.cu and the two sm_90a sources, to keep it short); exit 0."""
    from tilewise import cli

    keep = [rt.OPS_DIR / "pointwise" / "vector_add.cu", rt.OPS_DIR / "gemm" / "sm90.cu",
            rt.OPS_DIR / "gemm" / "sm90_tf32.cu"]
    monkeypatch.setattr(rt, "package_sources", lambda: keep)
    assert set(rt.arch_only_sources("sm_80")) == set(keep[1:])
    assert rt.arch_only_sources("sm_90") == {} and rt.arch_only_sources("sm_90a") == {}
    res = rt.check_package("sm_80", jobs=1)
    assert {r.name for r in res} == set(rt.name_expressions_for(keep[0]))
    assert all(r.arch == "sm_80" for r in res)
    assert cli.main(["check", "--arch", "sm_80", "--jobs", "1"]) == 0


def test_cluster_sources_are_left_out_below_sm90(monkeypatch):
    # They use thread-block clusters (sm_90 and later): not sm_90a-only, but not for sm_80 either.
    cluster = {rt.OPS_DIR / "rowwise" / "cluster.cu", rt.OPS_DIR / "spmv" / "spmv.cu"}
    assert cluster <= set(rt.arch_only_sources("sm_80"))
    assert {rt.arch_only_sources("sm_80")[s] for s in cluster} == {"sm_90 or later"}
    assert not cluster & set(rt.arch_only_sources("sm_90")) and not cluster & set(rt.arch_only_sources("sm_100"))


@pytest.mark.parametrize("arch, code", [("sm_90", 1), ("sm_90a", 1), ("sm_80", 0)])
def test_check_fails_on_spills_only_for_the_tuned_arch(monkeypatch, capsys, arch, code):
    # The tiles' register budgets are sm_90's: a spill there fails the check; elsewhere it is reported.
    from tilewise import cli

    spilling = rt.KernelResources("k<float>", "_Z1k", arch, 255, 0, 0, 64, 64)
    monkeypatch.setattr(rt, "check_package", lambda arch, jobs=None: [spilling])
    monkeypatch.setattr(rt, "arch_only_sources", lambda arch: {})
    assert cli.main(["check", "--arch", arch]) == code
    assert "spills in: k<float>" in capsys.readouterr().out


def test_templates_through_name_expressions(fresh_cache):
    names = ["scale<float>", "scale<__half>", "scale<__nv_bfloat16>"]
    m = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=names, arch="sm_90")
    assert sorted(m.symbol_mapping) == sorted(names)
    assert len({m.symbol_mapping[n] for n in names}) == 3  # three distinct mangled kernels
    assert m.cubin[:4] == b"\x7fELF"
    assert {r.name for r in m.resources} == set(names)


def test_compile_error_names_file_and_shows_nvrtc_log(fresh_cache):
    with pytest.raises(rt.CompileError) as ei:
        rt.compile_source("__global__ void broken(float* x) { x[0] = undefined_name; }",
                          name="ops/broken.cu", arch="sm_90")
    msg = str(ei.value)
    assert "ops/broken.cu" in msg and "sm_90" in msg
    assert "undefined_name" in msg and "error" in msg  # the compiler's own words


def test_bad_option_is_rejected():
    with pytest.raises(ValueError, match="unsupported compile option"):
        rt.compile_source(TEMPLATE_SRC, arch="sm_90", options=("-O3",), use_cache=False)


_CHILD = textwrap.dedent("""
    import json, sys
    from tilewise.runtime import cuda as rt
    src = sys.argv[1]
    m = rt.compile_source(open(src).read(), name=src, name_expressions=["scale<float>"], arch="sm_90")
    print(json.dumps({"from_cache": m.from_cache, "key": m.key}))
""")


def _compile_in_child(src_path, cache):
    env = {**os.environ, "TILEWISE_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", _CHILD, str(src_path)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_disk_cache_lets_a_second_process_skip_nvrtc(tmp_path):
    src = tmp_path / "scale.cu"
    src.write_text(TEMPLATE_SRC)
    cache = tmp_path / "cache"
    first = _compile_in_child(src, cache)
    second = _compile_in_child(src, cache)
    assert first["from_cache"] is False
    assert second["from_cache"] is True and second["key"] == first["key"]
    assert (cache / f"{first['key']}.cubin").is_file()
    # An edited source misses the cache.
    src.write_text(TEMPLATE_SRC + "\n// edited\n")
    third = _compile_in_child(src, cache)
    assert third["from_cache"] is False and third["key"] != first["key"]


def test_cache_key_covers_options_arch_and_names():
    base = rt._cache_key("src", "a.cu", ("-std=c++17",), "sm_90", ("k<float>",))
    assert base != rt._cache_key("src", "a.cu", ("-std=c++17", "-DX=1"), "sm_90", ("k<float>",))
    assert base != rt._cache_key("src", "a.cu", ("-std=c++17",), "sm_80", ("k<float>",))
    assert base != rt._cache_key("src", "a.cu", ("-std=c++17",), "sm_90", ("k<__half>",))
    assert base != rt._cache_key("src2", "a.cu", ("-std=c++17",), "sm_90", ("k<float>",))
    assert base == rt._cache_key("src", "/elsewhere/a.cu", ("-std=c++17",), "sm_90", ("k<float>",))


def test_corrupt_cache_entry_is_recompiled(fresh_cache):
    m = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    (fresh_cache / f"{m.key}.cubin").write_bytes(b"garbage")
    again = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    assert again.from_cache is False and again.cubin == m.cubin


def test_cache_dir_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("TILEWISE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert rt.cache_dir() == tmp_path / "tilewise"
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "x"))
    assert rt.cache_dir() == tmp_path / "x"


# --------------------------------------------------------------------------- threads and cache trust (issue 29)

_THREADS_CHILD = textwrap.dedent("""
    import sys, threading
    from tilewise.runtime import cuda as rt
    src = open(sys.argv[1]).read()
    barrier, cubins, errors = threading.Barrier(8), [], []

    def work():
        barrier.wait()  # all eight reach the first cuda.core import together
        try:
            cubins.append(rt.compile_source(src, name="scale.cu", name_expressions=["scale<float>"],
                                            arch="sm_90").cubin)
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(errors or "ok", len(cubins), len(set(cubins)))
""")


def test_threads_compiling_at_once_on_a_fresh_cache_all_succeed(tmp_path):
    # A fresh process: the race was in cuda.core's first import, which the test process has done.
    src = tmp_path / "scale.cu"
    src.write_text(TEMPLATE_SRC)
    env = {**os.environ, "TILEWISE_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", _THREADS_CHILD, str(src)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ok", "8", "1"], p.stdout  # eight cubins, all the same bytes
    assert [f.suffix for f in sorted((tmp_path / "cache").iterdir())] == [".cubin", ".json"]  # no temporaries


def test_concurrent_first_calls_import_cuda_core_once(monkeypatch):
    imports = []

    def slow_import():
        imports.append(1)
        time.sleep(0.05)  # wide open for a second thread to start its own import
        return object()

    monkeypatch.setattr(rt, "_cuda_core_module", None)
    monkeypatch.setattr(rt, "_import_cuda_core", slow_import)
    barrier = threading.Barrier(8)
    got = []

    def call():
        barrier.wait()
        got.append(rt._cuda_core())

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(imports) == 1 and len(got) == 8 and len({id(m) for m in got}) == 1


def test_a_new_cache_dir_is_private(fresh_cache):
    rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    assert fresh_cache.stat().st_mode & 0o777 == 0o700


def test_a_group_writable_cache_dir_is_refused_even_with_a_valid_entry(fresh_cache):
    m = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    os.chmod(fresh_cache, 0o775)  # anyone in the group could now plant a cubin and its JSON
    with pytest.raises(rt.CacheDirError, match="writable by group or others") as ei:
        rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    assert str(fresh_cache) in str(ei.value) and "TILEWISE_CACHE_DIR" in str(ei.value)
    # Without the cache nothing is read from there, so the compile goes through.
    again = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90",
                              use_cache=False)
    assert again.from_cache is False and again.cubin == m.cubin


def test_a_cache_dir_of_another_user_is_refused(fresh_cache, monkeypatch):
    fresh_cache.mkdir(mode=0o700)
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)  # as if the directory's owner were someone else
    with pytest.raises(rt.CacheDirError, match=f"owned by uid {me}") as ei:
        rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
    assert str(fresh_cache) in str(ei.value) and "TILEWISE_CACHE_DIR" in str(ei.value)


def test_a_fused_kernel_source_is_written_to_the_private_cache_only(fresh_cache):
    from tilewise.ops.pointwise import elementwise as ew
    from tilewise.ops.pointwise import fusion

    f = fusion.fuse(lambda x: ew.relu(x))
    fresh_cache.mkdir(mode=0o700)
    os.chmod(fresh_cache, 0o777)
    with pytest.raises(rt.CacheDirError):
        f._source_file(1, torch.float32)  # the .cu it writes there is compiled and run
    os.chmod(fresh_cache, 0o700)
    path, _ = f._source_file(1, torch.float32)
    assert path.parent.parent == fresh_cache


def test_a_cache_that_cannot_be_written_costs_a_recompile_only(fresh_cache, monkeypatch):
    def read_only(path, data):
        raise PermissionError(13, "Read-only file system", str(path))

    monkeypatch.setattr(rt, "write_atomic", read_only)  # (chmod cannot stop root, who runs CI here)
    for _ in range(2):
        m = rt.compile_source(TEMPLATE_SRC, name="scale.cu", name_expressions=["scale<float>"], arch="sm_90")
        assert m.from_cache is False and m.cubin[:4] == b"\x7fELF"
    assert list(fresh_cache.iterdir()) == []


def test_parse_ptxas_log_reads_registers_smem_and_spills():
    log = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'
        ptxas info    : Function properties for _Z1kPf
        ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
        ptxas info    : Compiling entry function '_Z1gPf' for 'sm_90'
        ptxas info    : Function properties for _Z1gPf
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 8 registers, used 0 barriers, 352 bytes cmem[0]
    """)
    k, g = rt.parse_ptxas_log(log, {"k": "_Z1kPf"})
    assert (k.name, k.registers, k.shared_bytes, k.stack_bytes) == ("k", 255, 4096, 24)
    assert (k.spill_store_bytes, k.spill_load_bytes, k.spills) == (8, 12, True)
    assert (g.name, g.registers, g.shared_bytes, g.spills) == ("_Z1gPf", 8, 0, False)


# --------------------------------------------------------------------------- argument checks (CPU part)


def test_tensor_parameter_rejects_cpu_tensor_naming_it():
    conv = rt._tensor_converter("k<float>", rt.Tensor("weights", (torch.float32,)), 0)
    with pytest.raises(ValueError, match=r"k<float>: argument 'weights' is on cpu"):
        conv(torch.ones(3))
    with pytest.raises(ValueError, match="'weights' must be a torch.Tensor"):
        conv([1.0])


def test_nullable_tensor_parameter_takes_none_as_null():
    conv = rt._tensor_converter("k", rt.Tensor("scale", (torch.float32,), nullable=True), 0)
    assert conv(None) == 0
    with pytest.raises(ValueError, match="'scale' is on cpu"):
        conv(torch.ones(1))
    strict = rt._tensor_converter("k", rt.Tensor("scale", (torch.float32,)), 0)
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        strict(None)


def test_scalar_parameter_range_and_type():
    conv = rt._scalar_converter("k", rt.Scalar("n", "i32"))
    assert conv(5).dtype.name == "int32"
    with pytest.raises(ValueError, match="'n' = 4294967296 does not fit in i32"):
        conv(2**32)
    with pytest.raises(ValueError, match="'n' must be an integer"):
        conv(1.5)
    assert rt._scalar_converter("k", rt.Scalar("alpha", "f32"))(2).dtype.name == "float32"
    with pytest.raises(ValueError):
        rt.Scalar("x", "i8")


def test_launch_config_limits():
    with pytest.raises(ValueError, match="more than 1024 threads"):
        rt._config_for((1,), (2048,), 0)
    with pytest.raises(ValueError, match="grid/block"):
        rt._config_for((0,), (32,), 0)


def test_debug_switch_reads_environment():
    code = "from tilewise.runtime import cuda as rt; print(rt.debug_sync())"
    for val, want in (("1", "True"), ("0", "False")):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "TILEWISE_DEBUG_SYNC": val})
        assert p.stdout.strip() == want, p.stderr


def test_driver_calls_bind_the_primary_context_once_on_invalid_context(monkeypatch):
    bound = []

    class Device:
        def __init__(self, i):
            self.i = i

        def set_current(self):
            bound.append(self.i)

    monkeypatch.setattr(rt, "_cuda_core", lambda: type("cc", (), {"Device": Device}))
    k = object.__new__(rt.Kernel)
    k.device_index = 3
    calls = []

    def query(a, b):
        calls.append((a, b))
        if len(calls) == 1:
            raise RuntimeError("CUDA_ERROR_INVALID_CONTEXT: invalid device context")
        return a + b

    assert k._in_context(query, 2, 5) == 7 and bound == [3] and len(calls) == 2

    def broken():
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    with pytest.raises(RuntimeError, match="INVALID_VALUE"):
        k._in_context(broken)
    assert bound == [3]  # other errors do not bind or retry


def test_ctype_names():
    assert rt.ctype(torch.bfloat16) == "__nv_bfloat16" and rt.ctype(torch.float16) == "__half"
    with pytest.raises(ValueError):
        rt.ctype(torch.complex64)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_kernel_call_errors_name_the_argument():
    m = rt.load(rt.OPS_DIR / "pointwise" / "vector_add.cu", ["vector_add_v1_naive<float>"])
    p = (rt.Tensor("a", (torch.float32,)), rt.Tensor("b", (torch.float32,)), rt.Tensor("out", (torch.float32,)),
         rt.Scalar("n", "i64"))
    k = m.kernel("vector_add_v1_naive<float>", p)
    a = torch.randn(64, device="cuda")
    out = torch.empty_like(a)
    with pytest.raises(ValueError, match="argument 'b' is on cpu"):
        k(1, 64, a, a.cpu(), out, 64)
    with pytest.raises(ValueError, match=r"argument 'b' has dtype torch.float16; expected float32"):
        k(1, 64, a, a.half(), out, 64)
    with pytest.raises(ValueError, match="argument 'out' is not contiguous"):
        k(1, 64, a, a, torch.empty(64, 2, device="cuda")[:, 0], 64)
    with pytest.raises(ValueError, match="expected 4 arguments"):
        k(1, 64, a, a, out)
    k(1, 64, a, a, out, 64)
    torch.testing.assert_close(out, a + a, rtol=0, atol=0)


@pytest.mark.gpu
def test_launches_follow_pytorch_current_stream():
    from tilewise.ops.pointwise import vector_add as va

    s = torch.cuda.Stream()
    a = torch.randn(1 << 22, device="cuda")
    b = torch.randn(1 << 22, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        # PyTorch work, then ours, then PyTorch again, all on s with no sync in between.
        x = a * 2
        y = va.vector_add(x, b)
        z = y * 3
    s.synchronize()
    torch.testing.assert_close(z, (a * 2 + b) * 3, rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    from tilewise.ops.pointwise import vector_add as va

    n = 100_003
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    d = torch.empty_like(a)
    va.vector_add(a, b, out=c)  # load the module before capture
    va.v1_naive(a, b, out=d)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            va.vector_add(a, b, out=c)     # v2
            va.v1_naive(c, b, out=d)       # reads what the first wrote
            va.vector_add(d, a, out=c)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        a.copy_(torch.randn(n, device="cuda"))
        b.copy_(torch.randn(n, device="cuda"))
        c.fill_(float("nan"))
        d.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want_d = (a + b) + b
        torch.testing.assert_close(d, want_d, rtol=0, atol=0)
        torch.testing.assert_close(c, want_d + a, rtol=0, atol=0)


_TRAP_CHILD = textwrap.dedent(r"""
    import sys, torch
    from tilewise.runtime import cuda as rt
    src = 'extern "C" __global__ void trap_kernel(float* x) { if (threadIdx.x == 0) asm volatile("trap;"); }'
    import pathlib, tempfile
    p = pathlib.Path(tempfile.mkdtemp()) / "trap.cu"
    p.write_text(src)
    k = rt.load(p, ["trap_kernel"]).kernel("trap_kernel", (rt.Tensor("x"),))
    x = torch.zeros(1, device="cuda")
    try:
        k(1, 32, x)
    except rt.KernelLaunchError as e:
        print("CAUGHT:", e)
        sys.exit(0)
    print("NOT CAUGHT")
    sys.exit(1)
""")


@pytest.mark.gpu
def test_debug_sync_names_the_failing_kernel():
    p = subprocess.run([sys.executable, "-c", _TRAP_CHILD], capture_output=True, text=True,
                       env={**os.environ, "TILEWISE_DEBUG_SYNC": "1"}, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "CAUGHT: kernel trap_kernel failed while running" in p.stdout


@pytest.mark.gpu
def test_module_loads_from_disk_cache_in_second_process(tmp_path):
    code = textwrap.dedent("""
        import torch
        from tilewise.ops.pointwise import vector_add as va
        a = torch.randn(1000, device="cuda")
        torch.testing.assert_close(va.vector_add(a, a), a + a)
        print(va._module(0).compiled.from_cache)
    """)
    env = {**os.environ, "TILEWISE_CACHE_DIR": str(tmp_path)}
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
            for _ in range(2)]
    for o in outs:
        assert o.returncode == 0, o.stderr
    assert [o.stdout.strip().splitlines()[-1] for o in outs] == ["False", "True"]


@pytest.mark.gpu
def test_gpu_launch_from_a_thread_without_a_current_context():
    """A new thread (as PyTorch's autograd device thread) may have no current CUDA context when
    our kernel is its first CUDA work: the launch binds the primary context and succeeds."""
    import threading

    from tilewise.ops.pointwise import vector_add as va

    a = torch.randn(1001, device="cuda")
    b = torch.randn(1001, device="cuda")
    out = torch.full_like(a, float("nan"))
    va.v1_naive(a, b, out)  # loaded (and its context made current) on the main thread
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    errors = []

    def work():
        try:
            va.v1_naive(a, b, out)
        except Exception as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    assert torch.equal(out, a + b)


def test_memory_spans_of_strided_views():
    from tilewise.ops._memory import may_overlap, span

    buf = torch.empty(10, 8)  # 4-byte elements
    base = buf.data_ptr()
    assert span(buf) == (base, base + 80 * 4 - 1)
    assert span(buf.t()) == span(buf)  # a transposed view covers the same bytes
    assert span(buf[:, 2]) == (base + 8, base + 8 + 9 * 32 + 3)
    assert may_overlap(buf[:5], buf[4:]) and not may_overlap(buf[:5], buf[5:])
    assert may_overlap(buf[:, :4], buf[:, 4:])  # interleaved columns: refused (conservative)
    assert not may_overlap(buf[:0], buf)
