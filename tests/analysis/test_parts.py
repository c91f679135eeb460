"""Model parts from record_function ranges: torch.compile's wrappers are not parts."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from dsv4opt.analysis.parts import NO_PART, kernel_parts, part_annotations
from tests.helpers import SHARED_TRACES


def _annotations(rows):
    return pd.DataFrame(rows, columns=["name", "ts_us", "dur_us", "pid", "tid", "on_gpu"]).astype({"name": "category"})


def test_compile_wrappers_and_steps_are_not_parts():
    ann = _annotations([
        ("## Call CompiledFxGraph fal4xpiah2v6blbfmwwonu52dvevbsmlh743q5tkclrt4gcqpzea ##", 0.0, 100.0, 0, 1, 1),
        ("Torch-Compiled Region: 0/0", 0.0, 100.0, 0, 1, 0),
        ("ProfilerStep#3", 0.0, 100.0, 0, 1, 1),
        ("attn", 10.0, 20.0, 0, 1, 1),
    ])
    assert part_annotations(ann)["name"].astype(object).tolist() == ["attn"]
    parts = kernel_parts(np.array([15.0, 50.0]), np.array([np.nan, np.nan]), np.array([1, 1]), ann)
    assert parts.tolist() == ["attn", NO_PART]


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_a_compiled_model_has_no_parts_when_its_only_range_is_the_graph_call():
    from dsv4opt.analysis import analyze_paths

    path = SHARED_TRACES / "tracelens_torch_compile_triton.json.gz"
    with gzip.open(path, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") in ("user_annotation", "gpu_user_annotation")}
    assert names and all(n.startswith("## Call CompiledFxGraph") for n in names)
    profile = analyze_paths([path])
    parts = getattr(profile, "parts", None) if hasattr(profile, "parts") else profile.extra.get("parts")
    assert not parts
