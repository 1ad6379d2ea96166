"""What the GPU in hand is and what it can do: properties, and ceilings measured on it.

Ceilings (cached per device name, driver and PyTorch version under the tilewise cache dir):
    copy bandwidth: a device-to-device copy of 2 GiB, read + write bytes counted;
    peak FLOP/s:    large cuBLAS GEMMs through PyTorch on random data, per dtype:
                    fp32 (TF32 off), tf32, fp16, bf16 (8192^3), fp8 e4m3 (``torch._scaled_mm``).
The ridge point of a dtype is peak / bandwidth (FLOP per byte): below it an op is memory-bound.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._files import write_atomic
from .cuda import cache_dir

CEILING_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
_CEILINGS_FORMAT = 1


@dataclass
class DeviceInfo:
    index: int
    name: str
    compute_capability: str
    sms: int
    max_threads_per_sm: int
    regs_per_sm: int
    smem_per_sm_kib: float
    smem_per_block_optin_kib: float
    l2_mib: float
    memory_gib: float
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    bus_width_bits: int | None
    driver: str
    torch: str

    @property
    def theoretical_bandwidth_gbps(self) -> float | None:
        """Datasheet-style bandwidth: 2 transfers per memory clock x bus width (DDR)."""
        if not self.mem_clock_mhz or not self.bus_width_bits:
            return None
        return 2 * self.mem_clock_mhz * 1e6 * self.bus_width_bits / 8 / 1e9

    @property
    def slug(self) -> str:
        """File-name form of the device name: ``NVIDIA H200`` -> ``NVIDIA_H200``."""
        return "".join(c if c.isalnum() or c in "-." else "_" for c in self.name).strip("_")


@dataclass
class Ceilings:
    device: str
    driver: str
    torch: str
    copy_gbps: float
    peak_tflops: dict[str, float] = field(default_factory=dict)
    measured_at: str = ""

    def ridge(self, dtype: str) -> float:
        """FLOP per byte at which compute and bandwidth limits meet."""
        return self.peak_tflops[dtype] * 1e12 / (self.copy_gbps * 1e9)

    def attainable_tflops(self, intensity: float, dtype: str) -> float:
        return min(self.peak_tflops[dtype], intensity * self.copy_gbps * 1e9 / 1e12)


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _driver_version() -> str:
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        if int(err) == 0:
            return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return "unknown"


def device_info(index: int | None = None) -> DeviceInfo:
    import torch

    if index is None:
        index = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index)
    sm_clock = mem_clock = bus = None
    try:
        from .cuda import _cuda_core

        cp = _cuda_core().Device(index).properties
        sm_clock = cp.clock_rate / 1e3  # kHz -> MHz
        mem_clock = cp.memory_clock_rate / 1e3
        bus = int(cp.global_memory_bus_width)
    except Exception:
        pass
    return DeviceInfo(
        index=index, name=p.name, compute_capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
        max_threads_per_sm=p.max_threads_per_multi_processor,
        regs_per_sm=getattr(p, "regs_per_multiprocessor", 0),
        smem_per_sm_kib=getattr(p, "shared_memory_per_multiprocessor", 0) / 1024,
        smem_per_block_optin_kib=getattr(p, "shared_memory_per_block_optin", 0) / 1024,
        l2_mib=getattr(p, "L2_cache_size", 0) / 2**20, memory_gib=p.total_memory / 2**30,
        sm_clock_mhz=sm_clock, mem_clock_mhz=mem_clock, bus_width_bits=bus,
        driver=_driver_version(), torch=torch.__version__,
    )


def _ceilings_path(info: DeviceInfo) -> Path:
    tag = f"{info.slug}-driver{info.driver}-torch{info.torch.split('+')[0]}-v{_CEILINGS_FORMAT}"
    return cache_dir() / "ceilings" / f"{tag}.json"


def measure_copy_gbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written over the median time."""
    import torch
    from triton.testing import do_bench

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_gemm_tflops(dtype: str, n: int = 8192) -> float:
    """Median TFLOP/s of an n^3 cuBLAS GEMM (through PyTorch) on random normal inputs."""
    import torch
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(0)
    flops = 2 * n**3
    if dtype == "fp8":
        a = torch.randn(n, n, device="cuda", generator=g).to(torch.float8_e4m3fn)
        bt = torch.randn(n, n, device="cuda", generator=g).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        fn = lambda: torch._scaled_mm(a, bt.t(), one, one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        tdt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        a = torch.randn(n, n, device="cuda", dtype=tdt, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=tdt, generator=g)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        ms = do_bench(fn, warmup=100, rep=400, return_mode="median")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return flops / (ms * 1e-3) / 1e12


def ceilings(remeasure: bool = False, progress=None) -> Ceilings:
    """Measured ceilings of the current GPU, from the cache unless ``remeasure``."""
    info = device_info()
    path = _ceilings_path(info)
    if not remeasure and path.is_file():
        try:
            return Ceilings(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass
    steps = ["copy", *CEILING_DTYPES]
    results: dict[str, float] = {}
    for s in steps:
        if progress:
            progress(s)
        results[s] = measure_copy_gbps() if s == "copy" else measure_gemm_tflops(s)
    c = Ceilings(device=info.name, driver=info.driver, torch=info.torch, copy_gbps=results["copy"],
                 peak_tflops={d: results[d] for d in CEILING_DTYPES},
                 measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        write_atomic(path, json.dumps(asdict(c), indent=1).encode())
    except OSError:
        pass
    return c


def save_ceilings(c: Ceilings, path: str | os.PathLike) -> None:
    write_atomic(Path(path), json.dumps(asdict(c), indent=1).encode())


def load_ceilings(path: str | os.PathLike) -> Ceilings:
    return Ceilings(**json.loads(Path(path).read_text()))
