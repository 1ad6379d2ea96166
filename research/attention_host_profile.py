"""Where the host time of one forward + backward goes (cProfile, 200 calls enqueued, no sync inside),
for the default path at D = 128 S = 1024 causal / plain (v5's forward, v6's or v3's backward) and
for v3's forward and backward: attention_host_time.py (e0009f8) measured 0.9-1.1 ms of host time a
call with v5 + v6 against 0.56-0.74 ms with v3 + v3, so short causal calls are host-bound.
Prints the top functions by own time and by cumulative time.
Run on the GPU: PYTHONPATH=src python3 research/attention_host_profile.py
"""

import cProfile
import io
import pstats

import torch

from tilewise.ops.attention import api as A


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, S, D = 16, 16, 1024, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    for name, causal, changes in (("v5+v6 plain", False, dict(backward="ws")),
                                  ("v5+v6 causal", True, dict(backward="ws")),
                                  ("v3+v3 causal", True, dict(forward="pointer", backward="two_kernel"))):
        policy = A.default_policy(q, k, causal=causal).replace(**changes)  # built once, outside the profile

        def step():
            return torch.autograd.grad(A.flash_attention(q, k, v, causal=causal, policy=policy), (q, k, v), go)

        for _ in range(10):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            step()
        prof.disable()
        torch.cuda.synchronize()
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(22)
            text = out.getvalue()
            print(f"===== {name}: by {key} (200 calls)\n" + text[text.find("ncalls") - 2:], flush=True)


if __name__ == "__main__":
    main()
