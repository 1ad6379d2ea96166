"""Every environment variable tilewise reads, read here and nowhere else.

Each function reads the environment when it is called, so a value set after import counts (tests
set them with ``monkeypatch.setenv``); where a module keeps a value for the process (the debug
switch, Triton's launch paths), it says so and takes it from here once.

| variable | effect |
|---|---|
| ``TILEWISE_CACHE_DIR`` | the kernel and dataset cache (default ``$XDG_CACHE_HOME/tilewise``, ``~/.cache/tilewise``) |
| ``TILEWISE_BYTECODE_CACHE`` | ``auto`` (default), ``1``, ``0``: the CLI's bytecode in the cache (``_bytecode``) |
| ``TILEWISE_CUDA_INCLUDE`` | a folder with ``cuda_fp16.h`` for NVRTC, tried before ``CUDA_HOME`` / ``CUDA_PATH`` |
| ``TILEWISE_DEBUG_SYNC`` | ``1``: synchronize after every launch and name the kernel that failed (initial value) |
| ``TILEWISE_FAST_LAUNCH`` | ``0``: Triton kernels launch through Triton's own path, not tilewise's bound launcher |
| ``TILEWISE_DIRECT_LAUNCH`` | ``0``: the bound launcher calls Triton's launcher, not its raw C entry point |
| ``TILEWISE_SST2_DIR`` | the SST-2 folder (GLUE TSV files), tried before the default locations |
| ``TILEWISE_BENCH_ATTENTION_SHAPES`` | the attention bench's shapes (``bench.suites.attention``); ``none``: no grid |
| ``TILEWISE_BENCH_ATTENTION_DTYPES`` | the attention bench's dtypes, e.g. ``bfloat16,float16`` (default bfloat16) |
| ``TILEWISE_BENCH_ATTENTION_LEAN`` | ``1``: the attention bench's grid rows only (cuDNN, Flex, ``flash_attention``) |
| ``TILEWISE_BENCH_COLD_START_CASES`` | the cold_start bench's cases, comma-separated (``bench.suites.cold_start``) |
| ``TILEWISE_BENCH_LLAMA_CANDIDATES`` | the llama bench's candidates, comma-separated (``bench.suites.llama``) |
| ``TILEWISE_BENCH_LLAMA_PROFILE`` | ``1``: the llama bench logs each step by kernel group (``bench.suites.llama``) |
| ``TILEWISE_BENCH_LLAMA_PACKED`` | a document length: the llama bench packs its rows with it (``bench.suites.llama``) |
| ``TILEWISE_BENCH_LLAMA_PASSES`` | the llama bench's passes over its candidates (``bench.suites.llama``) |
| ``TILEWISE_BENCH_LLAMA_TOKENS`` | ``uniform`` (default) or ``zipf``: how the llama bench draws its token ids |
| ``TILEWISE_GIT_SHA`` | the commit a bench row records, where the tree has no ``.git`` |
| ``TILEWISE_FAST_EXIT`` | ``0``: ``tilewise train`` exits through the interpreter's teardown (``cli.run``) |
| ``CUDA_INJECTION64_PATH``, ``LD_PRELOAD`` | set (a profiler in the process): ``train`` exits through the teardown |
| ``TRITON_CACHE_DIR`` | Triton's kernel cache (Triton reads it; ``child_environment`` sets it for a child) |
| ``TRITON_INTERPRET`` | ``1``: Triton's interpreter runs the Triton kernels on CPU tensors (tests) |
| ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` | torchrun's process group (SST-2 training) |
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = "TILEWISE_CACHE_DIR"
BYTECODE_CACHE = "TILEWISE_BYTECODE_CACHE"
CUDA_INCLUDE = "TILEWISE_CUDA_INCLUDE"
DEBUG_SYNC = "TILEWISE_DEBUG_SYNC"
FAST_LAUNCH = "TILEWISE_FAST_LAUNCH"
DIRECT_LAUNCH = "TILEWISE_DIRECT_LAUNCH"
SST2_DIR = "TILEWISE_SST2_DIR"
BENCH_ATTENTION_SHAPES = "TILEWISE_BENCH_ATTENTION_SHAPES"
BENCH_ATTENTION_DTYPES = "TILEWISE_BENCH_ATTENTION_DTYPES"
BENCH_ATTENTION_LEAN = "TILEWISE_BENCH_ATTENTION_LEAN"
BENCH_COLD_START_CASES = "TILEWISE_BENCH_COLD_START_CASES"
BENCH_LLAMA_CANDIDATES = "TILEWISE_BENCH_LLAMA_CANDIDATES"
BENCH_LLAMA_PROFILE = "TILEWISE_BENCH_LLAMA_PROFILE"
BENCH_LLAMA_PACKED = "TILEWISE_BENCH_LLAMA_PACKED"
BENCH_LLAMA_PASSES = "TILEWISE_BENCH_LLAMA_PASSES"
BENCH_LLAMA_TOKENS = "TILEWISE_BENCH_LLAMA_TOKENS"
GIT_SHA = "TILEWISE_GIT_SHA"
FAST_EXIT = "TILEWISE_FAST_EXIT"


def _text(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None


def _switch(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() not in ("", "0", "false", "no", "off")


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    if _text(CACHE_DIR):
        return Path(os.environ[CACHE_DIR])
    base = _text("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilewise"


def bytecode_cache() -> str:
    """``auto``, ``on`` or ``off`` (a switch's spellings: 1 / true / yes / on, 0 / false / no / off)."""
    v = (_text(BYTECODE_CACHE) or "auto").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return "on"
    if v in ("0", "false", "no", "off"):
        return "off"
    if v != "auto":
        raise ValueError(f"{BYTECODE_CACHE} must be auto, 1 or 0, got {os.environ[BYTECODE_CACHE]!r}")
    return "auto"


def cuda_include_candidates() -> list[str]:
    """Folders to look for CUDA's headers in, from the environment, in order."""
    out = [_text(CUDA_INCLUDE)]
    out += [os.path.join(v, "include") for v in (_text("CUDA_HOME"), _text("CUDA_PATH")) if v]
    return [c for c in out if c]


def debug_sync() -> bool:
    return _switch(DEBUG_SYNC, False)


def fast_launch() -> bool:
    return _switch(FAST_LAUNCH, True)


def direct_launch() -> bool:
    return _switch(DIRECT_LAUNCH, True)


def triton_interpret() -> bool:
    # Triton's own reading of the variable (its knobs' true values), so both agree
    return (os.environ.get("TRITON_INTERPRET") or "0").strip().lower() in ("1", "true", "yes", "on", "y")


def sst2_dir() -> Path | None:
    v = _text(SST2_DIR)
    return Path(v) if v else None


def bench_attention_shapes() -> str | None:
    return _text(BENCH_ATTENTION_SHAPES)


def bench_attention_dtypes() -> str | None:
    return _text(BENCH_ATTENTION_DTYPES)


def bench_attention_lean() -> bool:
    return _switch(BENCH_ATTENTION_LEAN, False)


def bench_cold_start_cases() -> str | None:
    return _text(BENCH_COLD_START_CASES)


def bench_llama_candidates() -> str | None:
    return _text(BENCH_LLAMA_CANDIDATES)


def bench_llama_profile() -> bool:
    return _switch(BENCH_LLAMA_PROFILE, False)


def _positive_int(name: str, what: str) -> int | None:
    """The variable ``name`` as a positive integer, None when unset; ValueError naming it (and ``what`` it
    counts) for anything else."""
    text = _text(name)
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"{name}={text!r}: expected {what}, a positive integer")
    return n


