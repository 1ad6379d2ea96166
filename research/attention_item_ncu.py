"""Where the D = 128 forward's short rows lose to cuDNN (issue 30: B 8 H 16 S 2048 forward 0.825x on the
H100, against ~0.98x at S 16384): one launch each, under Nsight Compute, of the library's forward, v5's grid
kernel and cuDNN's, at S 2048 (plain and causal) and at S 16384 (plain), bf16, B x S = 16384.

Arithmetic on fa956a6's rows (research/notes/attention.md, "Twenty-fourth session") put the gap in a fixed
cost of ~3-5 key-tile times a work item (128 query rows). What to read: cuDNN's kernel (grid, threads, shared
memory, registers: its tile and item count) against ours; tensor-pipe busy and the stall mix of each; and, in
the source page of our persistent kernel, which SASS lines the samples fall on at an item's start (Q's wait,
the first S) and end (_finish's stores).
Inputs are random (never zeros); every case runs once before the profiler starts, so compiles are outside it.
Also the window's band kernel at B 1 H 16 S 16384 causal, window 1024 (its items' fixed cost).
Run on the GPU: research/attention_item_ncu.sh OUTDIR [sass] (python3 research/attention_item_ncu.py [NAME PART]: some
cases; ``sass``: only the SASS source pages, ~4 x 60 s, not the full report)
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilewise.ops.attention import api as A


def cases():
    out = []
    # and D 64 at B 4 S 4096 (research/attention_exp2_poly.py: is MUFU (the XU pipe) as busy as the tensor pipe?)
    # and D 64 causal at S 1024 / 2048 (B x S = 16384), where the forward is 0.93-0.99x cuDNN: "causal D64" (named only)
    for B, S, causal, D in ((8, 2048, False, 128), (8, 2048, True, 128), (1, 16384, False, 128), (4, 4096, False, 64),
                            (16, 1024, True, 64), (8, 2048, True, 64)):
        H = 16
        g = torch.Generator(device="cuda").manual_seed(S + causal)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        route = A.default_policy(q, k, causal=causal)
        tag = f"B{B} S{S}{' causal' if causal else ''}{' D64' if D == 64 else ''}"

        def ours(q=q, k=k, v=v, causal=causal):
            return A.flash_attention(q, k, v, causal=causal)

        def grid(q=q, k=k, v=v, causal=causal, route=route):
            return A.flash_attention(q, k, v, causal=causal,
                                     policy=route.replace(forward="ws", ws_persistent=False, ws_overlap=False))

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        out += [(f"{tag} flash_attention", ours), (f"{tag} cudnn", cudnn)]
        if S == 2048:
            out.append((f"{tag} v5 grid", grid))
    # the window's items (research/notes/attention.md, thirty-fourth session: ~9 key tiles and ~7.7 us of fixed
    # cost each at window 1024): v5's band kernel, the default route at D 128
    g = torch.Generator(device="cuda").manual_seed(1024)
    q, k, v = (torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    out.append(("B1 S16384 window1024 flash_attention",
                lambda: A.flash_attention(q, k, v, causal=True, window=(1024, None))))
    return out


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # run only the cases whose name contains it
    # the D 64 causal cases only when asked (attention_item_ncu.sh's d64 mode): the full report stays as it was
    todo = [(n, fn) for n, fn in cases() if only in n and (only or "causal D64" not in n)]
    for _, fn in todo:
        fn()
    torch.cuda.synchronize()
    for name, fn in todo:
        print(f"ncu case: {name}", flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
