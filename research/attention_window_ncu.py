"""Where v5's band forward spends the time a CTA pays beyond its key tiles (issue 30's window target):
one launch each, for Nsight Compute, of the band kernel at window 1024 and 4096 and of the full causal
forward (B 1 H 16 S 16384 D 128 causal bf16, the bench's window shape).

From research/attention_window.py: ~1.6 us a key tile of 128 (~700 TFLOP/s) and ~5-8 us a CTA beyond
its tiles; the persistent grid, which overlaps a CTA's Q load and ring fill with the previous item,
recovered only 2-4 %. What to read: tensor-pipe busy and the warp stall reasons (barrier waits vs
wgmma waits vs MUFU) of the band kernel at 1024 against 4096 and full causal.
Run on the GPU:
  ncu --clock-control none --kernel-name regex:attn_fwd_ws --set full \\
      python3 research/attention_window_ncu.py
"""
import torch

from tilewise.ops.attention import api as A

B, H, S, D = 1, 16, 16384, 128
g = torch.Generator(device="cuda").manual_seed(D)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
policy = A.default_policy(q, k).replace(forward="ws", ws_band=True, ws_band_persistent=False)
for name, fn in (("band window 1024", lambda: A.flash_attention(q, k, v, causal=True, window=(1024, None),
                                                                  policy=policy)),
                 ("band window 4096", lambda: A.flash_attention(q, k, v, causal=True, window=(4096, None),
                                                                  policy=policy)),
                 ("full causal", lambda: A.flash_attention(q, k, v, causal=True))):
    print(f"ncu case: {name}", flush=True)
    fn()
    torch.cuda.synchronize()
