"""fusion: ``tilewise.fuse(fn)`` turns an elementwise Python function of tensors into one CUDA C kernel.

``fn`` is traced once per arity with placeholder objects: tilewise's elementwise ops (``sin``,
``relu``, ``add``... from ``tilewise.ops.elementwise``), the operators ``+ - * / ** -x`` and Python
numbers build an expression DAG (identical subexpressions are shared). From it one CUDA C source is
generated, each node one fp32 line through the functors of ``include/elementwise_ops.cuh``, in two
kernels:
    strided:    one thread per output, every input read through its strides with broadcasting
                (``include/strided.cuh``: stride 0 on broadcast dims). bound: copy bandwidth when the
                reads coalesce.
    contiguous: inputs contiguous, one shape, 16-byte aligned: 16-byte loads and stores in a
                grid-stride loop. bound: copy bandwidth ((k inputs + 1) x n x itemsize).
The source depends on (expression, dtype) only; the broadcast pattern is data (the layout array),
so one compiled module per (expression, dtype) serves every pattern and NVRTC runs once for it
(then the disk cache answers). Intermediates stay in registers: ``sin(x)**2 + cos(x)**2`` reads x
once and writes once (8 bytes per fp32 element), where eager PyTorch runs five kernels that read
7 and write 5 tensors (48 bytes per element).

No autograd through fused functions (use the differentiable ops unfused for training).
"""

from __future__ import annotations

import functools
import hashlib
import struct

import torch

from ..cost import Cost
from ..runtime import cuda as rt
from . import elementwise as ew

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


class Tracer:
    """A placeholder tensor during tracing; supports tilewise's elementwise ops and operators."""

    _tw_trace = True
    __array_priority__ = 1000

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node

    def _unary(self, op: str) -> "Tracer":
        return Tracer(self.graph, self.graph.add(Node(op, (self.node,))))

    def __neg__(self):
        return self._unary("neg")

    def __add__(self, o):
        return _binary_trace("add", self, o)

    def __radd__(self, o):
        return _binary_trace("add", o, self)

    def __sub__(self, o):
        return _binary_trace("sub", self, o)

    def __rsub__(self, o):
        return _binary_trace("sub", o, self)

    def __mul__(self, o):
        return _binary_trace("mul", self, o)

    def __rmul__(self, o):
        return _binary_trace("mul", o, self)

    def __truediv__(self, o):
        return _binary_trace("div", self, o)

    def __rtruediv__(self, o):
        return _binary_trace("div", o, self)

    def __pow__(self, o):
        return _binary_trace("pow", self, o)

    def __rpow__(self, o):
        return _binary_trace("pow", o, self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise ValueError(f"tilewise.fuse: {getattr(func, '__name__', func)} is a PyTorch function; inside a "
                         f"fused function use tilewise's ops (tilewise.ops.elementwise: "
                         f"{', '.join(ew.MAP_OPS)}, {', '.join(ew.ZIP_OPS)}) and + - * / **")

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


def _float_literal(v: float) -> str:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    return f"__int_as_float(0x{bits:08x})"  # exact, whatever the decimal printing would round to


def _expr_lines(nodes: list[Node], arity: int) -> tuple[list[str], str]:
    names: dict[int, str] = {}
    lines: list[str] = []
    for i, n in enumerate(nodes):
        if n.op == "input":
            names[id(n)] = f"v{n.index}"
            continue
        name = f"t{i}"
        if n.op == "const":
            rhs = _float_literal(n.value)
        elif n.op in ew.MAP_OPS:
            rhs = f"ew::{ew.MAP_OPS[n.op][0]}()({names[id(n.args[0])]})"
        elif n.op == "pow" and n.args[1].op == "const" and n.args[1].value == 2.0:
            a = names[id(n.args[0])]
            rhs = f"{a} * {a}"  # exact, as torch.pow(x, 2)
        elif n.op in ew.ZIP_OPS:
            rhs = f"ew::{ew.ZIP_OPS[n.op][0]}()({names[id(n.args[0])]}, {names[id(n.args[1])]})"
        else:
            raise ValueError(f"tilewise.fuse: no code for op {n.op!r}")
        lines.append(f"  const float {name} = {rhs};")
        names[id(n)] = name
    return lines, names[id(nodes[-1])]


def generate_source(graph: Graph, out: Node, arity: int, dtype: torch.dtype) -> tuple[str, str, str]:
    """(CUDA C source, strided kernel name, contiguous kernel name) for one expression and dtype."""
    nodes = _live(graph, out)
    lines, result = _expr_lines(nodes, arity)
    ct = rt.ctype(dtype)
    expr = repr(out)
    tag = hashlib.sha256(f"{expr}|{arity}|{ct}".encode()).hexdigest()[:16]
    strided, contig = f"fused_strided_{tag}", f"fused_contiguous_{tag}"
    params = ", ".join(f"float v{i}" for i in range(arity))
    ins = ", ".join(f"const T* __restrict__ in{i}" for i in range(arity))
    src = f"""// generated by tilewise.fuse: {expr} ({ct})
#include "tilewise_common.cuh"
#include "strided.cuh"
#include "elementwise_ops.cuh"

using T = {ct};

__device__ __forceinline__ float fused_expr({params}) {{
{chr(10).join(lines)}
  return {result};
}}

extern "C" __global__ void __launch_bounds__(256) {strided}({ins}, T* __restrict__ out,
                                                           const long long* __restrict__ meta) {{
  __shared__ tw::StridedLayout<{arity}> s;
  tw::load_layout(s, meta);
  const long long i = tw::global_thread_id();
  if (i >= s.n) return;
  long long off[{arity}];
  tw::broadcast_offsets(s, i, off);
  out[i] = tw::from_float<T>(fused_expr({", ".join(f"tw::to_float(in{k}[off[{k}]])" for k in range(arity))}));
}}

extern "C" __global__ void __launch_bounds__(256) {contig}({ins}, T* __restrict__ out, long long n) {{
  using V = tw::Vec16<T>;
  constexpr int UNROLL = {max(1, 4 // arity)};
  const long long nvec = n / V::N;
  const long long stride = tw::grid_threads();
  long long i = tw::global_thread_id();
  for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {{
    V x[{arity}][UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
{chr(10).join(f"      x[{k}][u].raw = __ldcs(reinterpret_cast<const uint4*>(in{k}) + i + u * stride);" for k in range(arity))}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
#pragma unroll
      for (int e = 0; e < V::N; ++e)
        x[0][u].v[e] = tw::from_float<T>(fused_expr({", ".join(f"tw::to_float(x[{k}][u].v[e])" for k in range(arity))}));
      __stcs(reinterpret_cast<uint4*>(out) + i + u * stride, x[0][u].raw);
    }}
  }}
  for (; i < nvec; i += stride) {{
    V x[{arity}];
{chr(10).join(f"    x[{k}].raw = __ldcs(reinterpret_cast<const uint4*>(in{k}) + i);" for k in range(arity))}
#pragma unroll
    for (int e = 0; e < V::N; ++e)
      x[0].v[e] = tw::from_float<T>(fused_expr({", ".join(f"tw::to_float(x[{k}].v[e])" for k in range(arity))}));
    __stcs(reinterpret_cast<uint4*>(out) + i, x[0].raw);
  }}
  for (long long j = nvec * V::N + tw::global_thread_id(); j < n; j += stride)
    out[j] = tw::from_float<T>(fused_expr({", ".join(f"tw::to_float(in{k}[j])" for k in range(arity))}));
}}
"""
    return src, strided, contig


# --------------------------------------------------------------------------- evaluation


def evaluate_reference(graph: Graph, out: Node, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The expression with PyTorch ops, one kernel per node (what eager PyTorch would run)."""
    vals: dict[int, torch.Tensor | float] = {}
    for n in _live(graph, out):
        if n.op == "input":
            v = inputs[n.index]
        elif n.op == "const":
            v = n.value
        elif n.op in ew.MAP_OPS:
            v = ew.MAP_OPS[n.op][1](vals[id(n.args[0])])
        else:
            a, b = (vals[id(x)] for x in n.args)
            if n.op == "relu_backward" or n.op == "max":
                like = a if isinstance(a, torch.Tensor) else b
                a = a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=like.dtype, device=like.device)
                b = b if isinstance(b, torch.Tensor) else torch.full((), b, dtype=like.dtype, device=like.device)
            v = ew.ZIP_OPS[n.op][1](a, b)
        vals[id(n)] = v
    return vals[id(out)]


class FusedFunction:
    """What ``fuse(fn)`` returns: call it with tensors (CUDA: one generated kernel; CPU: the
    PyTorch reference, node by node)."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self._traces: dict[int, tuple[Graph, Node]] = {}
        self._kernels: dict[tuple, tuple[rt.Kernel, rt.Kernel]] = {}
        self._waves: dict[tuple, int] = {}
        self.compiles = 0  # how many distinct modules this function has loaded (tests read it)

    def traced(self, arity: int) -> tuple[Graph, Node]:
        t = self._traces.get(arity)
        if t is None:
            t = self._traces[arity] = trace(self.fn, arity)
        return t

    def expression(self, arity: int = 1) -> str:
        return repr(self.traced(arity)[1])

    def source(self, arity: int = 1, dtype: torch.dtype = torch.float32) -> tuple[str, str, str]:
        g, out = self.traced(arity)
        return generate_source(g, out, arity, dtype)

    def cost(self, out_numel: int, input_numels: tuple[int, ...], dtype=torch.float32) -> Cost:
        """One read of each input, one write of the output; FLOPs one per op node per element."""
        g, out = self.traced(len(input_numels))
        ops = sum(1 for n in _live(g, out) if n.op not in ("input", "const"))
        itemsize = dtype.itemsize
        return Cost(flops=ops * out_numel, bytes=(sum(input_numels) + out_numel) * itemsize)

    def _kernel_pair(self, arity, dtype, dev):
        key = (arity, dtype, dev)
        pair = self._kernels.get(key)
        if pair is None:
            src, strided, contig = self.source(arity, dtype)
            path = rt.cache_dir() / "fused" / (hashlib.sha256(src.encode()).hexdigest()[:24] + ".cu")
            if not path.is_file() or path.read_text() != src:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{id(self)}.tmp")
                tmp.write_text(src)
                tmp.replace(path)
            mod = rt.load(path, [strided, contig], device_index=dev)
            self.compiles += 1
            ins = [rt.Tensor(f"x{i}", (dtype,), contiguous=False) for i in range(arity)]
            out = rt.Tensor("out", (dtype,))
            ks = mod.kernel(strided, (*ins, out, rt.Tensor("meta", (torch.int64,))))
            kc = mod.kernel(contig, (*[rt.Tensor(f"x{i}", (dtype,)) for i in range(arity)], out, rt.Scalar("n", "i64")))
            pair = self._kernels[key] = (ks, kc)
        return pair

    def __call__(self, *inputs: torch.Tensor, out: torch.Tensor | None = None,
                 variant: str | None = None) -> torch.Tensor:
        """inputs: tensors of one float dtype on one device, broadcastable shapes, any strides.
        out: optional contiguous tensor of the broadcast shape and the inputs' dtype (CUDA only).
        variant: None (contiguous when every input is contiguous, of the output's shape and 16-byte
        aligned, else strided), "strided" or "contiguous". Returns ``out`` (a new contiguous tensor
        when not given) of the broadcast shape and the inputs' dtype."""
        if not inputs:
            raise ValueError("tilewise.fuse: call the fused function with at least one tensor")
        names = {f"x{i}": t for i, t in enumerate(inputs)}
        first = ew.check_inputs("fused", names, cuda=False)
        shape = ew.broadcast_shape(*(tuple(t.shape) for t in inputs), names=tuple(names))
        g, node = self.traced(len(inputs))
        if not first.is_cuda:
            return evaluate_reference(g, node, inputs).expand(shape).contiguous()
        ew.check_inputs("fused", names)
        out = ew._out("fused", out, shape, first)
        n = out.numel()
        if n == 0:
            return out
        dev = first.get_device()
        ks, kc = self._kernel_pair(len(inputs), first.dtype, dev)
        contiguous_ok = all(t.is_contiguous() and t.shape == out.shape for t in inputs) and ew._aligned16(*inputs, out)
        if variant not in (None, "strided", "contiguous"):
            raise ValueError(f"fused: unknown variant {variant!r}; choose from None, 'strided', 'contiguous'")
        if variant == "contiguous" and not contiguous_ok:
            raise ValueError("fused: the contiguous kernel needs contiguous, same-shape, 16-byte aligned inputs")
        if variant == "contiguous" or (variant is None and contiguous_ok):
            per_vec = 16 // out.element_size()
            wave = self._waves.get(key := (first.dtype, dev, len(inputs)))
            if wave is None:
                wave = self._waves[key] = kc.resident_grid(_THREADS)
            kc(max(1, min(wave, -(-(n // per_vec) // _THREADS))), _THREADS, *inputs, out, n)
        else:
            words = ew._plan(tuple(shape), ew._specs(inputs))[0]
            ks((n + _THREADS - 1) // _THREADS, _THREADS, *inputs, out, ew.layout_tensor(words, dev))
        return out


def fuse(fn) -> FusedFunction:
    """Fuse an elementwise function of tensors into one generated CUDA C kernel.

    fn: a Python function of k tensors built from tilewise's elementwise ops (``sin``, ``cos``,
        ``relu``, ``exp``, ``add``, ``maximum``...) and ``+ - * / **`` with tensors or Python
        numbers, returning one tensor; e.g. ``fuse(lambda x: sin(x)**2 + cos(x)**2)`` or
        ``fuse(lambda x, b: relu(x + b))``. No data-dependent Python control flow.
    Returns a callable taking k tensors of one float dtype (CUDA float32/float16/bfloat16: one
    kernel, fp32 arithmetic; CPU: the PyTorch reference) of broadcastable shapes and any strides,
    returning the broadcast shape. The kernel is compiled once per (expression, dtype) and cached.
    """
    if not callable(fn):
        raise ValueError(f"tilewise.fuse: 'fn' must be callable, got {type(fn).__name__}")
    return FusedFunction(fn)
