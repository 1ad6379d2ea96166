"""Where v5's persistent forward with two Q buffers (``Q_BUFS`` 2) goes wrong under causal: each wrong 64-row
block of the output against one buffer's, named by its work item (the CTA, the item's place in that CTA's
walk, the consumer, the Q buffer, the key tiles), under three grids: the launch's own (one CTA an SM), one
CTA an item (no buffer is ever reused) and 8 CTAs (long walks).

Why: on the H100 at f38f538 causal Q_BUFS 2 gave wrong outputs (0.68 relative at B 8 S 2048 D 128) and once
an illegal address, while without causal it was bitwise equal. ``research/attention_pipeline_model.py`` found
no fault in the barrier protocol under any interleaving. The sm_90 SASS (Triton 3.6) of that build did: ptxas
set the uniform registers of Q's wgmma descriptors for k-steps 1-7 only in the unmasked loop's preheader and
the masked loop reused them, so an item with no unmasked key tile (causal's first query tile, or Sk < 128)
read Q through the last item's buffer, or through registers never set on a CTA's first item. The consumer
now runs one loop with the bounds test a branch inside (Q_BUFS 2 only; one buffer keeps its two loops, its
descriptors hoisted out of the item loop). Prediction: no block differs, under every grid.
Measured (H100, a07282b): no block differs under any grid; memcheck 0 errors (docs/tuning/attention.md).
Run on the GPU: PYTHONPATH=src python3 research/attention_q_bufs_debug.py
and the one-row case under memcheck: compute-sanitizer --tool memcheck python3 research/attention_q_bufs_debug.py --tiny
"""
import argparse
from collections import Counter

import torch
from attention_pipeline_model import ptile  # research/ is the script's path

from tilewise.ops.attention import api as A
from tilewise.ops.attention import gluon_fwd as ag

REAL_RUN = ag.run
# (B, H, Hkv, Sq, Sk, D, causal)
SHAPES = [(8, 16, 16, 2048, 2048, 128, False), (8, 16, 16, 2048, 2048, 128, True), (2, 16, 16, 2048, 777, 128, True),
          (3, 4, 2, 1031, 1031, 128, True), (2, 16, 16, 2048, 2048, 64, True)]
TINY = (1, 2, 2, 1, 64, 128, True)


def launcher(q_bufs, grid_of):
    """``ag.run`` with Q_BUFS and the persistent kernel's grid replaced (``grid_of(total items, grid)``)."""
    def run(kernel, grid, args, meta, launch=None):
        if kernel is ag.attn_fwd_ws_persistent_kernel:
            meta = {**meta, "Q_BUFS": q_bufs}
            grid = grid_of(grid)
        return REAL_RUN(kernel, grid, args, meta, launch)
    return run


def forward(q, k, v, causal, q_bufs, grid_of):
    D = q.shape[-1]
    from tilewise.ops.attention import configs as C
    policy = A.default_policy(q, k, causal=causal).replace(
        forward="ws", ws_persistent=True, ws_overlap=False, plans=False, ws_config=C.WS_THREE if D == 64 else None)
    ag.run = launcher(q_bufs, grid_of)
    try:
        out, lse = A.flash_attention(q, k, v, causal=causal, policy=policy, return_lse=True)
    finally:
        ag.run = REAL_RUN
    torch.cuda.synchronize()
    return out, lse


def item_of(start_m, bh, n_m, BH, nprog, causal):
    """The inverse of ``gluon_items.persistent_item`` (``attention_pipeline_model.ptile``, its Python model): the
    walk index ``tile`` of work item (start_m, bh)."""
    return [ptile(t, n_m, BH, nprog, causal) for t in range(n_m * BH)].index((start_m, bh))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="only the one-row causal case (for compute-sanitizer)")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, H, Hkv, Sq, Sk, D, causal in ([TINY] if args.tiny else SHAPES + [TINY]):
        g = torch.Generator(device="cuda").manual_seed(Sq + Sk + D)
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        ncons = 3 if D == 64 else 2
        n_m = -(-Sq // (64 * ncons))
        total = n_m * B * H
        for gname, grid_of in (("one CTA an SM", lambda grid: grid), ("one CTA an item", lambda grid: (total,)),
                               ("8 CTAs", lambda grid: (min(8, total),))):
            nprog = grid_of((min(sms, total),))[0]
            one, lse1 = forward(q, k, v, causal, 1, grid_of)
            two, lse2 = forward(q, k, v, causal, 2, grid_of)
            rows = (one != two).any(-1) | (lse1 != lse2)  # (B, H, Sq)
            wrong = Counter()
            examples = []
            for b, h, m in rows.nonzero().tolist():
                start_m, cons = m // (64 * ncons), (m % (64 * ncons)) // 64
                key = (b * H + h, start_m, cons)
                if key in wrong:
                    wrong[key] += 1
                    continue
                wrong[key] = 1
                tile = item_of(start_m, b * H + h, n_m, B * H, nprog, causal)
                it = tile // nprog
                examples.append(dict(bh=b * H + h, start_m=start_m, consumer=cons, cta=tile % nprog, it=it,
                                     buffer=(it % 2) * ncons + cons,
                                     key_tiles=-(-(min(Sk, (start_m + 1) * 64 * ncons) if causal else Sk) // 128)))
            print(f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D} causal={causal}, {gname} ({nprog} CTAs, {total} items): "
                  f"{len(examples)} of {total * ncons} consumer blocks differ", flush=True)
            if examples:
                for field in ("consumer", "it", "buffer", "key_tiles", "cta"):
                    print(f"  by {field}: {dict(sorted(Counter(e[field] for e in examples).items())[:24])}")
                for e in examples[:6]:
                    print(f"  e.g. {e}")


if __name__ == "__main__":
    main()
