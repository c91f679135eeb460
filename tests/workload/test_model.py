"""Decode steps of dsv4-tiny against the all-torch float64 reference, and the step's invariants.

The reference quantises where the model does (FP8 activations, keys and KV rows, MXFP4 experts),
so a float32 model matches it to float32 rounding (~5e-7) - except where a value falls within that
rounding of an e4m3 rounding boundary: then the two round it to neighbouring e4m3 values, and one
such flip in a 32-wide tiny-config activation moves the logits by about 1e-2. Wrong indices,
weights or rotations move them by 0.1 or more. Hence REL_TOL. The torch path (a CPU without the
interpreter) runs most cases; one case runs every Triton kernel under the interpreter.
"""


import pytest
import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.memory import estimate_memory
from dsv4opt.workload.model import DecodeWorkload
from dsv4opt.workload.reference import decode_step_ref

TINY = ModelConfig.from_name("dsv4-tiny")
REL_TOL = 3e-2


# id: (concurrency, context, experts_resident, steps, kv). Contexts are drawn in [0.75N, 1.25N]:
STEP_CASES = {
    # 1-2 tokens seen: window not full, no compressed entry yet, top-k far above the entries.
    "batch1-context-shorter-than-window": (1, 2, None, 3, "fp8"),
    # 30-50 tokens: 7-12 CSA entries over several pages, top-6 selects; groups complete during the steps.
    "varied-contexts-topk-selects": (3, 40, 3, 3, "fp8"),
    # HCA entries (ratio 16) exist only from 16 tokens; some requests cross the boundary.
    "hca-boundary": (3, 14, None, 3, "fp8"),
    "bf16-kv": (2, 40, None, 2, "bf16"),
}


def _steps_match(wl, tokens, steps, tol):
    for _ in range(steps):
        ref_logits, ref_hidden = decode_step_ref(wl, tokens)
        logits = wl.step(tokens)
        assert logits.dtype == torch.float32 and logits.shape == (wl.concurrency, TINY.vocab)
        for out, ref in ((logits, ref_logits), (wl.last_hidden, ref_hidden)):
            report = error_report(out, ref)
            assert report.ok(tol), report
        tokens = logits.argmax(-1)


@pytest.mark.parametrize("case", STEP_CASES.values(), ids=STEP_CASES.keys())
def test_decode_steps_match_float64_reference(case, torch_path):
    C, context, resident, steps, kv = case
    wl = DecodeWorkload(TINY, concurrency=C, context=context, experts_resident=resident, dtype=torch.float32,
                        seed=1, kv=kv)
    _steps_match(wl, torch.randint(TINY.vocab, (C,)), steps, REL_TOL)


@pytest.mark.slow
def test_triton_kernels_step_matches_float64_reference():
    """Every Triton kernel of the step (under the interpreter on a CPU) in one step of two requests."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float32, seed=2)
    _steps_match(wl, torch.tensor([3, 9]), 1, REL_TOL)


def test_reference_sees_a_changed_cache(torch_path):
    """The comparison above is not vacuous: disturbing one cached window entry moves the logits."""
    wl = DecodeWorkload(TINY, concurrency=1, context=40, dtype=torch.float32)
    tokens = torch.tensor([7])
    before, _ = decode_step_ref(wl, tokens)
    pos = int(wl.pos[0])
    token = torch.tensor([(pos - 1) % TINY.window_page])
    layer = wl.layers[0]
    layer.swa.write(token, layer.swa.read(token) + 5.0)
    after, _ = decode_step_ref(wl, tokens)
    assert not error_report(after, before).ok(10 * REL_TOL)
    assert not error_report(wl.step(tokens), before).ok(10 * REL_TOL)


def test_bf16_step_stays_close_to_reference(torch_path):
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16)
    tokens = torch.tensor([3, 9])
    ref, _ = decode_step_ref(wl, tokens)
    report = error_report(wl.step(tokens), ref)
    assert report.ok(0.1), report


def test_same_arguments_same_workload(torch_path):
    a = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=4)
    b = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=4)
    c = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=5)
    assert torch.equal(a.contexts, b.contexts)
    assert torch.equal(a.layers[2].extra.data, b.layers[2].extra.data)
    tokens = torch.tensor([1, 2, 3])
    assert torch.equal(a.step(tokens), b.step(tokens))
    assert not torch.equal(a.layers[2].extra.data, c.layers[2].extra.data)


def test_step_advances_every_request(torch_path):
    wl = DecodeWorkload(TINY, concurrency=2, context=10, dtype=torch.float32)
    start = wl.pos.clone()
    wl.step(torch.tensor([0, 1]))
    wl.step(torch.tensor([0, 1]))
    assert torch.equal(wl.pos, start + 2)
    assert torch.equal(wl.contexts, start)  # the drawn contexts stay as drawn (they go into meta)
    assert wl.last_hidden.shape == (2, TINY.hidden)


def test_other_ranks_slots_run_on_expert_zero_and_count_for_nothing(torch_path):
    """The MoE sees every rank's tokens (copies of this rank's): their slots go to experts on other
    ranks, so they contribute nothing; this rank's own rows get all their experts."""
    wl = DecodeWorkload(TINY, concurrency=2, context=10, dtype=torch.float32)
    local = wl.local_expert[wl.row_rank[:, None], torch.arange(TINY.experts)[None, :].expand(len(wl.row_rank), -1)]
    assert (local[:2] >= 0).all() and (local[2:] == -1).all()
    assert local.shape[0] == TINY.expert_parallel * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_memory_estimate_covers_what_is_allocated(dtype, kv):
    for C, context in ((1, 1), (3, 40), (2, 300)):
        wl = DecodeWorkload(TINY, concurrency=C, context=context, dtype=dtype, kv=kv)
        held = wl.state_bytes()
        est = estimate_memory(TINY, C, context, elem_bytes=dtype.itemsize, kv_fp8=kv == "fp8")
        assert est.weights == held["weights"]
        # The estimate takes the longest context the draw allows (1.25 x the mean); the draw may be shorter.
        assert held["caches"] <= est.caches <= 1.25 * held["caches"]


def test_bad_arguments_raise_user_errors():
    with pytest.raises(DsvOptError, match="experts-resident"):
        DecodeWorkload(TINY, concurrency=1, context=4, experts_resident=TINY.experts + 1)
    with pytest.raises(DsvOptError, match="KV layout"):
        DecodeWorkload(TINY, concurrency=1, context=4, kv="int4")
    with pytest.raises(DsvOptError, match="at least 1"):
        DecodeWorkload(TINY, concurrency=0, context=4)
