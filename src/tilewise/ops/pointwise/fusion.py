"""fusion: ``tilewise.fuse(fn)`` turns an elementwise Python function of tensors into one CUDA C kernel.

``fn`` is traced once per arity with placeholder objects: tilewise's elementwise ops (``sin``,
``relu``, ``add``... from ``tilewise.ops.pointwise.elementwise``), the operators ``+ - * / ** -x`` and Python
numbers build an expression DAG (identical subexpressions are shared). From it one CUDA C source is
generated, each node one fp32 line through the functors of ``include/elementwise_ops.cuh``
(``fused_expr<MODE>``, MODE the trig mode of ``FuseConfig``: sinf+cosf / one sincosf / intrinsics),
with four kernel templates:
    strided:    one thread per output, every input read through its strides with broadcasting
                (``include/strided.cuh``: stride 0 on broadcast dims). bound: copy bandwidth when the
                reads coalesce.
    contiguous: inputs contiguous, one shape, 16-byte aligned: 16-byte loads and stores in a
                grid-stride loop with streaming hints (kept for comparison; blocked is the default).
    blocked:    the same inputs as contiguous, elementwise v4_blocked's scheme: block k owns NT x
                UNROLL consecutive 16-byte vectors, plain loads, all before the first use.
                bound: copy bandwidth ((k inputs + 1) x n x itemsize).
    rows:       layouts that collapse to 2 dims (R, C) in which every input walks a row with stride
                1 (16-byte loads) or 0 (a scalar per row): a bias row or column, a scalar, padded
                rows; a row-broadcast input loaded once per ROWS rows. bound: copy bandwidth.
A call picks blocked, else rows, else strided (``FusedFunction.plan``); ``configs.FuseConfig`` /
``configs.FUSE_DEFAULT`` hold the knobs (research/elementwise_variants.py sweeps them).
The source depends on (expression, dtype) only; the broadcast pattern is data (the layout array),
so one compiled module per (expression, dtype, config) serves every pattern and NVRTC runs once for it
(then the disk cache answers). Intermediates stay in registers: ``sin(x)**2 + cos(x)**2`` reads x
once and writes once (8 bytes per fp32 element), where eager PyTorch runs five kernels that read
7 and write 5 tensors (48 bytes per element).

No autograd through fused functions (use the differentiable ops unfused for training).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from pathlib import Path
from typing import NamedTuple

import torch

from ..._files import write_atomic
from ...cost import Cost
from ...runtime import cuda as rt
from .configs import FUSE_DEFAULT, TRIG_MODES, FuseConfig
from .layout import (blocked_grid, broadcast_shape, check_inputs, contiguous_ok, layout_2d, layout_tensor, out_tensor,
                     rows_grid, rows_layout, rows_ok, strided_words)
from .ops_table import MAP_OPS, ZIP_OPS

_THREADS = 256


# --------------------------------------------------------------------------- tracing


class Node:
    """One value of the expression: an input, a constant, or an op of earlier nodes."""

    __slots__ = ("op", "args", "value", "index", "key")

    def __init__(self, op: str, args: tuple = (), value: float | None = None, index: int | None = None):
        self.op, self.args, self.value, self.index = op, args, value, index
        self.key = (op, tuple(a.key for a in args), value, index)

    def __repr__(self) -> str:
        if self.op == "input":
            return f"x{self.index}"
        if self.op == "const":
            return repr(self.value)
        return f"{self.op}({', '.join(map(repr, self.args))})"


class Graph:
    def __init__(self):
        self.nodes: list[Node] = []
        self._seen: dict[tuple, Node] = {}

    def add(self, node: Node) -> Node:
        got = self._seen.get(node.key)
        if got is None:
            self._seen[node.key] = got = node
            self.nodes.append(node)
        return got


def _operator(op: str):
    """A binary operator's method and its reflected one (``2 * x`` calls x.__rmul__): both trace
    ``op``, with the operands in the order they were written."""

    def forward(self, o):
        return _binary_trace(op, self, o)

    def reflected(self, o):
        return _binary_trace(op, o, self)

    return forward, reflected


class Tracer:
    """A placeholder tensor during tracing; supports tilewise's elementwise ops and operators."""

    _tw_trace = True
    __array_priority__ = 1000

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node

    def _unary(self, op: str) -> "Tracer":
        return Tracer(self.graph, self.graph.add(Node(op, (self.node,))))

    def _binary(self, op: str, a, b) -> "Tracer":  # elementwise's binary ops hand a traced call here
        return _binary_trace(op, a, b)

    def __neg__(self):
        return self._unary("neg")

    __add__, __radd__ = _operator("add")
    __sub__, __rsub__ = _operator("sub")
    __mul__, __rmul__ = _operator("mul")
    __truediv__, __rtruediv__ = _operator("div")
    __pow__, __rpow__ = _operator("pow")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise ValueError(f"tilewise.fuse: {getattr(func, '__name__', func)} is a PyTorch function; inside a "
                         f"fused function use tilewise's ops (tilewise.ops.pointwise.elementwise: "
                         f"{', '.join(MAP_OPS)}, {', '.join(ZIP_OPS)}) and + - * / **")

    def _compare(self, other):
        raise ValueError("tilewise.fuse: comparisons cannot be fused (no boolean tensors in a fused "
                         "expression); use maximum or relu")

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __bool__(self):
        raise ValueError("tilewise.fuse: a traced value has no truth value (data-dependent Python control "
                         "flow cannot be fused; use maximum/relu instead)")


