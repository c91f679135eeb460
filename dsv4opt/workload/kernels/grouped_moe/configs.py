"""grouped-moe's tile choices: one small explicit table keyed on the expert shape and the slot count.

The kernels see (experts R, width I, hidden d) and the slots M * k of the call. At concurrency C a
dp-ep rank (32 whole experts, I 2048) sees 8C gathered tokens, 48C slots; a tp4 rank (256 experts
sharded to I 512) its own C tokens, 6C slots; tp8 the same with I 256. Rows are chosen per bucket
of slots, the first whose bound holds. `python -m dsv4opt.optimizations.grouped_moe.bench --sweep`
times `candidates(...)` on a GPU so one run can pick each row (docs/optimizations/grouped_moe.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GemmTiles:
    """One GEMM's launch: bn weight rows a work item (the MMA's wide side; for gate/up bn of gate
    and the same bn of up), bk columns a step (whole 64-column units), warps, pipeline stages, the
    K split, persistent programs an SM (capped at what fits), whether one loop runs over
    (item, K step) so the pipeline does not drain between items (flat), a register cap a thread
    (ptxas' maxnreg) so that more programs fit an SM, or None, and whether the item and K-step counts
    are compile-time constants (static: the flat loop divides by them every K step). ws: the GEMM's
    warp-specialised Gluon kernel (ws.py: a producer warp feeds the decoding warpgroup;
    its fixed tiles, routed tiles of 16, no split, sm_90 under Triton 3.6, else the Triton kernel runs
    with these tiles; the table's ws rows give way to the Triton rows they replaced, `choose(ws=False)`).
    direct: the slotwise Gluon kernels that load each lane's weight bytes straight into its mma.sync
    fragments (direct.py; both GEMMs or neither, slotwise configs only, where the ws
    kernels run): bn act rows an item (gate/up) or output rows (down), bk 64 (a unit a step), warps,
    the K split; their rows give way as the ws rows do."""

    bn: int
    bk: int
    warps: int
    stages: int
    split: int = 1
    ctas: int = 4
    flat: bool = False
    maxnreg: int | None = None
    static: bool = False
    ws: bool = False
    direct: bool = False

    def short(self) -> str:
        return (f"{self.bn}x{self.bk}w{self.warps}s{self.stages}k{self.split}c{self.ctas}{'f' if self.flat else ''}"
                + (f"r{self.maxnreg}" if self.maxnreg else "") + ("t" if self.static else "") + ("ws" if self.ws else "") + ("d" if self.direct else ""))

    @property
    def gluon(self) -> bool:
        """Runs a Gluon kernel (warp-specialised or direct): only where `ws.ws_runs_on`."""
        return self.ws or self.direct


@dataclass(frozen=True)
class MoeConfig:
    """bm slots a tile (the MMA's narrow side), and the two GEMMs' launches. slotwise: each slot a
    tile of its own, its expert read from the router's ids (no routing launch; an expert two slots
    share is read twice; another rank's slot still streams expert 0's weights, masked) and the combine
    done by down's last item a token (no combine launch): for the few slots of tp4 at C = 1."""

    bm: int
    up: GemmTiles
    down: GemmTiles
    slotwise: bool = False

    @property
    def name(self) -> str:
        return (f"m{self.bm} up {self.up.short()} down {self.down.short()}"
                + (" slotwise" if self.slotwise else ""))


_UP = GemmTiles(bn=64, bk=128, warps=4, stages=4)
_DOWN = GemmTiles(bn=128, bk=128, warps=4, stages=4)
# gate/up warp-specialised (ws.py): its fixed tiles, 2 programs an SM, no K split, 6 stages
# (4 and 6 within 0.8 us of each other in the sweep below; 6 ahead in all six rows)
_UP_WS = GemmTiles(bn=64, bk=128, warps=4, stages=6, split=1, ctas=2, ws=True)
# down warp-specialised: its fixed tiles, 6 stages (within 1.8 us of 4 in the sweep; ahead in 4 rows of 6)
_DOWN_WS = GemmTiles(bn=128, bk=128, warps=4, stages=6, split=1, ctas=2, ws=True)

def direct_config(up: tuple[int, int, int], down: tuple[int, int, int]) -> MoeConfig:
    """A slotwise config on the direct kernels from each GEMM's (warps, units of 16 rows a warp, K split):
    gate/up's bn its act rows (half its weight rows), down's its output rows."""
    (uw, ur, us), (dw, dr, ds) = up, down
    return MoeConfig(16, GemmTiles(bn=8 * uw * ur, bk=64, warps=uw, stages=1, split=us, ctas=1, direct=True),
                     GemmTiles(bn=16 * dw * dr, bk=64, warps=dw, stages=1, split=ds, ctas=1, direct=True), slotwise=True)


# (R, I, d) -> [(most slots, config)], ascending. Split K where few tiles would leave SMs idle:
# dp-ep at C = 1 uses 6 of 32 experts, tp4 at C = 1 6 of 256 (docs: work items per round).
TABLE: dict[tuple[int, int, int], list[tuple[int, MoeConfig]]] = {
    # dp-ep: 8C gathered tokens, 48C slots. From the H200 sweep (evidence/h200/grouped_moe/sweep_f0fc69d.log):
    # at C = 1 the K splits halved (66.8 -> 54.3 us); from C = 16 both GEMMs capped at 128 registers
    # (C = 16/32: 200.7/216.9 -> 187.0/191.7 us). C = 64 takes the same row (237.5 -> 213.8 us in a second
    # sweep, inline-routing-cc322e7/sweep_dpep64_cc322e7.log).
    # From C = 2 both GEMMs warp-specialised (a producer warp feeds the decoding warpgroup): gate/up at
    # C = 16/32/64 187.0/192.4/215.8 -> 169.8/178.2/201.4 us (evidence/h200/grouped_moe/sweep_ws_3530681.log),
    # then down too: 169.7/174.4/196.6 -> 150.6/155.7/178.8 us (sweep_wsdown_f977d8b.log); C = 4 and 8
    # swept around it (sweep_c4-8_7936b5b.log: nothing faster by more than 0.2 us); C = 2 unswept.
    (32, 2048, 4096): [
        (48, MoeConfig(16, replace(_UP, split=2), replace(_DOWN, split=2))),
        (1 << 62, MoeConfig(16, _UP_WS, _DOWN_WS)),
    ],
    # tp4: C tokens, 6C slots. From the H200 sweeps (evidence/h200/grouped_moe/sweep_tp4_5a39fce.log,
    # sweep_f0fc69d.log): down's K is 512, four steps of 128, so its nested loop drains the pipeline every
    # item; the flat loop keeps it full (C = 16/32/64: 168/272/378 -> 154/250/345 us with down flat alone),
    # and from C = 16 gate/up has items enough without a K split (-> 157/240/330 with no split alone);
    # gate/up under 128 registers then gains 1-2% more (144.8/218.0/298.8 -> 142.3/213.7/295.8), within the
    # bench's run-to-run spread: kept because no sweep row was slower with it.
    # C = 2 (row 12) was not swept: down flat as at C = 1 and 16, gate/up's split unchanged. C = 3-4 take
    # the warp-specialised row: C = 4 65.7 -> 47.0 us (evidence/h200/grouped_moe/sweep_c4-8_7936b5b.log);
    # C = 3 unswept.
    # At C = 1 slotwise (no routing or combine launch; down nested): 29.3 -> 25.0 us; down's item and
    # K-step counts as constants (static) gained at every C swept (C = 1/16/32/64: 29.3/139.0/209.5/290.1
    # -> 28.8/137.3/206.0/285.6 us, 1.2-1.7%, each inside the bench's ~2% spread but all one way),
    # evidence/h200/grouped_moe/sweep_c4d4601.log. Then gate/up warp-specialised: C = 16/32/64
    # 135.9/200.3/286.1 -> 124.7/183.1/259.9 us (evidence/h200/grouped_moe/sweep_ws_3530681.log); then down
    # too: 124.3/181.9/257.1 -> 115.9/165.1/232.8 us (sweep_wsdown_f977d8b.log; one program an SM: slower).
    # To C = 4 the direct kernels (direct.py: each lane's weight bytes straight into its
    # mma.sync fragments): C = 1/2/3/4 24.9/38.2/43.6/47.4 -> 14.3/20.3/28.3/34.2 us with these tiles
    # (evidence/h200/grouped_moe/sweep_direct_c1-4_9ff02cf.log; the best at C = 1 and 4, within 0.1 us of
    # it at C = 2 and 1.4 us at C = 3, inside the sweep's spread of the next tiles). C = 5-8 not swept.
    (256, 512, 4096): [
        (24, direct_config((4, 1, 4), (4, 1, 1))),
        (1 << 62, MoeConfig(16, _UP_WS, _DOWN_WS)),
    ],
    (256, 256, 4096): [  # tp8
        (6, MoeConfig(16, replace(_UP, split=8), replace(_DOWN, split=2))),
        (24, MoeConfig(16, replace(_UP, split=8), _DOWN)),
        (96, MoeConfig(16, replace(_UP, split=4), _DOWN)),
        (1 << 62, MoeConfig(16, replace(_UP, split=2), _DOWN)),
    ],
}

# The Triton rows the Gluon ones (warp-specialised, direct) replaced, for where those cannot run (another
# Triton, another GPU, the CPU): the table as it stood before them (commit d45e7f8).
_TRITON_ROWS: dict[tuple[int, int, int], list[tuple[int, MoeConfig]]] = {
    (32, 2048, 4096): [
        (48, TABLE[(32, 2048, 4096)][0][1]),
        (1 << 62, MoeConfig(16, replace(_UP, maxnreg=128), replace(_DOWN, maxnreg=128))),
    ],
    (256, 512, 4096): [
        (6, MoeConfig(16, replace(_UP, split=8), replace(_DOWN, split=2), slotwise=True)),
        (24, MoeConfig(16, replace(_UP, split=4), replace(_DOWN, flat=True, static=True))),
        (1 << 62, MoeConfig(16, replace(_UP, maxnreg=128), replace(_DOWN, flat=True, static=True))),
    ],
}

# Slot counts up to which the sweep tries slotwise configs: an expert two slots share is read twice
# (none at tp4 C = 1, 6 slots on 256 experts), and another rank's slot streams expert 0 for nothing
# (dp-ep C = 1, 48 slots, 7 in 8 elsewhere: 285 us slotwise against 52 us routed on the H200,
# evidence/h200/grouped_moe/sweep_c4d4601.log).
_SLOTWISE_MOST = 24

# Shapes off the table (the small test shapes, other models): split K when the tiles are few.
_GENERIC = [(64, MoeConfig(16, replace(_UP, split=2), _DOWN)), (1 << 62, MoeConfig(16, _UP, _DOWN))]


def choose(experts: int, width: int, hidden: int, slots: int, ws: bool = True) -> MoeConfig:
    """The table's config for this shape and slot count; with ws False (the Gluon kernels, warp-specialised
    or direct, cannot run here) the Triton row a Gluon one replaced."""
    key = (experts, width, hidden)
    cfg = next(c for bound, c in TABLE.get(key, _GENERIC) if slots <= bound)
    if not ws and (cfg.up.gluon or cfg.down.gluon):
        cfg = next(c for bound, c in _TRITON_ROWS[key] if slots <= bound)
    return cfg


def candidates(experts: int, width: int, hidden: int, slots: int) -> list[MoeConfig]:
    """A handful of configs around the table's choice, for the GPU sweep: the K split of each GEMM
    halved and doubled, wider weight tiles on 8 warps, a deeper pipeline, more programs an SM."""
    base = choose(experts, width, hidden, slots)
    triton = choose(experts, width, hidden, slots, ws=False)
    root = triton if base.up.direct else base  # direct GEMMs go in pairs: vary the Triton row they replaced
    # the variations below are of the Triton kernels' tiles (the ws kernels' are fixed): of the row a
    # ws row replaced, which is timed too
    up = triton.up if base.up.gluon else base.up
    dn = triton.down if base.down.gluon else base.down
    out = [
        base,
        triton,
        replace(root, up=up),
        replace(root, up=replace(up, split=max(1, up.split // 2)), down=replace(dn, split=max(1, dn.split // 2))),
        replace(root, up=replace(up, split=up.split * 2), down=replace(dn, split=dn.split * 2)),
        replace(root, up=replace(up, bn=128, warps=8), down=replace(dn, bn=256, warps=8)),
        replace(root, up=replace(up, stages=up.stages + 2, bk=64), down=replace(dn, stages=dn.stages + 2, bk=64)),
        replace(root, up=replace(up, flat=not up.flat), down=replace(dn, flat=not dn.flat)),
        replace(root, up=replace(up, ctas=2), down=replace(dn, ctas=2)),
        replace(root, bm=16 if root.bm == 32 else 32, up=up, down=dn),  # the ws kernels tile 16 slots
        # One GEMM at a time, since the slot's time is the two GEMMs' sum: tp4's down has K = 512
        # (four steps of 128) and can drain its pipeline between items, gate/up K = 4096.
        replace(root, down=replace(dn, flat=not dn.flat)),
        replace(root, down=replace(dn, split=dn.split * 2)),
        replace(root, down=replace(dn, bn=64)),
        replace(root, up=replace(up, split=up.split * 2)),
        replace(root, up=replace(up, split=max(1, up.split // 2))),
        replace(root, up=replace(up, ctas=8), down=replace(dn, ctas=8)),
        # More bytes in flight an SM (the weights' loads alone go 70% -> 81% of the copy bandwidth from 3 to 4
        # programs an SM, benchmarks/probe_grouped_moe_ceiling.py); at f0fc69d only the register cap won.
        replace(root, up=replace(up, stages=6), down=replace(dn, stages=6)),
        replace(root, up=replace(up, stages=5)),
        replace(root, up=replace(up, bk=256, stages=3), down=replace(dn, bk=256, stages=3)),
        replace(root, up=replace(up, maxnreg=128, ctas=4), down=replace(dn, maxnreg=128, ctas=4)),
        replace(root, up=replace(up, maxnreg=128, ctas=4)),
        replace(root, up=replace(up, split=1), down=replace(dn, split=1)),
        replace(root, up=replace(up, split=max(1, up.split // 2)), down=replace(dn, split=max(1, dn.split // 2), flat=True)),
        # The same tiles on 8 warps: half the values a thread decodes a K step, so a shorter chain a warp and
        # more warps an SM (tp4 C = 1: a scheduler issued every 3.4 cycles from ~3 resident warps, Nsight
        # Compute at 7936b5b)
        replace(root, up=replace(up, warps=8), down=replace(dn, warps=8)),
        replace(root, up=replace(up, warps=8)),
        # Constant item and K-step counts: tp4's flat down loop from 628 to 565 SASS instructions a K step
        # (benchmarks/compile_grouped_moe_sm90.py); timed in sweep_c4d4601: down static won at every tp4 C
        replace(root, up=replace(up, static=True), down=replace(dn, static=True)),
        replace(root, down=replace(dn, static=True)),
    ]
    if root.bm == 16 and not root.slotwise:
        # gate/up warp-specialised (its stream probed at ~71% of the copy bandwidth against ~63%):
        # 2 programs an SM (its register split), no K split, 4 or 6 stages
        out += [replace(root, up=replace(_UP_WS, stages=4)), replace(root, up=_UP_WS),
                # down warp-specialised too (its K = I: 512 on tp4, four steps an item)
                replace(root, up=_UP_WS, down=_DOWN_WS), replace(root, up=_UP_WS, down=replace(_DOWN_WS, stages=4)),
                replace(root, up=_UP_WS, down=replace(_DOWN_WS, ctas=1))]
    if slots <= _SLOTWISE_MOST:
        # No routing or combine launch (two launches of four). Down's loop nested: Triton 3.6 does not
        # pipeline the flat loop's loads once the fused combine sits in it (cp.async 12 -> 0 a K step in
        # the PTX, compiled at c4d4601).
        sw = replace(root, slotwise=True, up=up, down=replace(dn, flat=False))  # Triton's: ws tiles are routed
        out += [
            replace(root, slotwise=False, down=replace(dn, flat=True)),  # routed, as the row was before slotwise
            sw,
            replace(sw, down=replace(sw.down, split=1)),
            replace(sw, down=replace(sw.down, split=sw.down.split * 2)),
            replace(sw, up=replace(up, split=max(1, up.split // 2))),
            replace(sw, up=replace(up, split=up.split * 2)),
            replace(sw, up=replace(up, split=max(1, up.split // 2)), down=replace(sw.down, split=1)),
            replace(sw, down=replace(sw.down, static=True)),
            replace(sw, up=replace(up, bn=128, warps=8)),
            replace(sw, up=replace(up, warps=8), down=replace(sw.down, warps=8)),
            replace(sw, up=replace(up, warps=8)),
            # and capped so that 4 or 5 programs (32 or 40 warps) fit an SM: no spills at tp4 C = 1 (compiled)
            replace(sw, up=replace(up, warps=8, maxnreg=64), down=replace(sw.down, warps=8, maxnreg=64)),
            replace(sw, up=replace(up, warps=8, maxnreg=48, ctas=5), down=replace(sw.down, warps=8, maxnreg=48, ctas=5)),
        ]
        # the direct kernels (direct.py): (warps, units of 16 rows a warp, K split) of each GEMM
        out += [direct_config(u, d) for u, d in (((4, 2, 8), (4, 2, 2)), ((4, 2, 16), (4, 2, 1)), ((4, 2, 4), (4, 2, 2)),
                                                   ((4, 1, 8), (4, 1, 2)), ((4, 2, 8), (4, 1, 1)), ((8, 1, 8), (8, 1, 2)),
                                                   ((4, 4, 16), (4, 4, 2)), ((4, 2, 8), (4, 2, 4)),
                                                   ((4, 1, 8), (4, 1, 1)), ((8, 1, 8), (8, 1, 1)), ((4, 2, 4), (4, 1, 1)),
                                                   ((4, 2, 16), (4, 1, 1)), ((4, 1, 4), (4, 1, 1)))]
    seen: list[MoeConfig] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen
