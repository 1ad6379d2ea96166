"""attention's tuning and routing: the tile tables, the Gluon kernels' tables, the routing rules, the
per-call ``AttentionPolicy`` and ``choose_policy``, the heuristic that picks the default one.

Every table is read-only and every rule says in a line why it is what it is, and names the section of
docs/tuning/attention.md ("tuning: <section>") that holds the measurements behind it. Behaviour changes
per call, through a policy passed to ``flash_attention``: nothing here is edited at run time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional, Union

class Tile(NamedTuple):
    """A Triton kernel's launch tile."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _tiles(table: dict) -> Mapping[int, Tile]:
    return MappingProxyType({key: Tile(*t) for key, t in table.items()})


def block_d(D: int) -> int:
    """The head dim padded to a power of two (at least 16): the kernels' BLOCK_D."""
    return max(16, 1 << (D - 1).bit_length())


def table_key(D: int) -> int:
    """The tile tables' key for head dim D: its padded size, 32 to 256."""
    return min(max(block_d(D), 32), 256)


# ---------------------------------------------------------------------------- Triton tile tables
# (BLOCK_M, BLOCK_N, num_warps, num_stages) by padded head dim, for sm_90.

# The largest spill-free tiles; 8 warps so each warpgroup's wgmma has M = 64 (tuning: "Forward tiles").
FWD = _tiles({32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)})
# With a bias, D = 64 runs faster as 64 x 64 in one warpgroup; D = 128 keeps 128 x 64
# (tuning: "Bias forward tiles").
FWD_BIAS = _tiles({**FWD, 64: (64, 64, 4, 3)})
# v4's TMA kernel with a bias: 128 x 64 x 8 x 3 led at D = 64 and 128 (tuning: "Bias forward by TMA").
FWD_TMA_BIAS = _tiles({32: (64, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)})
# The opt-in bias-pair forward: two accumulators' registers bound the tile (tuning: "Bias pair kernel").
FWD_BIAS_PAIR = _tiles({32: (64, 64, 4, 3), 64: (128, 64, 8, 3), 128: (64, 64, 4, 2), 256: (32, 32, 4, 1)})
# dK/dV: a key tile and two fp32 accumulators stay in registers while query tiles stream; the
# spill-free tiles (tuning: "Deterministic backward tiles").
DKDV = _tiles({32: (64, 128, 8, 3), 64: (32, 128, 8, 3), 128: (32, 128, 8, 2), 256: (32, 32, 4, 1)})
# 2-byte inputs at D = 64: a 64-key tile in one warpgroup with 4 stages ran faster
# (tuning: "Deterministic backward tiles").
DKDV_2BYTE = _tiles({64: (32, 64, 4, 4)})
# dQ: a query tile stays, key tiles stream (tuning: "Deterministic backward tiles").
DQ = _tiles({32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 2), 256: (64, 32, 8, 2)})
# dQ that also stores dS for the bias gradient: the extra store spills 128 x 64 at D = 128
# (tuning: "Deterministic backward tiles").
DQ_BIAS = _tiles({**DQ, 128: (128, 32, 8, 2)})
# The atomic backward (head dims <= ATOMIC_MAX_D): 64 x 128 spills a few cold registers yet ran fastest,
# ptxas' spill count is not the cost (tuning: "Atomic backward tiles"). D = 128 here is fp32 alone
# (2-byte inputs take ATOMIC_2BYTE): its ieee dots are FMAs, and 64 x 128's build took 156 s on the
# H200's host, 32 x 64 x 8 warps' 14 s against 109 s on the CI host (tuning: "fp32 atomic build time").
ATOMIC = _tiles({32: (64, 128, 8, 2), 64: (64, 128, 8, 2), 128: (32, 64, 8, 2)})
# 2-byte inputs at D = 128 fit 3 stages, which ran faster than two (tuning: "Atomic backward tiles").
ATOMIC_2BYTE = _tiles({128: (64, 128, 8, 3)})
# + the dS store: spill-free 64 x 64 at D = 64; at D = 128 nothing tried is spill-free, the
# fewest-spill wgmma tile (tuning: "Atomic backward tiles").
ATOMIC_BIAS = _tiles({**ATOMIC, 64: (64, 64, 8, 2), 128: (32, 64, 8, 2)})
# dQ by TMA reduce-add (opt-in): no per-element addresses, so two stages fit at D = 128
# (tuning: "dQ by TMA reduce-add").
ATOMIC_TMA = _tiles({128: (16, 128, 8, 2)})
ATOMIC_TMA_BIAS = _tiles({128: (16, 128, 8, 2)})

