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


def run(cfg, rng, mutations=(), max_steps=200000):
    cta = CTA(cfg)
    actors = {"loader": loader(cta, mutations)}
    for w in range(cfg["NUM_CONS"]):
        actors[f"consumer{w}"] = consumer(cta, w, mutations)
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


def sweep(seeds, mutations=()):
    """Every config x seed; the first fault of each (causal, Q_BUFS, NUM_CONS, STAGES), and the run count."""
    faults, n = {}, 0
    for cfg in configs():
        for seed in range(seeds):
            n += 1
            try:
                run(cfg, random.Random(seed), mutations)
            except Fault as e:
                key = (cfg["causal"], cfg["Q_BUFS"], cfg["NUM_CONS"], cfg["STAGES"])
                faults.setdefault(key, (cfg, seed, str(e)))
    return faults, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    faults, n = sweep(args.seeds)
    print(f"the kernel as written: {n} runs")
    for key, (cfg, seed, msg) in sorted(faults.items()):
        print(f"  causal={key[0]} Q_BUFS={key[1]} NUM_CONS={key[2]} STAGES={key[3]}: {msg} (first: {cfg}, seed {seed})")
    if not faults:
        print("  no fault in any schedule")
    for m in ("early release", "one-buffer parity"):  # planted faults: the checker must find them
        found, n = sweep(max(2, args.seeds // 4), (m,))
        print(f"planted fault '{m}': found in {len(found)} of the (causal, Q_BUFS, NUM_CONS, STAGES) groups")


if __name__ == "__main__":
    main()
