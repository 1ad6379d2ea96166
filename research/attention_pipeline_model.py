"""A model checker for v5's persistent forward pipeline (``gluon_fwd._ploader`` / ``_pconsumer``): the
loader and the consumers as coroutines, mbarriers with the hardware's parity waits (a barrier two phases
ahead reads as not complete), TMA copies that land at random later steps, and every shared-memory read
checked against the tile it should see, at the product's issue and again at its wait (an async wgmma
reads somewhere in between). Random interleavings, many seeds, CPU only.

Why: ``research/patches/persistent-q-buffers.patch`` (two Q buffers a consumer, ``Q_BUFS``) gave bitwise
equal outputs without causal and wrong ones with causal on the H100 (f38f538). This separates a fault of
the barrier protocol (found here, with the schedule that shows it) from one below it (compiler, hardware),
for the kernel as written in that patch: the same work-item order (``_ptile``, the causal snake; since a35a614
``gluon_items.persistent_item``'s pairs), the same key-tile counts (``kv_tiles``), the same buffer indices and
parities.

Run: python3 research/attention_pipeline_model.py [--seeds N]
"""
import argparse
import itertools
import random


class Bar:
    """An mbarrier: ``count`` arrivals and the expected transaction bytes complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _settle(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self):
        assert self.pending > 0, "more arrivals than the barrier's count in one phase"
        self.pending -= 1
        self._settle()

    def expect(self, nbytes):  # mbarrier.arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, "a copy landed on a barrier that did not expect it"
        self._settle()

    def passed(self, parity):  # try_wait.parity: the phase of that parity has completed
        return (self.phase & 1) != parity


class Fault(Exception):
    pass


def ptile(tile, n_m, bh_count, nprog, causal):
    """``gluon_items.persistent_item`` (the causal pairs since a35a614; the sorted walk with its snake before):
    (query tile, batch x head) of work item ``tile``."""
    if causal:
        r, odd = tile // nprog, (tile // nprog) % 2
        p, base = tile - r * nprog, (r - odd) * nprog
        two = max(n_m * bh_count - base - nprog, 0)
        g = base + 2 * p + odd + (1 - odd) * (p >= two) * (two - p - odd)
        pair = max(n_m - n_m % 2, 1)
        if g >= (n_m - n_m % 2) * bh_count:  # an odd n_m's middle tiles
            return n_m // 2, g - (n_m - n_m % 2) * bh_count
        bh, j = divmod(g, pair)
        return (j // 2 if j % 2 else n_m - 1 - j // 2), bh
    return tile % n_m, tile // n_m


def kv_tiles(start_m, sk, bm, bn, causal):
    hi = min(sk, (start_m + 1) * bm) if causal else sk
    return -(-hi // bn)


class CTA:
    """One persistent CTA: shared buffers (tags of what they hold), barriers, copies in flight."""

    def __init__(self, cfg):
        self.cfg = cfg
        qb, nc, st = cfg["Q_BUFS"], cfg["NUM_CONS"], cfg["STAGES"]
        self.q = [None] * (qb * nc)
        self.k = [None] * st
        self.v = [None] * st
        self.q_bar = [Bar(1) for _ in range(qb * nc)]
        self.q_empty = [Bar(1) for _ in range(qb * nc)]
        self.k_ready, self.v_ready = [Bar(1) for _ in range(st)], [Bar(1) for _ in range(st)]
        self.k_empty, self.v_empty = [Bar(nc) for _ in range(st)], [Bar(nc) for _ in range(st)]
        self.turn = [Bar(1), Bar(1)]  # gluon_overlap's STAGGER: q_bar[NQ] (0's softmax(S_0)), [NQ + 1] (1's S_0)
        self.copies = []  # (buffer list, index, tag, barrier)

    def tma(self, buf, i, tag, bar):
        bar.expect(1)
        self.copies.append((buf, i, tag, bar))

    def items(self):
        c = self.cfg
        n_m = -(-c["Sq"] // (64 * c["NUM_CONS"]))
        total = n_m * c["BH"]
        for tile in range(c["pid"], total, c["nprog"]):
            start_m, bh = ptile(tile, n_m, c["BH"], c["nprog"], c["causal"])
            yield start_m, bh, kv_tiles(start_m, c["Sk"], 64 * c["NUM_CONS"], c["BLOCK_N"], c["causal"])


def loader(cta, mutations=()):
    c = cta.cfg
    qb, nc, st = c["Q_BUFS"], c["NUM_CONS"], c["STAGES"]
    slot = 0
    for it, (start_m, bh, n_tiles) in enumerate(cta.items()):
        for w in range(nc):
            b = (it % qb) * nc + w
            par = ((it & 1) if "one-buffer parity" in mutations else ((it // qb) & 1)) ^ 1
            yield lambda b=b, par=par: cta.q_empty[b].passed(par)
            cta.tma(cta.q, b, ("Q", bh, start_m, w), cta.q_bar[b])
        for j in range(n_tiles):
            s, ph = (slot + j) % st, ((slot + j) // st) & 1
            yield lambda s=s, ph=ph: cta.k_empty[s].passed(ph ^ 1)
            cta.tma(cta.k, s, ("K", bh, j), cta.k_ready[s])
            yield lambda s=s, ph=ph: cta.v_empty[s].passed(ph ^ 1)
            cta.tma(cta.v, s, ("V", bh, j), cta.v_ready[s])
        slot += n_tiles


def consumer(cta, which, mutations=()):
    c = cta.cfg
    qb, nc, st = c["Q_BUFS"], c["NUM_CONS"], c["STAGES"]
    slot = 0

    def check(buf, i, want, what):
        if buf[i] != want:
            raise Fault(f"consumer {which} read {what}[{i}] = {buf[i]}, wanted {want}")

    for it, (start_m, bh, n_tiles) in enumerate(cta.items()):
        b = (it % qb) * nc + which
        par = (it // qb) & 1
        yield lambda b=b, par=par: cta.q_bar[b].passed(par)
        if "early release" in mutations:  # Q freed before its products
            cta.q_empty[b].arrive()
        for j in range(n_tiles):
            s, ph = (slot + j) % st, ((slot + j) // st) & 1
            yield lambda s=s, ph=ph: cta.k_ready[s].passed(ph)
            for _ in range(2):  # S = Q K^T issued, then waited on
                check(cta.q, b, ("Q", bh, start_m, which), "Q")
                check(cta.k, s, ("K", bh, j), "K")
                yield None
            cta.k_empty[s].arrive()
            yield None  # softmax
            yield lambda s=s, ph=ph: cta.v_ready[s].passed(ph)
            for _ in range(2):  # O += P V issued, then waited on
                check(cta.v, s, ("V", bh, j), "V")
                yield None
            cta.v_empty[s].arrive()
        if "early release" not in mutations:
            cta.q_empty[b].arrive()  # after the item's last product (the patch's order)
        yield None  # epilogue
        slot += n_tiles


def chain_loader(cta, mutations=()):
    """``gluon_fwd._chain_ploader``: the walk, then a spare Q a consumer and one spare K tile."""
    c = cta.cfg
    qb, nc, st = c["Q_BUFS"], c["NUM_CONS"], c["STAGES"]
    yield from loader(cta, mutations)
    items = list(cta.items())
    it, slot = len(items), sum(n for _, _, n in items)
    for w in range(nc):
        b = (it % qb) * nc + w
        yield lambda b=b, par=((it // qb) & 1) ^ 1: cta.q_empty[b].passed(par)
        cta.tma(cta.q, b, ("Q", "spare", w), cta.q_bar[b])
    s, ph = slot % st, (slot // st) & 1
    yield lambda: cta.k_empty[s].passed(ph ^ 1)
    cta.tma(cta.k, s, ("K", "spare"), cta.k_ready[s])


def chain_consumer(cta, which, stagger=False, mutations=()):
    """``gluon_overlap._chain_pconsumer`` with ``gluon_fwd.chain_item_end`` (two Q buffers), in the kernel's
    order: an item's last P V issued with the next item's S_0 (past the last item, the loader's spares), P V
    waited and its stage freed, the epilogue, S_0 waited; ``stagger``: the turns around S_0's issue."""
    c = cta.cfg
    qb, nc, st = c["Q_BUFS"], c["NUM_CONS"], c["STAGES"]
    items = list(cta.items())

    def check(buf, i, want, what):
        if buf[i] != want:
            raise Fault(f"consumer {which} read {what}[{i}] = {buf[i]}, wanted {want}")

    def wants(it):  # item it's Q and first K tile (past the last item: the spares)
        if it < len(items):
            return ("Q", items[it][1], items[it][0], which), ("K", items[it][1], 0)
        return ("Q", "spare", which), ("K", "spare")

    def issue_s0(it, slot, b):
        yield lambda: cta.q_bar[b].passed((it // qb) & 1)
        yield lambda: cta.k_ready[slot % st].passed((slot // st) & 1)
        if stagger and (which == 1 or it > 0) and not (which == 0 and "one-sided turn" in mutations):
            # 1 waits for 0's softmax(S_0) of item it; 0 for 1's S_0 of item it - 1
            par = (it & 1) if "turn parity" in mutations else ((it - 1 + which) & 1)
            yield lambda: cta.turn[1 - which].passed(par)
        check(cta.q, b, wants(it)[0], "Q")
        check(cta.k, slot % st, wants(it)[1], "K")
        if stagger and which == 1:
            cta.turn[1].arrive()

    slot, it, b = 0, 0, which
    yield from issue_s0(0, 0, b)
    yield None
    check(cta.q, b, wants(0)[0], "Q")  # S_0 waited
    check(cta.k, 0, wants(0)[1], "K")
    cta.k_empty[0].arrive()
    yield None  # softmax(S_0)
    if stagger and which == 0:
        cta.turn[0].arrive()
    for start_m, bh, n_tiles in items:
        for j in range(1, n_tiles):
            r = slot + j
            s, sp = r % st, (r - 1) % st
            yield lambda s=s, r=r: cta.k_ready[s].passed((r // st) & 1)
            yield lambda sp=sp, r=r: cta.v_ready[sp].passed(((r - 1) // st) & 1)
            check(cta.q, b, ("Q", bh, start_m, which), "Q")
            check(cta.k, s, ("K", bh, j), "K")
            check(cta.v, sp, ("V", bh, j - 1), "V")
            yield None  # S_j and P_{j-1} V_{j-1} issued; S_j waited
            check(cta.q, b, ("Q", bh, start_m, which), "Q")
            check(cta.k, s, ("K", bh, j), "K")
            cta.k_empty[s].arrive()
            yield None  # softmax(S_j) while P V runs
            check(cta.v, sp, ("V", bh, j - 1), "V")
            cta.v_empty[sp].arrive()
        cta.q_empty[b].arrive()
        last = slot + n_tiles - 1
        it += 1
        slot += n_tiles
        sl = last % st
        yield lambda sl=sl, last=last: cta.v_ready[sl].passed((last // st) & 1)
        check(cta.v, sl, ("V", bh, n_tiles - 1), "V")  # the last P V issued
        b = (it % qb) * nc + which
        yield from issue_s0(it, slot, b)
        yield None
        check(cta.v, sl, ("V", bh, n_tiles - 1), "V")  # P V waited
        cta.v_empty[sl].arrive()
        yield None  # epilogue
        check(cta.q, b, wants(it)[0], "Q")  # S_0 waited
        check(cta.k, slot % st, wants(it)[1], "K")
        cta.k_empty[slot % st].arrive()
        yield None  # softmax(S_0)
        if stagger and which == 0:
            cta.turn[0].arrive()


def run(cfg, rng, mutations=(), max_steps=200000):
    cta = CTA(cfg)
    chain = cfg.get("chain")
    actors = {"loader": (chain_loader if chain else loader)(cta, mutations)}
    for w in range(cfg["NUM_CONS"]):
        actors[f"consumer{w}"] = (chain_consumer(cta, w, cfg.get("stagger"), mutations) if chain
                                  else consumer(cta, w, mutations))
    waiting = {name: None for name in actors}  # the predicate each actor blocks on (None: runnable)
    # Each run its own speeds (a slow consumer, late copies): uniform picks rarely reach the far orders.
    speed = {name: rng.random() ** 3 + 1e-3 for name in [*actors, "tma"]}
    for _ in range(max_steps):
        ready = [n for n in actors if waiting[n] is None or waiting[n]()]
        choices = ready + (["tma"] if cta.copies else [])
        if not choices:
            if actors:
                raise Fault(f"deadlock: {sorted(actors)} blocked, no copy in flight")
            return
        pick = rng.choices(choices, [speed[x] for x in choices])[0]
        if pick == "tma":
            buf, i, tag, bar = cta.copies.pop(rng.randrange(len(cta.copies)))
            buf[i] = tag
            bar.complete_tx(1)
            continue
        try:
            waiting[pick] = next(actors[pick])
        except StopIteration:
            del actors[pick], waiting[pick]
    raise Fault("step limit")


def configs():
    for causal, qb, nc, stages, (sq, bh, nprog) in itertools.product(
            (False, True), (1, 2), (2, 3), (2, 3), ((1031, 3, 2), (2048, 4, 3), (777, 5, 7), (1, 2, 1), (4096, 2, 5))):
        for pid in range(min(nprog, 3)):
            yield dict(causal=causal, Q_BUFS=qb, NUM_CONS=nc, STAGES=stages, Sq=sq, Sk=sq, BH=bh, nprog=nprog,
                       pid=pid, BLOCK_N=128)


def chain_configs():
    """The chained overlap (two consumers, two Q buffers), staggered or not; items of one key tile (Sk 100)."""
    for causal, stagger, stages, (sq, sk, bh, nprog) in itertools.product(
            (False, True), (False, True), (2, 3),
            ((1031, 1031, 3, 2), (2048, 2048, 4, 3), (777, 777, 5, 7), (1, 1, 2, 1), (1031, 100, 3, 2),
             (4096, 4096, 2, 5), (640, 100, 4, 3))):
        for pid in range(min(nprog, 3)):
            yield dict(causal=causal, chain=True, stagger=stagger, Q_BUFS=2, NUM_CONS=2, STAGES=stages, Sq=sq, Sk=sk,
                       BH=bh, nprog=nprog, pid=pid, BLOCK_N=128)


def sweep(seeds, mutations=(), chain=False):
    """Every config x seed; the first fault of each (causal, Q_BUFS, NUM_CONS, STAGES[, stagger]), and the run
    count."""
    faults, n = {}, 0
    for cfg in chain_configs() if chain else configs():
        for seed in range(seeds):
            n += 1
            try:
                run(cfg, random.Random(seed), mutations)
            except Fault as e:
                key = (cfg["causal"], cfg["Q_BUFS"], cfg["NUM_CONS"], cfg["STAGES"], cfg.get("stagger"))
                faults.setdefault(key, (cfg, seed, str(e)))
    return faults, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--chain", action="store_true", help="the chained overlap (gluon_overlap), staggered or not")
    args = ap.parse_args()
    faults, n = sweep(args.seeds, chain=args.chain)
    print(f"the kernel as written{' (chained)' if args.chain else ''}: {n} runs")
    for key, (cfg, seed, msg) in sorted(faults.items(), key=str):
        print(f"  causal={key[0]} Q_BUFS={key[1]} NUM_CONS={key[2]} STAGES={key[3]} stagger={key[4]}: {msg} "
              f"(first: {cfg}, seed {seed})")
    if not faults:
        print("  no fault in any schedule")
    planted = ("turn parity", "one-sided turn") if args.chain else ("early release", "one-buffer parity")
    for m in planted:  # planted faults: the checker must find them
        found, n = sweep(max(2, args.seeds // 4), (m,), chain=args.chain)
        print(f"planted fault '{m}': found in {len(found)} of the (causal, Q_BUFS, NUM_CONS, STAGES, stagger) groups")


if __name__ == "__main__":
    main()
