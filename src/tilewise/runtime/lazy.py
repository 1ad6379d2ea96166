"""CUDA C modules compiled one kernel at a time, on first use (``load_lazy``).

A .cu file with many template instantiations takes NVRTC seconds as one program; a first call that
launches a few of its kernels should pay for those few. ``LazyModule.kernel(name, params)`` compiles
``name`` alone (disk-cached like any compile) unless the whole module is already in the disk cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from .cuda import (_DEFAULT_OPTIONS, OPS_DIR, Kernel, Module, Scalar, Tensor, _cache_key, cache_dir, current_arch,
                   load, source_arch)


def is_cached(path: str | os.PathLike, name_expressions: Iterable[str], options: Sequence[str] = _DEFAULT_OPTIONS,
              arch: str | None = None) -> bool:
    """Whether ``compile_file(path, name_expressions=..., options=..., arch=...)`` would be a disk-cache
    hit (nothing is compiled or read beyond the source)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = OPS_DIR / p
    source = p.read_text()
    arch = source_arch(source, arch or current_arch(), str(p))
    key = _cache_key(source, str(p), tuple(options), arch, tuple(name_expressions))
    d = cache_dir()
    return (d / f"{key}.cubin").is_file() and (d / f"{key}.json").is_file()


class LazyModule:
    """A .cu file's kernels, each compiled alone (NVRTC, disk-cached) and loaded on its first use.

    A first call then pays for the kernels it launches, ~0.1 s each, not for every instantiation
    the file declares: NVRTC's time grows with the instantiations (on the CI host elementwise.cu's 73
    for fp32 take 4.3 s, one of them 0.1-0.15 s; cluster.cu's 77 take 12.9 s). Where the whole
    module is in the disk cache (``compile_all``, which ``tilewise warmup`` runs) it is loaded instead,
    once. ``names``: the kernels it may give, in the whole module's order (a name outside them is a
    ``KeyError``, as a module's missing symbol)."""

    def __init__(self, path: str | os.PathLike, names: Iterable[str], options: Sequence[str], device_index: int,
                 arch: str):
        self.path, self.names = path, tuple(dict.fromkeys(names))
        self.options, self.device_index, self.arch = tuple(options), device_index, arch
        self._whole: Module | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def compile_all(self) -> Module:
        """Every kernel as one module (one NVRTC run, cached): what ``kernel`` then loads from."""
        self._whole = load(self.path, self.names, self.options, self.device_index)
        return self._whole

    def kernel(self, name: str, params: Sequence[Tensor | Scalar]) -> Kernel:
        if name not in self.names:
            raise KeyError(f"{os.path.basename(str(self.path))} has no kernel {name!r} in this module")
        if self._whole is None and is_cached(self.path, self.names, self.options, self.arch):
            self._whole = load(self.path, self.names, self.options, self.device_index)
        mod = self._whole or load(self.path, (name,), self.options, self.device_index)
        return mod.kernel(name, params)


def load_lazy(path: str | os.PathLike, names: Iterable[str], options: Sequence[str] = _DEFAULT_OPTIONS,
              device_index: int | None = None) -> LazyModule:
    """``names`` of a .cu file as a ``LazyModule`` on a CUDA device (default: the current one)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("tilewise CUDA kernels need a CUDA GPU; none is available")
    if device_index is None:
        device_index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device_index)
    return LazyModule(path, names, options, device_index, f"sm_{major}{minor}")
