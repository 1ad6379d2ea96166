"""Question: does this machine's Python keep bytecode caches for site-packages, and what do imports
cost without them?

`research/prewarm_task_profile.py` (bench/results/logs/prewarm-task-profile-1a91d8e.log) saw a warm
task spend 2.9 s in `compile` (Python source to bytecode) importing sympy, the second time on the
same H200 machine: a run that finds no usable .pyc compiles every module it imports. Here, for torch
and sympy: whether a .pyc sits where the interpreter looks, whether it may write one
(sys.dont_write_bytecode, the folder's permissions), then `import torch` (and sympy, which autograd
and torch.optim import on first use) timed in fresh child processes: as the machine is, then with
PYTHONPYCACHEPREFIX on an empty folder twice, writing allowed (the first run writes the caches, the
second reads them). On the CPU host (Python 3.11, PYTHONDONTWRITEBYTECODE=1, site-packages with its
.pyc): torch 1.09 s and sympy 0.18 s as is, 3.07 s and 1.76 s with no usable .pyc.

    python3 research/import_bytecode_probe.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import importlib.util, json, os, sys, time
t = time.perf_counter(); import torch; t_torch = time.perf_counter() - t
t = time.perf_counter(); import sympy; t_sympy = time.perf_counter() - t
out = {"import torch s": round(t_torch, 2), "import sympy s": round(t_sympy, 2),
       "dont_write_bytecode": sys.dont_write_bytecode, "pycache_prefix": sys.pycache_prefix}
for mod in (torch, sympy):
    src = mod.__file__
    pyc = importlib.util.cache_from_source(src)
    out[mod.__name__] = {"pyc": pyc, "pyc exists": os.path.exists(pyc),
                         "folder writable": os.access(os.path.dirname(src), os.W_OK)}
print(json.dumps(out))
"""


def run(env_extra: dict, write: bool = False) -> dict:
    env = dict(os.environ, **env_extra)
    if write:  # let the child write its caches (the variable would stop it)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    if p.returncode:
        return {"error": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    print(f"python {sys.version.split()[0]} at {sys.executable}; PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE')!r}")
    print("as is, 1:", json.dumps(run({})))
    print("as is, 2:", json.dumps(run({})))
    with tempfile.TemporaryDirectory() as d:
        print("prefix, empty:", json.dumps(run({"PYTHONPYCACHEPREFIX": d}, write=True)))
        print("prefix, filled:", json.dumps(run({"PYTHONPYCACHEPREFIX": d}, write=True)))


if __name__ == "__main__":
    main()
