"""dsv4opt.sass reads loops out of a SASS listing: written by hand here, in nvdisasm's shape."""

from __future__ import annotations

from dsv4opt.sass import loops, tightest_loop

LISTING = "\n".join([  # the shape of triton.tools.disasm.get_sass: control codes, a tab, the instruction
    "LBB0:",
    "--:-:-:-:2\tLDS R2, [R3];",
    "--:-:-:-:1\tHGMMA.64x16x16.F32.BF16 R24, R4, gdesc[UR4], R24;",
    "LBB1:",
    "--:-:-:-:2\tLOP3.LUT R5, R2, 0x81c081c0, RZ, 0xc0, !PT;",
    "--:-:-:-:1\tHMUL2.BF16_V2 R5, R5, R6;",
    "02:-:-:-:5\t@P0 BRA LBB1;",
    "--:-:-:-:1\tSYNCS.PHASECHK.TRANS64 P1, [UR8], R9;",
    "--:-:-:-:5\tBRA LBB0;",
])


def test_every_backward_branch_is_a_loop_and_a_conditional_one_is_the_tightest():
    found = dict(loops(LISTING))
    assert set(found) == {"LBB0", "LBB1"}
    assert found["LBB1"] == {"LOP3": 1, "HMUL2": 1, "BRA": 1}  # predicate and modifiers dropped
    assert sum(found["LBB0"].values()) == 7  # the outer loop counts the inner one's instructions too
    assert [name for name, _ in loops(LISTING, conditional=True)] == ["LBB1"]
    assert tightest_loop(LISTING, "HMUL2") == found["LBB1"]
    assert tightest_loop(LISTING, "HGMMA") is None  # only the unconditional outer loop holds it
