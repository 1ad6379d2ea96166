"""Compare the sm_90 SASS of the CUDA C kernels of two source trees, kernel by kernel (no GPU needed).

    python scripts/sass_compare.py OLD_SRC NEW_SRC [FILE.cu ...]

Each tree's .cu files (or the ones named, relative to ops/) are compiled with this machine's NVRTC
for sm_90 with their declared instantiations; cuobjdump (Triton's) prints the SASS, whose
addresses and comments are dropped before comparing. A refactor that should not change the code
(a device function pulled out, a template parameter instead of a copy) prints "same" for every
kernel. Exit status 1 if any kernel differs or is missing from one side. A check to run beside
the GPU tests, not instead of them.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def _sass(src_root: Path, rel: str) -> dict[str, str]:
    code = (
        "import sys; from pathlib import Path; from tilewise.runtime import cuda as c; "
        f"p = Path({str(src_root / 'tilewise' / 'ops' / rel)!r}); "
        "m = c.compile_source(p.read_text(), name=str(p), arch='sm_90', name_expressions=c.name_expressions_for(p)); "
        "sys.stdout.buffer.write(m.cubin)"
    )
    env = dict(os.environ, PYTHONPATH=str(src_root), TILEWISE_CACHE_DIR=tempfile.mkdtemp())
    cubin = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=True).stdout
    import triton

    cuobj = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        text = subprocess.run([str(cuobj), "-sass", str(f)], capture_output=True, text=True, check=True).stdout
    out, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out[name] = "\n".join(body)
            name, body = m.group(1), []
        elif name:
            ins = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line.split(";")[0]).strip()
            if ins:
                body.append(ins)
    if name:
        out[name] = "\n".join(body)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    old, new = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    files = argv[2:] or sorted(str(p.relative_to(new / "tilewise" / "ops"))
                               for p in (new / "tilewise" / "ops").rglob("*.cu"))
    bad = 0
    for rel in files:
        a, b = _sass(old, rel), _sass(new, rel)
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                tag = "MISSING"
            else:
                tag = "same   " if a[k] == b[k] else "DIFFERS"
            bad += tag != "same   "
            h = hashlib.sha256(b.get(k, "").encode()).hexdigest()[:10]
            print(f"{tag} {rel} {k} ({len(b.get(k, '').splitlines())} instructions, {h})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