def _lift(graph: Graph, v) -> Node:
    if isinstance(v, Tracer):
        if v.graph is not graph:
            raise ValueError("tilewise.fuse: values from two different traces were mixed")
        return v.node
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return graph.add(Node("const", value=float(v)))
    raise ValueError(f"tilewise.fuse: cannot use a {type(v).__name__} inside a fused function; only the "
                     f"function's tensor arguments and Python numbers")


def _binary_trace(op: str, a, b) -> Tracer:
    graph = a.graph if isinstance(a, Tracer) else b.graph
    return Tracer(graph, graph.add(Node(op, (_lift(graph, a), _lift(graph, b)))))


def trace(fn, arity: int) -> tuple[Graph, Node]:
    """Run ``fn`` on ``arity`` placeholders; return the graph and its output node."""
    g = Graph()
    xs = [Tracer(g, g.add(Node("input", index=i))) for i in range(arity)]
    out = fn(*xs)
    if not isinstance(out, Tracer):
        raise ValueError(f"tilewise.fuse: the function must return one traced tensor built from its "
                         f"arguments, got {type(out).__name__}")
    return g, out.node


def _live(graph: Graph, out: Node) -> list[Node]:
    """Nodes the output depends on, in graph (topological) order."""
    need, stack = set(), [out]
    while stack:
        n = stack.pop()
        if id(n) in need:
            continue
        need.add(id(n))
        stack.extend(n.args)
    return [n for n in graph.nodes if id(n) in need]


# --------------------------------------------------------------------------- code generation

KINDS = ("strided", "contiguous", "blocked", "rows")


def _float_literal(v: float) -> str:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    return f"__int_as_float(0x{bits:08x})"  # exact, whatever the decimal printing would round to


def _expr_lines(nodes: list[Node], arity: int, mode: int = 0) -> tuple[list[str], str]:
    names: dict[int, str] = {}
    lines: list[str] = []
    live = {n.key: n for n in nodes}
    done: set[int] = set()  # sin/cos nodes already computed by a sincosf
    for i, n in enumerate(nodes):
        if n.op == "input":
            names[id(n)] = f"v{n.index}"
            continue
        name = f"t{i}"
        if id(n) in done:
            continue
        if n.op in ("sin", "cos") and mode in (1, 2):
            a = names[id(n.args[0])]
            twin = live.get(("cos" if n.op == "sin" else "sin", (n.args[0].key,), None, None))
            if twin is not None:
                tname = f"t{nodes.index(twin)}"
                s_name, c_name = (name, tname) if n.op == "sin" else (tname, name)
                fn = "__sincosf" if mode == 2 else "sincosf"
                lines.append(f"  float {s_name}, {c_name};")
                lines.append(f"  {fn}({a}, &{s_name}, &{c_name});")
                names[id(n)], names[id(twin)] = name, tname
                done.add(id(twin))
                continue
            if mode == 2:
                lines.append(f"  const float {name} = {'__sinf' if n.op == 'sin' else '__cosf'}({a});")
                names[id(n)] = name
                continue
        if n.op == "const":
            rhs = _float_literal(n.value)
        elif n.op in MAP_OPS:
            rhs = f"ew::{MAP_OPS[n.op][0]}()({names[id(n.args[0])]})"
        elif n.op == "pow" and n.args[1].op == "const" and n.args[1].value == 2.0:
            a = names[id(n.args[0])]
            rhs = f"{a} * {a}"  # exact, as torch.pow(x, 2)
        elif n.op in ZIP_OPS:
            rhs = f"ew::{ZIP_OPS[n.op][0]}()({names[id(n.args[0])]}, {names[id(n.args[1])]})"
        else:
            raise ValueError(f"tilewise.fuse: no code for op {n.op!r}")
        lines.append(f"  const float {name} = {rhs};")
        names[id(n)] = name
    return lines, names[id(nodes[-1])]