# Each kernel kind's table, and the kinds whose 2-byte inputs have entries of their own.
TABLES: Mapping[str, Mapping[int, Tile]] = MappingProxyType({
    "fwd": FWD, "fwd_bias": FWD_BIAS, "fwd_tma_bias": FWD_TMA_BIAS, "fwd_bias_pair": FWD_BIAS_PAIR,
    "dkdv": DKDV, "dq": DQ, "dq_bias": DQ_BIAS, "atomic": ATOMIC, "atomic_bias": ATOMIC_BIAS,
    "atomic_tma": ATOMIC_TMA, "atomic_tma_bias": ATOMIC_TMA_BIAS})
TABLES_2BYTE: Mapping[str, Mapping[int, Tile]] = MappingProxyType({"atomic": ATOMIC_2BYTE, "dkdv": DKDV_2BYTE})


def tile(kind: str, D: int, itemsize: int = 4, overrides: Mapping[str, tuple] | None = None) -> Tile:
    """The tile of one kernel kind at head dim D for inputs of ``itemsize`` bytes: an override of the
    kind first (a '_bias' kind takes its plain kind's, so tests' tiny tiles cover both), then the
    2-byte table, then the table."""
    if overrides:
        if kind in overrides:
            return overrides[kind]
        if kind.endswith("_bias") and kind[:-5] in overrides:
            return overrides[kind[:-5]]
    key = table_key(D)
    if itemsize == 2 and key in TABLES_2BYTE.get(kind, {}):
        return TABLES_2BYTE[kind][key]
    return TABLES[kind][key]


# ---------------------------------------------------------------------------- Gluon tables

# v5: (D, has bias) -> (BLOCK_N, STAGES); Q, the K / V ring and the bias stages stay under a block's
# 227 KB of shared memory (tuning: "v5 forward routes").
WS_FWD_TILES = MappingProxyType({(64, False): (128, 2), (128, False): (128, 2), (64, True): (128, 2),
                                 (128, True): (128, 2)})
# Each of two consumer warpgroups' registers (setmaxnreg), the loader warp keeping 24: the budget v5 was
# built and measured with (research/notes/attention.md, "Eighth session"; tuning: "v5 forward routes").
WS_FWD_CONSUMER_REGS = 232
# v5 with three consumers (192 query rows a CTA), D = 64's winner: BLOCK_N, STAGES, consumer registers,
# maxnreg, consumers (tuning: "v5 forward routes").
WS_THREE = (128, 2, 160, None, 3)
# v6 dK/dV: D -> (BLOCK_M, STAGES); 64 x 2 stages ran fastest despite its spills (tuning: "v6 tiles"); 3 at D 64 for
# the pipe schedule below.
WS_BWD_DKDV_TILES = MappingProxyType({64: (64, 3), 128: (64, 2)})
# v6 dK/dV with the pipe schedule (a tile's dV, dK products behind the next tile's S^T, dP^T), by head dim:
# 1.04-1.10x at D 64 (3 stages alone 1.01-1.02x); spills at D 128 (tuning: "... v6's pipe schedule").
WS_BWD_DKDV_PIPE = frozenset({64})
# v6 dQ: D -> (BLOCK_N, STAGES); BLOCK_N 128 or other stage counts ran within noise (tuning: "v6 tiles"); 4 at D 128
# for the pipe schedule below.
WS_BWD_DQ_TILES = MappingProxyType({64: (64, 3), 128: (64, 4)})
# v6 dQ with the pipe schedule (a tile's dQ product behind the next tile's S, dP), by head dim: 1.02-1.13x at
# D 128 with 4 stages (4 stages alone 1.00-1.07x); 0.91-0.95x at D 64 (tuning: "... v6's pipe schedule").
WS_BWD_DQ_PIPE = frozenset({128})
# v6 dQ with three consumers (192 query rows a CTA), 4 stages and the pipe, (D, causal) -> the least Sq it runs from:
# 1.01-1.09x two consumers there, 0.96-0.99x at 2048 causal and 1024 (tuning: "dQ with three consumers").
WS_BWD_DQ_THREE = MappingProxyType({(64, False): 2048, (64, True): 4096})
WS_BWD_DQ_THREE_CONFIG = (64, 4, 160, 0, 1, 3)
# v6's consumer warpgroups' registers (tuning: "v6 tiles").
WS_BWD_CONSUMER_REGS = 240


