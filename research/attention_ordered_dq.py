# Last run at fb49db6 (logs/attention-ordered-dq-fb49db6.log). Gone since: the racy "rmw/no-wait" case
# (the kernel's ORDERED=3) has no switch any more (AttentionPolicy.ordered_mode takes 1 or 2), so it is skipped.
"""Where the deterministic fused backward's time goes: the backward alone (one forward, its
autograd graph kept, the backward timed by do_bench with L2 flushed), bf16, B=4 H=16 S=4096,
D 64 / 128, causal or not, for
  two-kernel   the default deterministic backward (dK/dV kernel + dQ kernel, 7 matmuls),
  ordered/thr  the fused kernel, dQ read-modify-writes in key-tile order, counts per thread,
  ordered/warp the same, counts per warp (lane 0 polls and releases: 32x fewer same-address atomics),
  rmw/no-wait  the same read-modify-writes with no waiting at all (racy, wrong dQ): what the RMW
               latency alone costs against fp32 atomics,
  atomic       deterministic=False (pointer fp32 atomics, fire and forget).
The ordered modes are checked bitwise reproducible and against the two-kernel result first.
Run on the GPU: PYTHONPATH=src python3 research/attention_ordered_dq.py
"""

import torch
import triton

from tilewise.ops.attention import api as A


def warm_up():
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x @ x


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    warm_up()
    B, H, S = 4, 16, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    for D in (128, 64):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
                   for _ in range(3))
        go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for causal in (False, True):
            flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
            cases = {"two-kernel": (True, False, 1), "ordered/thr": (True, True, 1), "ordered/warp": (True, True, 2),
                     "rmw/no-wait": (True, True, 3), "atomic": (False, False, 1)}
            res, ref = {}, None
            for name, (det, ordered, mode) in cases.items():
                if mode not in (1, 2):  # AttentionPolicy takes ordered_mode 1 or 2 only
                    print(f"{name}: skipped (no policy runs the kernel's ORDERED={mode})", flush=True)
                    continue
                backward = "ordered" if ordered else ("two_kernel" if det else "atomic")
                policy = A.default_policy(q, k, causal=causal, deterministic=det).replace(backward=backward,
                                                                                          ordered_mode=mode)
                out = A.flash_attention(q, k, v, causal=causal, deterministic=det, policy=policy)

                def bwd():
                    return torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
                grads = bwd()
                if name == "two-kernel":
                    ref = grads
                elif name.startswith("ordered"):
                    again = bwd()
                    assert all(torch.equal(a, b) for a, b in zip(grads, again)), f"{name}: not reproducible"
                    for gn, a, r in zip("qkv", grads, ref):
                        err = ((a.float() - r.float()).norm() / r.float().norm()).item()
                        assert err < 1e-2, f"{name} d{gn}: {err:.3g} from the two-kernel backward"
                ms = triton.testing.do_bench(bwd, warmup=25, rep=150, return_mode="median")
                res[name] = ms
            line = " | ".join(f"{n} {ms * 1e3:7.1f} us {flops / ms / 1e9:5.1f} TF" for n, ms in res.items())
            print(f"backward D={D:3d} {'causal' if causal else 'plain ':6s}: {line}", flush=True)


if __name__ == "__main__":
    main()