class FusedSource(NamedTuple):
    """A generated source and its kernels' template names (``kernel_name`` adds the arguments)."""

    src: str
    strided: str
    contiguous: str
    blocked: str
    rows: str


def kernel_name(source: FusedSource, kind: str, config: FuseConfig) -> str:
    """The name expression of one generated kernel for ``config``."""
    mode = TRIG_MODES[config.trig]
    base = getattr(source, kind)
    if kind == "blocked":
        return f"{base}<{mode},{config.unroll},{config.threads},{config.minb}>"
    if kind == "rows":
        return f"{base}<{mode},{config.rows},{config.rows_threads}>"
    return f"{base}<{mode}>"


def generate_source(graph: Graph, out: Node, arity: int, dtype: torch.dtype) -> FusedSource:
    """One CUDA C source for one expression and dtype, with four kernel templates (each over the
    trig MODE; blocked and rows also over their FuseConfig knobs):
      strided:    a thread per output, every input through its strides (strided.cuh);
      contiguous: same-shape contiguous inputs, 16-byte vectors in a grid-stride loop;
      blocked:    same-shape contiguous inputs, block k owns NT x UNROLL consecutive 16-byte vectors,
                  each thread UNROLL of them NT apart, loads before the first use (elementwise
                  v4_blocked's scheme);
      rows:       2-D layouts whose inputs walk rows with stride 1 (16-byte loads) or 0 (a scalar
                  per row, splat); a row-broadcast input loaded once per ROWS rows (zip v5_rows)."""
    nodes = _live(graph, out)
    ct = rt.ctype(dtype)
    expr = repr(out)
    tag = hashlib.sha256(f"{expr}|{arity}|{ct}".encode()).hexdigest()[:16]
    names = FusedSource("", f"fused_strided_{tag}", f"fused_contiguous_{tag}", f"fused_blocked_{tag}",
                        f"fused_rows_{tag}")
    params = ", ".join(f"float v{i}" for i in range(arity))
    exprs = []
    for mode in (0, 1, 2):
        lines, result = _expr_lines(nodes, arity, mode)
        exprs.append(f"""template <>
__device__ __forceinline__ float fused_expr<{mode}>({params}) {{
{chr(10).join(lines)}
  return {result};
}}""")
    ins = ", ".join(f"const T* __restrict__ in{i}" for i in range(arity))
    K = range(arity)
    call = lambda fmt: ", ".join(fmt.format(k=k) for k in K)  # noqa: E731
    # Register budget: 16-byte vectors in flight are arity x batch x 4 registers.
    batch = 8 if arity == 1 else 4
    rows_params = ", ".join(f"long long sr{k}, long long sc{k}" for k in K)
    src = f"""// generated by tilewise.fuse: {expr} ({ct})
#include "tilewise_common.cuh"
#include "strided.cuh"
#include "elementwise_ops.cuh"

using T = {ct};
using V = tw::Vec16<T>;

template <int MODE>
__device__ __forceinline__ float fused_expr({params});
{chr(10).join(exprs)}

template <int MODE>
__global__ void __launch_bounds__(256) {names.strided}({ins}, T* __restrict__ out,
                                                       const long long* __restrict__ meta) {{
  __shared__ tw::StridedLayout<{arity}> s;
  tw::load_layout(s, meta);
  const long long i = tw::global_thread_id();
  if (i >= s.n) return;
  long long off[{arity}];
  tw::broadcast_offsets(s, i, off);
  out[i] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(in{k}[off[{k}]])")}));
}}

template <int MODE>
__global__ void __launch_bounds__(256) {names.contiguous}({ins}, T* __restrict__ out, long long n) {{
  constexpr int UNROLL = {max(1, 4 // arity)};
  const long long nvec = n / V::N;
  const long long stride = tw::grid_threads();
  long long i = tw::global_thread_id();
  for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {{
    V x[{arity}][UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
{chr(10).join(f"      x[{k}][u].raw = __ldcs(reinterpret_cast<const uint4*>(in{k}) + i + u * stride);" for k in K)}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
#pragma unroll
      for (int e = 0; e < V::N; ++e)
        x[0][u].v[e] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(x[{k}][u].v[e])")}));
      __stcs(reinterpret_cast<uint4*>(out) + i + u * stride, x[0][u].raw);
    }}
  }}
  for (; i < nvec; i += stride) {{
    V x[{arity}];
{chr(10).join(f"    x[{k}].raw = __ldcs(reinterpret_cast<const uint4*>(in{k}) + i);" for k in K)}
#pragma unroll
    for (int e = 0; e < V::N; ++e)
      x[0].v[e] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(x[{k}].v[e])")}));
    __stcs(reinterpret_cast<uint4*>(out) + i, x[0].raw);
  }}
  for (long long j = nvec * V::N + tw::global_thread_id(); j < n; j += stride)
    out[j] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(in{k}[j])")}));
}}

// Every block but the last owns NT x UNROLL whole vectors ("full": no bounds checks); the last
// also does the n % V::N scalar tail.
template <int MODE, int UNROLL, int NT, int MINB>
__global__ void __launch_bounds__(NT, MINB) {names.blocked}({ins}, T* __restrict__ out, long long n) {{
  constexpr int BATCH = UNROLL < {batch} ? UNROLL : {batch};
  static_assert(UNROLL % BATCH == 0, "UNROLL must be a multiple of the batch");
  const long long nvec = n / V::N;
  const long long first = static_cast<long long>(blockIdx.x) * NT * UNROLL;
  const long long base = first + threadIdx.x;
  const bool full = first + UNROLL * NT <= nvec;
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
#pragma unroll
  for (int u0 = 0; u0 < UNROLL; u0 += BATCH) {{
    V x[{arity}][BATCH];
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {{
      const long long j = base + (u0 + u) * NT;
      if (full || j < nvec) {{
{chr(10).join(f"        x[{k}][u].raw = reinterpret_cast<const uint4*>(in{k})[j];" for k in K)}
      }}
    }}
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {{
      const long long j = base + (u0 + u) * NT;
      if (full || j < nvec) {{
        V r;
#pragma unroll
        for (int e = 0; e < V::N; ++e)
          r.v[e] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(x[{k}][u].v[e])")}));
        o4[j] = r.raw;
      }}
    }}
  }}
  if (blockIdx.x == gridDim.x - 1)
    for (long long j = nvec * V::N + threadIdx.x; j < n; j += NT)
      out[j] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(in{k}[j])")}));
}}

// One operand's ROWS vectors for rows r0, r0 + dy, ...: row stride 0 -> one load reused; column
// stride 1 -> 16-byte loads; column stride 0 -> one scalar per row, splat.
template <int ROWS>
__device__ __forceinline__ void fused_load_rows(V (&v)[ROWS], const T* __restrict__ p, long long r0, int dy,
                                                long long R, bool full, long long cv, long long sr, long long sc) {{
  if (sr == 0) {{
    if (sc != 0) v[0].raw = reinterpret_cast<const uint4*>(p)[cv];
    else {{
      const T s = p[0];
#pragma unroll
      for (int k = 0; k < V::N; ++k) v[0].v[k] = s;
    }}
#pragma unroll
    for (int u = 1; u < ROWS; ++u) v[u].raw = v[0].raw;
  }} else if (sc != 0) {{
#pragma unroll
    for (int u = 0; u < ROWS; ++u) {{
      const long long r = r0 + static_cast<long long>(u) * dy;
      if (full || r < R) v[u].raw = reinterpret_cast<const uint4*>(p + r * sr)[cv];
    }}
  }} else {{
#pragma unroll
    for (int u = 0; u < ROWS; ++u) {{
      const long long r = r0 + static_cast<long long>(u) * dy;
      if (full || r < R) {{
        const T s = p[r * sr];
#pragma unroll
        for (int k = 0; k < V::N; ++k) v[u].v[k] = s;
      }}
    }}
  }}
}}

// Block (TX, TY), TX x TY = NT: thread x one 16-byte column vector, thread y a row, ROWS rows TY
// apart per thread; the block index splits into (column block, row block) once per thread.
template <int MODE, int ROWS, int NT>
__global__ void __launch_bounds__(NT) {names.rows}({ins}, T* __restrict__ out, long long R, long long C,
                                                   {rows_params}) {{
  const long long CV = C / V::N;  // the host checks C % V::N == 0
  const unsigned gx = static_cast<unsigned>((CV + blockDim.x - 1) / blockDim.x);
  const unsigned bx = blockIdx.x % gx, by = blockIdx.x / gx;
  const long long cv = static_cast<long long>(bx) * blockDim.x + threadIdx.x;
  if (cv >= CV) return;
  const long long rows_per_block = static_cast<long long>(blockDim.y) * ROWS;
  const long long r0 = by * rows_per_block + threadIdx.y;
  const bool full = (by + 1) * rows_per_block <= R;
  const int dy = blockDim.y;
  V x[{arity}][ROWS];
{chr(10).join(f"  fused_load_rows<ROWS>(x[{k}], in{k}, r0, dy, R, full, cv, sr{k}, sc{k});" for k in K)}
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
#pragma unroll
  for (int u = 0; u < ROWS; ++u) {{
    const long long r = r0 + static_cast<long long>(u) * dy;
    if (full || r < R) {{
      V o;
#pragma unroll
      for (int e = 0; e < V::N; ++e)
        o.v[e] = tw::from_float<T>(fused_expr<MODE>({call("tw::to_float(x[{k}][u].v[e])")}));
      o4[r * CV + cv] = o.raw;
    }}
  }}
}}
"""
    return names._replace(src=src)