def ws_fwd_config(D: int, has_bias: bool, chosen: Optional[tuple] = None) -> tuple:
    """v5's (BLOCK_N, STAGES, consumer registers, maxnreg or None, consumers): ``chosen``, else two
    consumers with WS_FWD_TILES' tile."""
    return tuple(chosen) if chosen is not None else (*WS_FWD_TILES[(D, has_bias)], WS_FWD_CONSUMER_REGS, None, 2)


def ws_bwd_dkdv_config(D: int, chosen: Optional[tuple] = None) -> tuple:
    """v6's dK / dV kernel: (BLOCK_M, STAGES, consumer registers[, register operands: 1 K, 2 K and V[, pipe]])."""
    if chosen is not None:
        return tuple(chosen)
    return (*WS_BWD_DKDV_TILES[D], WS_BWD_CONSUMER_REGS, *((0, 1) if D in WS_BWD_DKDV_PIPE else ()))


def ws_bwd_dq_config(D: int, chosen: Optional[tuple] = None) -> tuple:
    """v6's dQ kernel: (BLOCK_N, STAGES, consumer registers[, register operands: 1 Q, 2 Q and dO[, pipe]])."""
    if chosen is not None:
        return tuple(chosen)
    return (*WS_BWD_DQ_TILES[D], WS_BWD_CONSUMER_REGS, *((0, 1) if D in WS_BWD_DQ_PIPE else ()))


# Blocks a head (query or key blocks of 128; v5's forward: 128 or 192 query rows) where the causal Gluon
# kernels launch by head groups; outside, head by head (v6 measured: 0.95-0.98x at 1024 and 16384,
# 1.02-1.04x between; tuning: "v6 causal launch order"). v5's forward uses the same rule (not yet measured).
CAUSAL_GROUPED_BLOCKS = (16, 64)


def causal_head_group(heads: int, blocks: int, sms: int) -> int:
    """Heads a causal v5 / v6 kernel launches as one group, block-major inside it
    (``gluon_items.lpt_block_head``; 1 is head by head): within ``CAUSAL_GROUPED_BLOCKS``, the smallest
    divisor of ``heads`` whose group fills the SMs once (blocks x group >= sms). Each group then starts
    with its longest CTAs, so the tail is short ones, and about two groups' inputs are read at a time (L2)."""
    lo, hi = CAUSAL_GROUPED_BLOCKS
    if not lo <= blocks <= hi:
        return 1
    for d in range(1, heads + 1):
        if heads % d == 0 and d * blocks >= sms:
            return d
    return heads


# ---------------------------------------------------------------------------- routing rules

# v5 forward: (head dim, causal, bias) -> (least Sq, v5 config or None for two consumers). D = 128 wins
# at every length; D = 64 with three consumers from Sq = 1024 without causal or bias (on the persistent grid
# with two Q buffers, below: 1.05x v3 at S 1024), causal from 256 (two consumers on the persistent grid below 8192:
# WS_PERSISTENT_SPANS), with a bias from 4096 (shorter runs keep v3's resident CTAs); causal with a bias is not
# measured (tuning: "v5 forward routes", "Two Q buffers ... fixed", "Causal work items in pairs").
WS_FWD_RULES = MappingProxyType({
    (128, False, False): (0, None), (128, True, False): (0, None), (128, False, True): (0, None),
    (64, False, False): (1024, WS_THREE), (64, True, False): (256, WS_THREE), (64, False, True): (4096, WS_THREE)})
