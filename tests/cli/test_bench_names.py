"""`dsv4opt bench NAME` checks NAME from the registry's data before importing a kernel or torch, and
says what to type: the close name, or what to run for an optimisation that has no bench."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from tests.helpers import REPO

runner = CliRunner()


@pytest.mark.parametrize("name, expected", [
    ("mma-atn", "unknown benchmark 'mma-atn'; did you mean mma-attn? known: mma-attn, fuse-glue, grouped-moe, "
                "indexer-topk"),
    ("nothing-like-it", "unknown benchmark 'nothing-like-it'; known: mma-attn, fuse-glue, grouped-moe, indexer-topk"),
    ("bf16-gemm", "bf16-gemm has no benchmark (benchmarks: mma-attn, fuse-glue, grouped-moe, indexer-topk); its correctness "
                  "gate runs with `dsv4opt list --check`, its effect on a step with `dsv4opt apply bf16-gemm`"),
])
def test_a_name_without_a_bench_is_refused_in_one_line(name, expected):
    result = runner.invoke(app, ["bench", name], env={"COLUMNS": "400"})
    assert result.exit_code == 1 and expected in result.output and "Traceback" not in result.output


def test_the_refusal_imports_no_kernel_and_no_torch():
    script = ("import sys\nfrom typer.testing import CliRunner\nfrom dsv4opt.cli import app\n"
              "r = CliRunner().invoke(app, ['bench', 'mma-atn'])\n"
              "print(r.exit_code, sorted(m for m in sys.modules if m == 'torch' or m.startswith('dsv4opt.optimizations.mma_attn')))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "[]"], out.stdout
