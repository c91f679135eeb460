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


# id: (concurrency, context, experts_resident, steps, kv, layout, graph_context). Contexts are drawn
# in [0.75N, 1.25N]; graph_context None: index rows as wide as the drawn contexts need.
STEP_CASES = {
    # 1-2 tokens seen: window not full, no compressed entry yet, top-k far above the entries.
    "batch1-context-shorter-than-window": (1, 2, None, 3, "fp8", "tp4", None),
    # 30-50 tokens: 7-12 CSA entries over several pages, top-6 selects; groups complete during the steps.
    "varied-contexts-topk-selects": (3, 40, None, 3, "fp8", "tp4", None),
    "dp-ep-resident-sets": (3, 40, 3, 3, "fp8", "dp-ep", None),
    # HCA entries (ratio 16) exist only from 16 tokens; some requests cross the boundary.
    "hca-boundary": (3, 14, None, 3, "fp8", "tp4", None),
    "bf16-kv": (2, 40, None, 2, "bf16", "dp-ep", None),
    # SGLang's graph width: index rows and the indexer's page table sized to the model's context,
    # almost every slot unused.
    "graph-width-tp4": (2, 40, None, 2, "fp8", "tp4", TINY.max_context),
    "graph-width-dp-ep": (2, 40, None, 2, "fp8", "dp-ep", TINY.max_context),
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
    C, context, resident, steps, kv, layout, graph_context = case
    wl = DecodeWorkload(TINY, concurrency=C, context=context, experts_resident=resident, dtype=torch.float32,
                        seed=1, kv=kv, layout=layout, graph_context=graph_context)
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


@pytest.mark.parametrize("layout", ["tp4", "dp-ep"])
def test_bf16_step_stays_close_to_reference(layout, torch_path):
    """In bf16 a router or top-k decision near a tie can flip against the float64 reference and
    move the logits by 0.1-0.3 on its own (seen on one seed in four): the median over four seeds is
    held to 0.1, which a wrong bf16 path (every seed far off) still fails."""
    errors = []
    for seed in range(4):
        wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16, layout=layout, seed=seed)
        tokens = torch.tensor([3, 9])
        ref, _ = decode_step_ref(wl, tokens)
        errors.append(error_report(wl.step(tokens), ref).rel)
    assert sum(sorted(errors)[1:3]) / 2 < 0.1, errors


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
    wl = DecodeWorkload(TINY, concurrency=2, context=10, dtype=torch.float32, layout="dp-ep")
    local = wl.local_expert[wl.row_rank[:, None], torch.arange(TINY.experts)[None, :].expand(len(wl.row_rank), -1)]
    assert (local[:2] >= 0).all() and (local[2:] == -1).all()
    assert local.shape[0] == TINY.expert_parallel * 2


@pytest.mark.parametrize("layout", ["tp4", "dp-ep"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_memory_estimate_covers_what_is_allocated(dtype, kv, layout):
    for C, context in ((1, 1), (3, 40), (2, 300)):
        wl = DecodeWorkload(TINY, concurrency=C, context=context, dtype=dtype, kv=kv, layout=layout)
        held = wl.state_bytes()
        est = estimate_memory(TINY, C, context, elem_bytes=dtype.itemsize, kv_fp8=kv == "fp8", layout=layout)
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
    with pytest.raises(DsvOptError, match=r"unknown layout 'tp3'; did you mean tp4 or tp8\? use tp4, tp8, dp-ep"):
        DecodeWorkload(TINY, concurrency=1, context=4, layout="tp3")
    with pytest.raises(DsvOptError, match="cannot run the tp8 layout .*layouts that fit it: tp4, dp-ep"):
        DecodeWorkload(TINY, concurrency=1, context=4, layout="tp8")
    with pytest.raises(DsvOptError, match="under the tp4 layout every rank holds all 16 experts"):
        DecodeWorkload(TINY, concurrency=1, context=4, experts_resident=4, layout="tp4")
    with pytest.raises(DsvOptError, match="--graph-context 100 is shorter than the longest request"):
        DecodeWorkload(TINY, concurrency=1, context=40, graph_context=100)


def test_tp_rank_holds_its_slices_and_pads_q_to_every_head(torch_path):
    """One rank of tp4 (dsv4-tiny: 4 heads, 4 groups, experts 128 wide): a quarter of the heads,
    groups, expert and shared-expert widths, every expert; the sink padded with zeros."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float32, layout="tp4")
    w = wl.layers[2].w
    assert w["wq_b"].out_features == TINY.head_dim  # one head of four
    assert w["wo_a"].shape[0] == 1 and w["wo_b"].in_features == TINY.o_lora
    assert w["sink"].shape == (TINY.heads,) and (w["sink"][1:] == 0).all() and w["sink"][0] != 0
    assert w["w13"].packed.shape == (TINY.experts, 2 * 32, TINY.hidden // 2)
    assert w["w2"].packed.shape == (TINY.experts, TINY.hidden, 16)
    assert w["shared_w2"].in_features == 32
    q = wl._query(torch.randn(2, TINY.head_dim), wl.pos)
    assert q.shape == (2, TINY.heads, TINY.head_dim)


def test_tp_expert_slices_are_cut_from_the_whole_expert(torch_path):
    """A tp4 rank's expert slices are the whole expert's rows and columns (the dp-ep rank holds
    expert 0 whole, drawn from the same seed)."""
    tp = DecodeWorkload(TINY, concurrency=1, context=8, dtype=torch.float32, layout="tp4")
    ep = DecodeWorkload(TINY, concurrency=1, context=8, dtype=torch.float32, layout="dp-ep")
    whole13, whole2 = ep.layers[1].w["w13"].dense(0), ep.layers[1].w["w2"].dense(0)
    I = TINY.expert_width
    assert torch.equal(tp.layers[1].w["w13"].dense(0), torch.cat([whole13[:32], whole13[I : I + 32]]))
    assert torch.equal(tp.layers[1].w["w2"].dense(0), whole2[:, :32])


def test_graph_width_rows_are_the_models_context_wide(torch_path):
    """SGLang's graph metadata: HCA index rows context/128 wide (tiny: /16), -1 past each request's
    entries; the indexer's page table as many pages as the context has, page 0 past the request's."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float32, graph_context=TINY.max_context)
    meta = wl._metadata(torch.tensor([1, 2]))
    hca, csa = meta["hca"], meta["csa"]
    assert hca["indices"].shape == (2, TINY.max_context // TINY.hca_ratio)
    done = hca["done"]
    for b in range(2):
        assert (hca["indices"][b, : done[b]] >= 0).all() and (hca["indices"][b, done[b] :] == -1).all()
    pages = TINY.max_context // (TINY.index_page * TINY.csa_ratio)
    assert csa["page_table"].shape == (2, pages)
    own = wl.layers[2].index_pages
    assert (csa["page_table"][1, :own] == torch.arange(own, 2 * own)).all() and (csa["page_table"][:, own:] == 0).all()