def bench_llama_packed() -> int | None:
    """The document length the llama bench packs its rows with (``position_ids`` restarting every that
    many tokens), None when unset; ValueError naming the variable for anything but a positive integer."""
    return _positive_int(BENCH_LLAMA_PACKED, "a document length in tokens")


def bench_llama_passes(quick: bool) -> int:
    """The llama bench's passes over its candidates (``TILEWISE_BENCH_LLAMA_PASSES``; default 2 in full runs, 1 in
    quick ones); ValueError naming the variable for anything but a positive integer."""
    n = _positive_int(BENCH_LLAMA_PASSES, "a number of passes")
    return n if n is not None else (1 if quick else 2)


def bench_llama_tokens() -> str:
    """How the llama bench draws its token ids: ``uniform`` (default) or ``zipf`` (a word-frequency law, as
    text has); ValueError naming the variable for anything else."""
    v = (_text(BENCH_LLAMA_TOKENS) or "uniform").strip().lower()
    if v not in ("uniform", "zipf"):
        raise ValueError(f"{BENCH_LLAMA_TOKENS} must be uniform or zipf, got {os.environ[BENCH_LLAMA_TOKENS]!r}")
    return v


def triton_cache_override() -> str | None:
    """TRITON_CACHE_DIR where set (Triton's own default otherwise; read without importing Triton)."""
    return _text("TRITON_CACHE_DIR")


def git_sha() -> str | None:
    return _text(GIT_SHA)


def fast_exit() -> bool:
    """Whether a finished ``tilewise train`` may end with ``os._exit`` (``cli.run``): not when
    TILEWISE_FAST_EXIT is off, nor when a tool rides in the process and flushes its data at exit (Nsight
    Systems' and Nsight Compute's CUDA injection, anything preloaded)."""
    return _switch(FAST_EXIT, True) and not _text("CUDA_INJECTION64_PATH") and not _text("LD_PRELOAD")


def distributed() -> tuple[int, int, int]:
    """(world size, rank, local rank) as torchrun sets them; (1, 0, 0) in a plain process."""
    return (int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
            int(os.environ.get("LOCAL_RANK", "0")))


def child_environment(cache_dir: Path | str | None = None, triton_cache_dir: Path | str | None = None,
                      **extra: str) -> dict[str, str]:
    """The environment for a child Python process that imports this tilewise: a copy of this one's,
    with the package's folder first on ``PYTHONPATH`` (a source checkout need not be installed), the
    kernel cache and Triton's cache moved where asked (warmup workers, cold-start timing), and the
    ``extra`` variables set."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    env["PYTHONPATH"] = os.pathsep.join([src, *path])
    if cache_dir is not None:
        env[CACHE_DIR] = str(cache_dir)
    if triton_cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(triton_cache_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env
