# Last run at 4e4d6f5 (logs/gemm-plans-run3-4e4d6f5.log). Gone since: the module switch _PLANS_ON; gemm() takes
# GemmPolicy(plans=...) per call, tilewise.linear takes no policy, so its rows have no "plans off" column (nan).
"""gemm()'s call plans (ops/gemm/api.py, "call plans"): host time of a call with the plans off
(every call checks, routes, builds checked descriptors and keys the launch) and on (the first call
of a layout does that; later calls allocate, make descriptors and launch the compiled kernel),
against torch.matmul, in one process. Per size: host us per call (back-to-back calls, no sync),
the eager time as the bench's rows measure it (events around each call, back to back), and the
device time replayed from a CUDA graph. Then the pieces of a planned call and a cProfile.

Prediction (written before the first run): a planned 1000^3 bf16 call ~20-25 us of host time
(82 us before: logs/host-overhead-launch-cache.log), so the eager 1000^3 and 1536^3 rows go from
0.33x cuBLAS to ~0.8-1.0x, and the graph-replayed rows do not move. First run (defd1a3): 18-21 us,
but eager here is host + device back to back (28.6 us against torch's 19.2 at 1000^3: 0.67x).
Second prediction, for the raw-launcher path (descriptors encoded once per address): the bound
launch 15 -> ~8 us, a 1000^3 call ~14 us.
Run on the GPU: PYTHONPATH=src python3 research/gemm_plans.py
"""

import cProfile
import pstats

import torch

from _timing import linear_step_case, median_event_ms, per_call_us
from tilewise.bench.harness import host_us_per_call, time_ms_graph
from tilewise.ops.gemm import api as g
from tilewise.ops.gemm import route as rt
from tilewise.ops.gemm.configs import GemmPolicy

PLANS_OFF, PLANS_ON = GemmPolicy(plans=False), GemmPolicy(plans=True)


def eager_us(fn, reps=300):
    return 1000 * median_event_ms(fn, reps=reps, warmup=30, sync_each=False)


def graph_us(fn):
    return time_ms_graph(fn, calls=50, repeats=20) * 1000


def measure(fn):
    fn()
    fn()
    return host_us_per_call(fn, calls=500, repeats=7), eager_us(fn)


def row(label, torch_fn, ours_for):
    """``ours_for(policy)``: our call under that GemmPolicy (plans off / on); None where the call
    takes no policy (tilewise.linear: plans on only)."""
    th, te = measure(torch_fn)
    off = ours_for(PLANS_OFF)
    oh, oe = measure(off) if off is not None else (float("nan"), float("nan"))
    ours_fn = ours_for(PLANS_ON) or ours_for(None)
    ph, pe = measure(ours_fn)
    tg, pg = graph_us(torch_fn), graph_us(ours_fn)
    print(f"{label:34s} torch: host {th:6.1f} eager {te:6.1f} graph {tg:7.2f} | plans off: host {oh:6.1f} "
          f"eager {oe:6.1f} | on: host {ph:6.1f} eager {pe:6.1f} graph {pg:7.2f} | eager x torch "
          f"off {te / oe:4.2f} on {te / pe:4.2f}", flush=True)


print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
for n, dtype in ((512, torch.bfloat16), (1000, torch.bfloat16), (1000, torch.float16), (1536, torch.bfloat16),
                 (2048, torch.bfloat16), (3072, torch.bfloat16)):
    gen = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    got = g.gemm(a, b)
    err = ((got.float() - ref).norm() / ref.norm()).item()
    tag = str(dtype).replace("torch.", "")
    row(f"{n}^3 {tag} out=", lambda: torch.matmul(a, b, out=out), lambda p: lambda: g.gemm(a, b, out=out, policy=p))
    row(f"{n}^3 {tag} new output", lambda: torch.matmul(a, b), lambda p: lambda: g.gemm(a, b, policy=p))
    print(f"    rel error {err:.2e}", flush=True)

x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
row("linear 4096x1024x1024 relu", lambda: torch.relu(torch.nn.functional.linear(x, w, bias)),
    lambda p: None if p is not None else lambda: g.linear(x, w, bias, activation="relu"))
torch_step, tw_step = linear_step_case()


th, te = measure(torch_step)
ph, pe = measure(tw_step)  # (tilewise.linear takes no GemmPolicy: plans on, no "off" column)
print(f"linear fwd+bwd 2048x512x512 torch: host {th:6.1f} eager {te:6.1f} | plans on host {ph:6.1f} eager "
      f"{pe:6.1f}", flush=True)


a = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    g.gemm(a, b)
key = rt.plan_key(a, b, None, None, None, "tf32", None)
plan = rt.PLANS[key]
_, tail, (ma, mb, mc) = plan.state  # (Bound, trailing arguments, descriptor makers)
o = torch.empty(1000, 1000, device="cuda", dtype=torch.bfloat16)
c = mc(o)
args = (ma(a), mb(b), c, c, o, o, o) + tuple(tail)
raw = plan.bound.raw
direct = per_call_us(lambda: plan.bound(*args))
plan.bound.raw = None
via_run = per_call_us(lambda: plan.bound(*args))
plan.bound.raw = raw
dev = a.device
print(f"pieces of a planned 1000^3 call (us): key {per_call_us(lambda: rt.plan_key(a, b, None, None, None, 'tf32', None)):.2f}, "
      f"torch.empty((M, N), dtype=, device=) {per_call_us(lambda: torch.empty((1000, 1000), dtype=torch.bfloat16, device=dev)):.2f}, "
      f"a.new_empty((M, N)) {per_call_us(lambda: a.new_empty((1000, 1000))):.2f}, "
      f"torch.empty(M, N, dtype=, device=) {per_call_us(lambda: torch.empty(1000, 1000, dtype=torch.bfloat16, device=dev)):.2f}, "
      f"descriptor {per_call_us(lambda: ma(a)):.2f}, bound launch direct {direct:.2f} (raw launcher "
      f"{'used' if raw is not None else 'not available'}), through kernel.run {via_run:.2f}, "
      f"whole call {per_call_us(lambda: g.gemm(a, b)):.2f}, with out= {per_call_us(lambda: g.gemm(a, b, out=o)):.2f}",
      flush=True)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(500):
    g.gemm(a, b)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(15)

print("cProfile of tilewise.linear forward + backward, 2048x512x512 bf16 (100 steps)")
tw_step()
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(100):
    tw_step()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