# v5's persistent grid (no bias): ahead of v5's own grid without causal (tuning: "v5 persistent grid"; at
# D = 64 with two Q buffers, 1.01-1.04x the grid at S 2048-8192); the overlapped consumers at D = 128 run on it
# too (ahead of their own grid by 1-6 % from S = 4096 in two H100 runs; tuning: "Register operands, the
# persistent overlap"). D 128 causal since its items go in pairs: 1.08-1.24x v5's grid at S 512-2048, even
# with the overlap's grid from 4096 (tuning: "Causal work items in pairs").
WS_PERSISTENT_RULES = frozenset({(128, False), (64, False), (128, True)})
# Two Q buffers a consumer on that grid (the next item's Q loads during this one), by (head dim, causal):
# 1.02-1.07x one buffer at D 128 without causal, S 1024-4096, 1.00-1.07x at D 64 (three consumers), bitwise
# equal; causal 0.96-0.97x (H100; tuning: "Two Q buffers"), measured before the causal items went in pairs. The
# overlapped consumers with two chain their items (gluon_overlap.fwd): 1.01-1.04x one buffer's (tuning: "Chained
# work items"); not under causal (0.96-0.99x unchained, tuning: "Causal work items in pairs").
WS_Q_BUFFER_RULES = frozenset({(128, False), (64, False), (128, True)})
# v5's persistent kernel chains its items by default (gluon_fwd.fwd) with these consumer counts: two (D 128)
# 1.025x unchained at S 1024; three (D 64) lose, 0.93-0.99x at S 1024-2048, even at 4096 (H100; tuning:
# "Chained work items").
WS_CHAIN_CONSUMERS = frozenset({2})
# v5 with overlapped consumers (gluon_overlap.py; no bias, v5's tile): (head dim, causal) -> least Sq.
# Ahead of v5 (persistent or not) at D = 128 from S = 4096, behind at 1024; without causal on the persistent
# grid from 2048 (1.017x v5's with two Q buffers there), from 1024 with its items chained (two Q buffers:
# 1.032x v5's there); at D = 64 behind v5's three consumers with two or three overlapped (tuning: "FA3's
# consumer schedule", "The overlap at S 2048", "Chained work items"). Causal on the persistent grid from 2048
# (S 1024: v5's 0.885 / 0.897x cuDNN against the overlap's 0.897 / 0.844, H 16 / GQA; tuning: "Causal work
# items in pairs").
WS_OVERLAP_RULES = MappingProxyType({(128, False): 1024, (128, True): 2048})
# Sq spans (least, first past it, overlapped) where, without a bias, two consumers run on the persistent grid with
# two Q buffers whatever the rules above say, by (head dim, causal). D 64 causal: v5's plain consumers from 256 to
# 2048 (1.14-1.21x v3 at S 256-512 through the call plans; 1.07-1.08x the overlapped ones at S 1024, 0.96-0.97x at
# 2048), the overlapped ones to 8192 (1.02-1.10x the older route at S 1024-4096); v5's three on their own grid lead
# from 8192 (H100; tuning: "Causal work items in pairs", "D 64 causal at S 1024", "v5's slow mode at short S").
WS_PERSISTENT_SPANS = MappingProxyType({(64, True): ((256, 2048, False), (2048, 8192, True))})
# v5's band kernel (windows, bottom-right causal) by head dim: ahead of v3's band forward at D = 128, behind
# it at D = 64 (tuning: "v5 band").
WS_BAND_HEAD_DIMS = frozenset({128})
# Packed sequences (flash_attention_varlen) on v5's forward and v6's backward, by head dim, where the policy asks
# for them: D 128 1.22-1.51x v3's forward, 1.61-1.64x its forward + backward; D 64 0.867x / 0.920x on 16 causal
# documents of 1024 (H100; tuning: "Packed sequences on v5 / v6"). Other head dims keep v3's kernels.
VARLEN_WS_HEAD_DIMS = frozenset({128})
# v6 backward: (head dim, causal) -> least min(Sq, Sk); below it v3's two kernels win (D 64 causal at S 1024).
# D 128 causal from 512: 1.27-1.34x v3's at S 512-1024 on an H100 since call plans (was host-bound) (tuning:
# "v6 backward routes", "D 64 from Sq 2048", "D 64 backward at S 1024").
WS_BWD_RULES = MappingProxyType({(128, False): 1, (128, True): 512, (64, False): 1024, (64, True): 2048})
# The ordered deterministic fused backward, (head dim, bias gradient): slower than the two kernels
# everywhere measured, so opt-in only (tuning: "Ordered dQ").
ORDERED_RULES: frozenset = frozenset()
# The bias-pair forward up to this head dim: 0, halving the bias reads did not pay (tuning: "Bias pair kernel").
BIAS_PAIR_MAX_D = 0
# The fused atomic backward spills even at 16 x 32 tiles above this head dim (tuning: "Atomic backward tiles").
ATOMIC_MAX_D = 128