# --------------------------------------------------------------------------- evaluation


def evaluate_reference(graph: Graph, out: Node, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The expression with PyTorch ops, one kernel per node (what eager PyTorch would run)."""
    vals: dict[int, torch.Tensor | float] = {}
    for n in _live(graph, out):
        if n.op == "input":
            v = inputs[n.index]
        elif n.op == "const":
            v = n.value
        elif n.op in MAP_OPS:
            v = MAP_OPS[n.op][1](vals[id(n.args[0])])
        else:
            a, b = (vals[id(x)] for x in n.args)
            if n.op == "relu_backward" or n.op == "max":
                like = a if isinstance(a, torch.Tensor) else b
                a = a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=like.dtype, device=like.device)
                b = b if isinstance(b, torch.Tensor) else torch.full((), b, dtype=like.dtype, device=like.device)
            v = ZIP_OPS[n.op][1](a, b)
        vals[id(n)] = v
    return vals[id(out)]


class FusedFunction:
    """What ``fuse(fn)`` returns: call it with tensors (CUDA: one generated kernel; CPU: the
    PyTorch reference, node by node)."""

    def __init__(self, fn, config: FuseConfig | None = None):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.config = config  # None: FUSE_DEFAULT at call time
        self._traces: dict[int, tuple[Graph, Node]] = {}
        self._kernels: dict[tuple, rt.Kernel] = {}
        self._modules: dict[tuple, tuple[Path, FusedSource]] = {}
        self._waves: dict[tuple, int] = {}
        self.compiles = 0  # how many distinct modules this function has loaded (tests read it)

    def traced(self, arity: int) -> tuple[Graph, Node]:
        t = self._traces.get(arity)
        if t is None:
            t = self._traces[arity] = trace(self.fn, arity)
        return t

    def expression(self, arity: int = 1) -> str:
        return repr(self.traced(arity)[1])

    def source(self, arity: int = 1, dtype: torch.dtype = torch.float32) -> FusedSource:
        g, out = self.traced(arity)
        return generate_source(g, out, arity, dtype)

    def cost(self, out_numel: int, input_numels: tuple[int, ...], dtype=torch.float32) -> Cost:
        """One read of each input, one write of the output; FLOPs one per op node per element."""
        g, out = self.traced(len(input_numels))
        ops = sum(1 for n in _live(g, out) if n.op not in ("input", "const"))
        itemsize = dtype.itemsize
        return Cost(flops=ops * out_numel, bytes=(sum(input_numels) + out_numel) * itemsize)

    def _source_file(self, arity, dtype):
        key = (arity, dtype)
        got = self._modules.get(key)
        if got is None:
            fs = self.source(arity, dtype)
            # The private cache: the .cu written here is compiled and run.
            path = rt.private_cache_dir() / "fused" / (hashlib.sha256(fs.src.encode()).hexdigest()[:24] + ".cu")
            if not path.is_file() or path.read_text() != fs.src:
                write_atomic(path, fs.src.encode())
            got = self._modules[key] = (path, fs)
        return got

    def prepare(self, arity: int, dtype: torch.dtype, configs=(), device_index: int | None = None) -> rt.Module:
        """Compile every kernel for ``configs`` (default: the function's config) in one NVRTC run,
        e.g. before a sweep; later calls with those configs launch from this module."""
        dev = torch.cuda.current_device() if device_index is None else device_index
        configs = list(dict.fromkeys(configs or [self.config or FUSE_DEFAULT]))
        path, fs = self._source_file(arity, dtype)
        names = list(dict.fromkeys(kernel_name(fs, kind, c) for c in configs for kind in KINDS))
        mod = rt.load(path, names, device_index=dev)
        self.compiles += 1
        for c in configs:
            for kind in KINDS:
                key = (kind, arity, dtype, dev, kernel_name(fs, kind, c))
                if key not in self._kernels:
                    self._kernels[key] = mod.kernel(kernel_name(fs, kind, c), self._params(kind, arity, dtype))
        return mod

    @staticmethod
    def _params(kind, arity, dtype):
        out = rt.Tensor("out", (dtype,))
        if kind == "strided":
            ins = [rt.Tensor(f"x{i}", (dtype,), contiguous=False) for i in range(arity)]
            return (*ins, out, rt.Tensor("meta", (torch.int64,)))
        if kind == "rows":
            ins = [rt.Tensor(f"x{i}", (dtype,), contiguous=False) for i in range(arity)]
            tail = [rt.Scalar(n, "i64") for n in ("R", "C")]
            tail += [rt.Scalar(f"{w}{i}", "i64") for i in range(arity) for w in ("sr", "sc")]
            return (*ins, out, *tail)
        return (*[rt.Tensor(f"x{i}", (dtype,)) for i in range(arity)], out, rt.Scalar("n", "i64"))

    def _kernel(self, kind, arity, dtype, dev, cfg):
        _, fs = self._source_file(arity, dtype)
        key = (kind, arity, dtype, dev, kernel_name(fs, kind, cfg))
        k = self._kernels.get(key)
        if k is None:
            self.prepare(arity, dtype, [cfg], dev)
            k = self._kernels[key]
        return k

    def plan(self, *inputs: torch.Tensor, out: torch.Tensor) -> tuple[str, tuple | None]:
        """The kernel a call runs with these inputs and output (any device: the CPU tests ask):
        "blocked" when every input is contiguous, of the output's shape and 16-byte aligned;
        "rows" when the layout collapses to 2 dims in which every input walks a row with stride
        1 (aligned 16-byte loads) or 0, rows whole 16-byte vectors (a bias row or column, a
        scalar); else "strided". Returns (kind, the 2-D layout for "rows")."""
        if contiguous_ok(inputs, out):
            return "blocked", None
        layout = layout_2d(inputs, out)
        if rows_ok(inputs, out, layout):
            return "rows", layout
        return "strided", None

    def __call__(self, *inputs: torch.Tensor, out: torch.Tensor | None = None,
                 variant: str | None = None, config: FuseConfig | None = None) -> torch.Tensor:
        """inputs: tensors of one float dtype on one device, broadcastable shapes, any strides.
        out: optional contiguous tensor of the broadcast shape and the inputs' dtype (CUDA only).
        variant: None (``plan``: blocked, rows or strided) or one of "strided", "contiguous" (the
        grid-stride vector kernel), "blocked", "rows" (the last three raise ValueError
        when the inputs do not fit them). config: a ``FuseConfig`` (default: the one given to
        ``fuse``, else ``FUSE_DEFAULT``). Returns ``out`` (a new contiguous tensor when not given)
        of the broadcast shape and the inputs' dtype."""
        if not inputs:
            raise ValueError("tilewise.fuse: call the fused function with at least one tensor")
        if variant not in (None, *KINDS):
            raise ValueError(f"fused: unknown variant {variant!r}; choose from None, {', '.join(map(repr, KINDS))}")
        cfg = config or self.config or FUSE_DEFAULT
        if not isinstance(cfg, FuseConfig):
            raise ValueError(f"fused: 'config' must be a FuseConfig, got {type(cfg).__name__}")
        cfg.check()
        names = {f"x{i}": t for i, t in enumerate(inputs)}
        first = check_inputs("fused", names, cuda=False)
        shape = broadcast_shape(*(tuple(t.shape) for t in inputs), names=tuple(names))
        g, node = self.traced(len(inputs))
        if not first.is_cuda:
            return evaluate_reference(g, node, inputs).expand(shape).contiguous()
        check_inputs("fused", names)
        out = out_tensor("fused", out, shape, first)
        n = out.numel()
        if n == 0:
            return out
        dev = first.get_device()
        kind, layout = self.plan(*inputs, out=out)
        if variant in ("contiguous", "blocked") and kind != "blocked":
            raise ValueError(f"fused: the {variant} kernel needs contiguous, same-shape, 16-byte aligned inputs")
        if variant == "rows" and kind != "rows":
            layout = layout_2d(inputs, out)
            kind = "rows" if rows_ok(inputs, out, layout) else "strided"
        if variant == "rows" and kind == "strided":
            raise ValueError("fused: the rows kernel needs a layout that collapses to 2 dims (rows, columns) "
                             "in which each input walks a row with stride 1 or 0, rows of whole 16-byte "
                             "vectors, 16-byte aligned")
        kind = variant or kind
        arity, dtype = len(inputs), first.dtype
        k = self._kernel(kind, arity, dtype, dev, cfg)
        if kind == "blocked":
            k(blocked_grid(n, out.element_size(), cfg), cfg.threads, *inputs, out, n)
        elif kind == "rows":
            R, C, strides = rows_layout(layout, out.element_size())
            blocks, block = rows_grid(R, C, out.element_size(), cfg.rows_threads, cfg.rows)
            k(blocks, block, *inputs, out, R, C, *(v for st in strides for v in st))
        elif kind == "contiguous":
            per_vec = 16 // out.element_size()
            wave = self._waves.get(key := (dtype, dev, arity))
            if wave is None:
                wave = self._waves[key] = k.resident_grid(_THREADS)
            k(max(1, min(wave, -(-(n // per_vec) // _THREADS))), _THREADS, *inputs, out, n)
        else:
            k((n + _THREADS - 1) // _THREADS, _THREADS, *inputs, out, layout_tensor(strided_words(inputs, out), dev))
        return out


def fuse(fn, config: FuseConfig | None = None) -> FusedFunction:
    """Fuse an elementwise function of tensors into one generated CUDA C kernel.

    fn: a Python function of k tensors built from tilewise's elementwise ops (``sin``, ``cos``,
        ``relu``, ``exp``, ``add``, ``maximum``...) and ``+ - * / **`` with tensors or Python
        numbers, returning one tensor; e.g. ``fuse(lambda x: sin(x)**2 + cos(x)**2)`` or
        ``fuse(lambda x, b: relu(x + b))``. No data-dependent Python control flow.
    Returns a callable taking k tensors of one float dtype (CUDA float32/float16/bfloat16: one
    kernel, fp32 arithmetic; CPU: the PyTorch reference) of broadcastable shapes and any strides,
    returning the broadcast shape. The kernel is compiled once per (expression, dtype) and cached.
    config: the kernels' ``FuseConfig`` (default None: ``FUSE_DEFAULT`` at each call).
    """
    if not callable(fn):
        raise ValueError(f"tilewise.fuse: 'fn' must be callable, got {type(fn).__name__}")
    if config is not None:
        if not isinstance(config, FuseConfig):
            raise ValueError(f"tilewise.fuse: 'config' must be a FuseConfig, got {type(config).__name__}")
        config.check()
    return FusedFunction(fn, config)
