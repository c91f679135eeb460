"""Reading a compiled Triton or Gluon kernel without a GPU: ptxas' report on its PTX, its SASS listing
(nvdisasm from Triton's wheel) and the opcodes of its loops, for the compile-only reports of the
kernels and benchmarks."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path


def ptxas_log(ptx: str, arch: int = 90) -> str:
    """What `ptxas -v` (Triton's own) prints assembling `ptx` for sm_{arch}a: registers, spills, warnings."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_text(ptx)
        done = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True)
    return done.stderr + done.stdout


def listing(compiled) -> str:
    """The SASS of a compiled kernel, or a line saying why there is none."""
    try:
        from triton.tools.disasm import get_sass

        return get_sass(compiled.asm["cubin"])
    except Exception as err:  # noqa: BLE001  (a missing nvdisasm only loses the loop counts)
        return f"no SASS: {err}"


def loops(sass: str, conditional: bool = False) -> list[tuple[str, Counter]]:
    """Each loop of the listing (a label and a backward branch to it; `conditional`: predicated
    branches only, so that an mbarrier spin's out-of-line retry is not taken for a loop's end):
    its label and its opcodes counted, predicates and modifiers dropped."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\w+):", ln.strip()))}
    found = []
    for i, ln in enumerate(lines):
        m = re.search(r"@!?P\w+\s+BRA\s+(\w+)" if conditional else r"\bBRA\s+(\w+)", ln)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        body = [b.split("\t", 1)[-1].strip() for b in lines[labels[m.group(1)] + 1 : i + 1] if "\t" in b]
        found.append((m.group(1), Counter(_opcode(b) for b in body if b)))
    return found


def _opcode(instruction: str) -> str:
    """An instruction's opcode, its predicate and modifiers dropped (`@!P0 LDG.E.128 ...` -> `LDG`)."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def tightest_loop(sass: str, op: str) -> Counter | None:
    """The smallest conditional loop holding `op` (a thread's K loop): its opcodes, or None."""
    held = [ops for _, ops in loops(sass, conditional=True) if ops.get(op)]
    return min(held, key=lambda ops: sum(ops.values()), default=None)


def opcodes(sass: str) -> Counter:
    """Every instruction of the listing by opcode (predicates and modifiers dropped): for kernels with
    no loop, whose K steps are unrolled."""
    body = [ln.split("\t", 1)[-1].strip() for ln in sass.splitlines() if "\t" in ln and ";" in ln]
    return Counter(_opcode(b) for b in body if b)