# ---------------------------------------------------------------------------- the policy

FORWARDS = ("pointer", "tma", "ws")
BACKWARDS = ("two_kernel", "ws", "atomic", "ordered", "cudnn")


@dataclasses.dataclass(frozen=True)
class AttentionPolicy:
    """What one ``flash_attention`` call runs, forward and backward (the backward uses the forward's).

    A path that does not apply to the inputs (hardware, dtype, layout, mask) falls back: the forward
    to v3's pointer kernels (with the bias forwards below), the backward to v3's two kernels. Build
    policies outside ``torch.compile``d code (``choose_policy`` / ``replace``) and pass them in.

    forward:       "pointer" (v3), "tma" (v4: Q/K/V by TMA, no mask or bias), "ws" (v5: the
                   warp-specialized Gluon kernel, sm_90).
    ws_config:     v5's (BLOCK_N, STAGES, consumer registers, maxnreg or None, consumers 2 / 3);
                   None: two consumers with ``WS_FWD_TILES``' tile.
    ws_persistent: v5 on the persistent grid (one CTA an SM) where it applies (no bias; two or three consumers).
    ws_q_buffers:  Q buffers a consumer on that grid (1 or 2; 2: the next work item's Q loads while this one
                   runs), v5's or the overlapped consumers' (``ws_overlap="persistent"``).
    ws_pingpong:   v5's consumers take turns issuing their products.
    ws_overlap:    v5 with overlapped consumers (``gluon_overlap.py``: S_j issued with P_{j-1} V_{j-1}, the
                   softmax beside them) where it applies (no bias, two or three consumers); before
                   ``ws_persistent``. ``"persistent"``: on v5's persistent grid where there are two (the
                   default where ``WS_PERSISTENT_RULES`` and ``WS_OVERLAP_RULES`` both hold).
    ws_q_regs:     those overlapped consumers keep Q in registers, the A operand of S's products (S then
                   reads only K from shared memory; two consumers of 240 registers, else ValueError); opt-in:
                   within noise of Q in shared memory on the H100 (tuning: "Register operands").
    ws_band:       a band (sliding window, bottom-right causal) without mask, bias or score mods runs on
                   v5's band kernel where v5 applies (else v3's pointer kernel), with ``ws_config``'s
                   tile when it has two consumers.
    ws_band_persistent: that band kernel on the persistent grid (one CTA an SM).
    bias_tma:      a bias forward through v4's TMA kernel where the bias has dense rows.
    bias_pair:     a bias shared by the batch, B even, no mask: two batch elements a program.
    bias_batch_fastest: a bias shared by the batch: programs run batch-fastest (one bias tile in L2).
    backward:      "two_kernel" (v3: dK/dV and dQ kernels, deterministic), "ws" (v6: those kernels in
                   Gluon, deterministic), "atomic" (one fused kernel, dQ by fp32 atomics: needs
                   ``deterministic=False``), "ordered" (the fused kernel, dQ added in a fixed order;
                   GPU only, no mask). The fused kernel runs at head dims <= 128 only. "cudnn":
                   PyTorch's cuDNN attention backward on this forward's O and LSE (``cudnn_bwd.py``:
                   plain calls, fp16 / bf16, D <= 128; not reproducible: needs ``deterministic=False``).
    ws_bwd_dq:     v6 also computes dQ (False: v3's dQ kernel after v6's dK / dV).
    ws_bwd_band:   a band (sliding window, bottom-right causal) without mask, bias or score mods runs v6's
                   backward with ``backward="ws"`` where v6 applies (False: v3's two kernels).
    ws_bwd_config, ws_bwd_dq_config: v6's (BLOCK_M or BLOCK_N, STAGES, consumer registers[, register
                   operands]); None: the tables. A 4th field of 1 or 2 keeps the kernel's stationary tiles (K,
                   then V; Q, then dO) in registers as the A operands of S's and dP's products (opt-in: slower
                   on the H100, tuning: "Register operands"). A 5th field of 1 (pipe) defers a tile's dV / dK
                   (dQ) products into the next tile, behind its S and dP products (the tables' default where
                   ``WS_BWD_DKDV_PIPE`` / ``WS_BWD_DQ_PIPE`` say; it needs 3 stages or more).
    ordered_mode:  the ordered kernel's counts: 1 per thread, 2 per warp.
    dq_tma:        the atomic backward adds dQ by a TMA reduce-add where ``ATOMIC_TMA`` has the head dim.
    tiles:         {kernel kind: (BLOCK_M, BLOCK_N, num_warps, num_stages)} over ``TABLES``.
    plans:         an eager call without mask, bias, window or score mod replays its layout's first call
                   (``plans.py``); False: every call decides again.
    """

    # v4 without a bias is opt-in: its TMA loads ran slower than v3's pointer loads (tuning: "v4: TMA forward").
    forward: str = "pointer"
    ws_config: Optional[tuple] = None
    ws_persistent: bool = False
    # 1 here; choose_policy's default takes 2 where WS_Q_BUFFER_RULES say (tuning: "Two Q buffers").
    ws_q_buffers: int = 1
    # Off: turn-taking only added waits, slower or equal everywhere measured (tuning: "v5 ping-pong").
    ws_pingpong: bool = False
    ws_overlap: Union[bool, str] = False
    ws_q_regs: bool = False
    ws_band: bool = False
    # Off: 2-4 % ahead of the band kernel's own grid at window 1024, 6-7 % behind at 4096 (tuning: "v5 band").
    ws_band_persistent: bool = False
    # On: the TMA kernel prefetches the bias tile, the pointer kernel cannot (tuning: "Bias forward by TMA").
    bias_tma: bool = True
    bias_pair: bool = False
    # On: the batch's programs share each bias tile through L2 (tuning: "Bias forward: batch-fastest grid").
    bias_batch_fastest: bool = True
    backward: str = "two_kernel"
    ws_bwd_dq: bool = True
    # On: 1.03-1.37x v3's two kernels on every band measured (tuning: "v6 on a band").
    ws_bwd_band: bool = True
    ws_bwd_config: Optional[tuple] = None
    ws_bwd_dq_config: Optional[tuple] = None
    ordered_mode: int = 1
    # Off: its best tile ran slower than pointer atomics (tuning: "dQ by TMA reduce-add").
    dq_tma: bool = False
    tiles: tuple = ()
    # On: a planned forward + backward spends a fraction of the host time (tuning: "Call plans").
    plans: bool = True
    # The fields as one string: how the torch.library custom ops (which take no objects) receive it.
    key: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.forward not in FORWARDS:
            raise ValueError(f"AttentionPolicy: forward must be one of {FORWARDS}, got {self.forward!r}")
        if self.backward not in BACKWARDS:
            raise ValueError(f"AttentionPolicy: backward must be one of {BACKWARDS}, got {self.backward!r}")
        if self.ws_overlap not in (False, True, "persistent"):
            raise ValueError(f"AttentionPolicy: ws_overlap must be False, True or 'persistent', "
                             f"got {self.ws_overlap!r}")
        if self.ws_q_buffers not in (1, 2) or isinstance(self.ws_q_buffers, bool):
            raise ValueError(f"AttentionPolicy: ws_q_buffers must be 1 or 2, got {self.ws_q_buffers!r}")
        if self.ordered_mode not in (1, 2):
            raise ValueError(f"AttentionPolicy: ordered_mode must be 1 or 2, got {self.ordered_mode!r}")
        tiles = dict(self.tiles)
        unknown = sorted(set(tiles) - set(TABLES))
        if unknown:
            raise ValueError(f"AttentionPolicy: tiles for unknown kernel kinds {unknown}; known: {sorted(TABLES)}")
        put = functools.partial(object.__setattr__, self)
        put("tiles", tuple(sorted((kind, Tile(*map(int, t))) for kind, t in tiles.items())))
        for name in ("ws_config", "ws_bwd_config", "ws_bwd_dq_config"):
            if getattr(self, name) is not None:
                put(name, tuple(getattr(self, name)))
        put("key", json.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}))

    def replace(self, **changes) -> AttentionPolicy:
        """This policy with ``changes`` (a new object; policies are immutable)."""
        return dataclasses.replace(self, **changes)

    def tile(self, kind: str, D: int, itemsize: int = 4) -> Tile:
        return tile(kind, D, itemsize, dict(self.tiles) if self.tiles else None)


