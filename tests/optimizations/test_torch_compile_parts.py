"""With torch-compile on, the model parts survive: every kernel once showed "(outside any
annotation)", because Dynamo drops the parts' record_function ranges. Each opaque op's call now
carries the part its line of model.py sits in and runs inside a range of that name; what Inductor
fuses is named as such. Compiled here with Dynamo and AOTAutograd (`aot_eager`) on the CPU."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from dsv4opt.analysis import analyze_paths
from dsv4opt.analysis.parts import COMPILED_GLUE, NO_PART, with_compiled_glue
from dsv4opt.optimizations.torch_compile.regions import CompiledRegions, part_of
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.model import PARTS, DecodeWorkload

TINY = ModelConfig.from_name("dsv4-tiny")


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")  # the workload's plain-torch kernels (tests/conftest.py: torch_path)
        wl = DecodeWorkload(TINY, concurrency=2, context=24, layers=2, dtype=torch.float32,
                            impls={"regions": CompiledRegions("aot_eager")})
        tokens = torch.tensor([3, 9])
        wl.step(tokens)  # compiles the blocks
        path = tmp_path_factory.mktemp("compiled") / "trace.json"
        with torch.profiler.profile() as prof:
            wl.step(tokens)
        prof.export_chrome_trace(str(path))
    return path


def test_every_opaque_op_runs_inside_a_model_part(compiled_trace):
    events = json.loads(compiled_trace.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e["name"].startswith("dsv4opt::")]
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] in PARTS]
    assert len(ops) > 20
    for op in ops:
        inside = [r["name"] for r in ranges if r["tid"] == op["tid"] and op["ts"] <= r["ts"]
                  and r["ts"] + r["dur"] <= op["ts"] + op["dur"]]
        assert len(inside) == 1, (op["name"], inside)
    # the ones whose part is unambiguous by what they are
    part_of_op = {}
    for op in ops:
        part_of_op.setdefault(op["name"], set()).update(
            r["name"] for r in ranges if r["tid"] == op["tid"] and op["ts"] <= r["ts"] <= op["ts"] + op["dur"])
    assert part_of_op["dsv4opt::attention_one_cache"] == {"attn"}
    assert part_of_op["dsv4opt::hc_post"] == {"mhc_post"}
    assert part_of_op["dsv4opt::rms_norm"] >= {"attn_norm", "ffn_norm", "qkv"}  # one op, three parts


def test_the_compiled_profile_keeps_its_parts(compiled_trace):
    shares = {p.part: p.share for p in analyze_paths([compiled_trace]).parts}
    assert {"attn", "qkv", "o_proj", "mhc_pre", "mhc_post", "moe", "attn_norm", "ffn_norm"} <= set(shares)
    assert shares.get(NO_PART, 0.0) < 0.5  # was every compiled block's time


def test_a_call_is_placed_by_its_innermost_model_line():
    import inspect

    from dsv4opt.workload import model

    path = inspect.getsourcefile(model)
    lines = inspect.getsource(model).splitlines()
    attn = next(i for i, line in enumerate(lines, 1) if 'with record_function("attn"):' in line) + 1
    moe = next(i for i, line in enumerate(lines, 1) if 'with record_function("moe"):' in line) + 1
    stack = (f'  File "/somewhere/else.py", line 10, in step\n'
             f'  File "{path}", line {moe}, in _ffn_block\n    y = ...\n'
             f'  File "{path}", line {attn}, in _attention_block\n    o, _ = ...\n'
             f'  File "/x/ops.py", line 3, in _one_cache\n')
    assert part_of(stack) == "attn"  # the innermost model.py frame, not the outer one
    assert part_of('  File "/x/ops.py", line 3, in f\n') == "" and part_of(None) == ""


def test_inductor_kernels_outside_any_part_are_named_fused_glue():
    names = pd.Series(["triton_poi_fused_add_mul_0", "triton_red_fused_sum_1", "_moe_up_kernel", "triton_poi_fused_2"])
    part = np.array([NO_PART, NO_PART, NO_PART, "attn"], dtype=object)
    assert list(with_compiled_glue(part, names)) == [COMPILED_GLUE, COMPILED_GLUE, NO_PART, "attn"]
    assert with_compiled_glue(None, names) is None
