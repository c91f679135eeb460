"""Mistyped names are refused in one line, with "did you mean" where a name is close, before any
command loads torch: each refusal below once took 3-6 s of imports first."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

# (command line, the line it must print)
TYPOS = [
    ("profile --with mma-atn", "unknown optimisation 'mma-atn'; did you mean mma-attn? known: mma-attn, bf16-gemm, "
                               "fuse-glue, grouped-moe, torch-compile, indexer-topk"),
    ("sglang-switches mma-atn", "unknown optimisation 'mma-atn'; did you mean mma-attn?"),
    ("apply mma-atn --target sglang", "unknown optimisation 'mma-atn'; did you mean mma-attn?"),
    ("bench bf16-gemm", "bf16-gemm has no benchmark (benchmarks: mma-attn, fuse-glue, grouped-moe, indexer-topk); its "
                        "correctness gate runs with `dsv4opt list --check`, its effect on a step with "
                        "`dsv4opt apply bf16-gemm`"),
    ("bench mma-atn", "unknown benchmark 'mma-atn'; did you mean mma-attn? known: mma-attn, fuse-glue, grouped-moe, "
                      "indexer-topk"),
    ("profile --sglang 0.5.99", "unknown SGLang path '0.5.99'; use 0.5.14, 0.5.23"),
    ("profile --sglang 0.5.2", "unknown SGLang path '0.5.2'; did you mean 0.5.23? use 0.5.14, 0.5.23"),
    ("profile --layout tp3", "unknown layout 'tp3'; did you mean tp4 or tp8? use tp4, tp8, dp-ep"),
    ("profile --config dsv4-tinny", "unknown model config 'dsv4-tinny'; did you mean dsv4-tiny? known: dsv4-flash, "
                                    "dsv4-tiny"),
    ("profile --device gpu", "unknown device 'gpu'; did you mean cuda? use cuda, cpu, cuda:N"),
    ("profile --device cuda:x", "unknown device 'cuda:x'; did you mean cuda:N? use cuda, cpu, cuda:N"),
    ("sweep --sglang 0.5.99", "unknown SGLang path '0.5.99'; use 0.5.14, 0.5.23"),
    ("sweep --layout dpep", "unknown layout 'dpep'; did you mean dp-ep? use tp4, tp8, dp-ep"),
    ("sweep --with mma-attn,bf16-gem", "unknown optimisation 'bf16-gem'; did you mean bf16-gemm?"),
]

_RUN = """
import json, sys
from typer.testing import CliRunner
from dsv4opt.cli import app
out = []
for line in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, line.split(), env={"COLUMNS": "400"})
    out.append([r.exit_code, r.output])
print(json.dumps({"results": out, "torch": "torch" in sys.modules, "pandas": "pandas" in sys.modules}))
"""


def test_typos_are_refused_before_torch_loads(tmp_path):
    lines = [cmd for cmd, _ in TYPOS]
    env = {"PYTHONPATH": str(REPO), "DSV4OPT_STATE": str(tmp_path / "state.json"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(lines)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    for (cmd, expected), (code, output) in zip(TYPOS, seen["results"]):
        assert code == 1, (cmd, output)
        assert output.strip().splitlines() == [output.strip()], (cmd, output)  # one line, no blank line first
        assert output.startswith(f"error: {expected}"), (cmd, output)
    assert not seen["torch"] and not seen["pandas"]