@functools.lru_cache(maxsize=256)
def policy_from_key(key: str) -> AttentionPolicy:
    """The policy whose ``key`` this is (a pure function of the string)."""
    return AttentionPolicy(**json.loads(key))


@functools.lru_cache(maxsize=64)
def _policy(forward, ws_config, ws_persistent, ws_band, backward, bias_pair, ws_overlap=False,
            ws_q_buffers=1, ws_bwd_dq_config=None) -> AttentionPolicy:
    # One object per decision: choose_policy runs on every call, a policy's construction is not free.
    return AttentionPolicy(forward=forward, ws_config=ws_config, ws_persistent=ws_persistent, ws_band=ws_band,
                           backward=backward, bias_pair=bias_pair, ws_overlap=ws_overlap, ws_q_buffers=ws_q_buffers,
                           ws_bwd_dq_config=ws_bwd_dq_config)


def choose_policy(head_dim: int, seq_q: int, seq_k: int, *, causal: bool = False, has_bias: bool = False,
                  has_mask: bool = False, bias_grad: bool = False, deterministic: bool = True) -> AttentionPolicy:
    """The default policy for a call: the forward by ``WS_FWD_RULES`` (v5, else v3; v4's TMA kernel is
    opt-in; a band's on v5's band kernel where ``WS_BAND_HEAD_DIMS`` has the head dim; v5's overlapped
    consumers by ``WS_OVERLAP_RULES`` and ``WS_PERSISTENT_SPANS``), the backward
    by ``deterministic`` (the atomic kernel up to ``ATOMIC_MAX_D``), else by ``WS_BWD_RULES`` (v6, its dQ kernel
    with three consumers by ``WS_BWD_DQ_THREE``) and ``ORDERED_RULES``, else v3's two kernels."""
    causal = bool(causal)
    rule = WS_FWD_RULES.get((head_dim, causal, bool(has_bias)))
    forward = "ws" if rule is not None and not has_mask and seq_q >= rule[0] else "pointer"
    least = WS_BWD_RULES.get((head_dim, causal))
    if not deterministic:
        backward = "atomic" if head_dim <= ATOMIC_MAX_D else "two_kernel"
    elif not has_mask and not has_bias and least is not None and min(seq_q, seq_k) >= least:
        backward = "ws"
    elif not has_mask and head_dim <= ATOMIC_MAX_D and (head_dim, bool(bias_grad)) in ORDERED_RULES:
        backward = "ordered"
    else:
        backward = "two_kernel"
    persistent = (head_dim, causal) in WS_PERSISTENT_RULES
    overlap = seq_q >= WS_OVERLAP_RULES.get((head_dim, causal), float("inf"))
    q_buffers = 2 if persistent and (head_dim, causal) in WS_Q_BUFFER_RULES else 1
    config = rule[1] if rule is not None else None
    for lo, past, overlapped in WS_PERSISTENT_SPANS.get((head_dim, causal), ()):
        if not has_bias and lo <= seq_q < past:
            config, persistent, overlap, q_buffers = None, True, overlapped, 2
    three = backward == "ws" and seq_q >= WS_BWD_DQ_THREE.get((head_dim, causal), float("inf"))
    return _policy(forward, config, persistent, head_dim in WS_BAND_HEAD_DIMS, backward, head_dim <= BIAS_PAIR_MAX_D,
                   "persistent" if overlap and persistent else overlap, q_buffers,
                   WS_BWD_DQ_THREE_CONFIG if three else None)


@functools.lru_cache(maxsize=64)
def choose_varlen_policy(head_dim: int, max_q: int, max_k: int, *, causal: bool = False) -> AttentionPolicy:
    """``flash_attention_varlen``'s default policy: ``choose_policy``'s at the max lengths, with v3's forward and
    backward where ``VARLEN_WS_HEAD_DIMS`` lacks the head dim."""
    policy = choose_policy(head_dim, max_q, max_k, causal=causal)
    if head_dim in VARLEN_WS_HEAD_DIMS:
        return policy
    return policy.replace(forward="pointer" if policy.forward == "ws" else policy.forward,
                          backward="two_kernel" if policy.backward == "ws" else policy.backward)


# ---------------------------------------------------------------------------- against SDPA

# Where PyTorch's SDPA (its own backend pick: cuDNN on sm_90) ran faster than flash_attention, for callers
# that may run either (``integrations.transformers``' "tilewise_auto"): (compute capability, backward,
# head dim, causal) -> the least sequence length from which flash_attention measured faster, or (least, first
# past it) where it measured faster only between; None: SDPA at every length measured. Forward + backward
# (backward=True) was SDPA everywhere on the H200 (0.67-0.93x of cuDNN, before v6's three dQ consumers) but D 64
# causal from 4096 to 16384 (H100: 1.034-1.046x cuDNN at B 4 H 32 / 8 S 4096 in four processes, 1.042-1.050x at
# S 8192; ~0.99x at 16384, where our forward with cuDNN's backward leads); the forward alone is ours at D = 64
# from S = 8,192 (1.02-1.11x) (tuning: "Against SDPA", "The backward along S").
# Capabilities and head dims not here were not measured: flash_attention keeps them.
SDPA_RULES = MappingProxyType({
    ((9, 0), True, 64, False): None, ((9, 0), True, 64, True): (4096, 16384),
    ((9, 0), True, 128, False): None, ((9, 0), True, 128, True): None,
    ((9, 0), False, 64, False): 8192, ((9, 0), False, 64, True): 8192,
    ((9, 0), False, 128, False): None, ((9, 0), False, 128, True): None})


def prefer_sdpa(capability: tuple, head_dim: int, seq: int, causal: bool, backward: bool) -> bool:
    """Whether SDPA measured faster than flash_attention for a self-attention call (Sq = Sk = ``seq``, no
    mask, bias, window or score mod) on a GPU of ``capability``; ``backward``: its gradients will be
    taken (the forward + backward decides). False where ``SDPA_RULES`` has no entry."""
    key = (tuple(capability), bool(backward), head_dim, bool(causal))
    if key not in SDPA_RULES:
        return False
    rule = SDPA_RULES[key]
    if rule is None:
        return True
    least, past = rule if isinstance(rule, tuple) else (rule, float("inf"))
    return not least <= seq < past


def cudnn_backward_pays(capability: tuple, head_dim: int, seq: int, causal: bool) -> bool:
    """Whether a self-attention call whose gradients follow should run our forward with cuDNN's backward
    (policy backward "cudnn"): where ``SDPA_RULES`` put the backward on SDPA but the forward alone on us."""
    return (prefer_sdpa(capability, head_dim, seq, causal, True)
            and not prefer_sdpa(capability, head_dim, seq, causal, False)
            and (tuple(capability), False, head_dim, bool(causal)) in SDPA_RULES)
