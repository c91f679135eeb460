"""N real ranks over gloo against one process holding every request and every expert.

Same inputs means: the same seed (every rank draws all ranks' requests and keeps its own, draws the
whole shared expert and keeps its shard, and each expert from its own generator), every rank's C
requests being requests r*C .. r*C + C - 1 of the single process's N*C, and the same tokens each step.
The single process runs the whole MoE (`with_expert_parallel(1)`: all experts resident, the whole
shared expert, no copies). Both run float32; the ranks sum the MoE's partials in another order, so
they agree to float32 rounding, bounded here as the model tests bound a flipped e4m3 rounding.
"""

import pytest
import torch

from dsv4opt.capture.launcher import run_ranks
from dsv4opt.capture.ranks import PRELOAD
from dsv4opt.numerics import error_report
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.model import DecodeWorkload
from dsv4opt.workload.reference import decode_step_ref
from tests.workload import rank_entries

TINY = ModelConfig.from_name("dsv4-tiny")
REL_TOL = 3e-2  # as tests/workload/test_model.py: one e4m3 flip moves the tiny logits by ~1e-2
C, CONTEXT, SEED, STEPS = 2, 40, 3, 2


def _tokens(ranks: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(TINY.vocab, (ranks * C,), generator=g) for _ in range(STEPS)]


def _single_process(ranks: int, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    wl = DecodeWorkload(TINY.with_expert_parallel(1), concurrency=ranks * C, context=CONTEXT, dtype=torch.float32,
                        seed=SEED, layout="dp-ep")
    return [wl.step(t) for t in tokens]


def _ranks(ranks: int, tokens: list[torch.Tensor], comm: str, workdir) -> list[torch.Tensor]:
    outs = run_ranks(rank_entries.step_logits, ranks, "gloo", workdir,
                     args=("dsv4-tiny", C, CONTEXT, tokens, SEED, comm), preload=PRELOAD)
    return [torch.cat([out[s] for out in outs]) for s in range(len(tokens))]


def _tp_ranks(tokens: list[torch.Tensor], comm: str, workdir) -> list[list[torch.Tensor]]:
    """Each tp4 rank's logits per step (every rank runs all 2C requests)."""
    return run_ranks(rank_entries.step_logits, 4, "gloo", workdir,
                     args=("dsv4-tiny", 2 * C, CONTEXT, tokens, SEED, comm, "tp4"), preload=PRELOAD)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_together_equal_one_process_with_every_expert(ranks, tmp_path, torch_path):
    tokens = _tokens(ranks)
    for got, want in zip(_ranks(ranks, tokens, "real", tmp_path), _single_process(ranks, tokens)):
        report = error_report(got, want)
        assert report.ok(REL_TOL), report


@pytest.mark.parametrize("broken", ["copies", "no-combine"])
def test_a_dispatch_or_combine_that_loses_other_ranks_fails_the_comparison(broken, tmp_path, torch_path):
    """Copies of a rank's own tokens for the others' (what one process alone does), or each rank
    keeping its own partial sums: the comparison above then fails by far."""
    tokens = _tokens(2)[:1]
    report = error_report(_ranks(2, tokens, broken, tmp_path)[0], _single_process(2, tokens)[0])
    assert not report.ok(10 * REL_TOL), report


def test_tp4_ranks_together_equal_one_process_with_every_head_and_expert(tmp_path, torch_path):
    """Four tensor-parallel ranks, each with a quarter of the heads, groups, expert and shared-expert
    widths, all-reducing wo_b's and the MoE's partial outputs: every rank ends with the logits of
    one process holding every head and whole expert (dp-ep over one rank draws the same weights)."""
    tokens = _tokens(2)  # 2C requests, the same on every rank
    single = _single_process(2, tokens)
    for rank_out in _tp_ranks(tokens, "real", tmp_path):
        for got, want in zip(rank_out, single):
            report = error_report(got, want)
            assert report.ok(REL_TOL), report


def test_tp_ranks_that_skip_the_all_reduce_fail_the_comparison(tmp_path, torch_path):
    tokens = _tokens(2)[:1]
    got = _tp_ranks(tokens, "no-all-reduce", tmp_path)[0][0]
    report = error_report(got, _single_process(2, tokens)[0])
    assert not report.ok(10 * REL_TOL), report


def test_one_process_with_every_expert_matches_the_float64_reference(torch_path):
    """The single process the ranks are held to is itself right: its whole MoE against the reference."""
    wl = DecodeWorkload(TINY.with_expert_parallel(1), concurrency=3, context=CONTEXT, dtype=torch.float32, seed=SEED,
                        layout="dp-ep")
    assert wl.experts_resident == TINY.experts and wl.deploy.shared_width == TINY.expert_width
    tokens = torch.tensor([4, 77, 200])
    ref, _ = decode_step_ref(wl, tokens)
    report = error_report(wl.step(tokens), ref)
    assert report.ok(REL_TOL), report


def test_a_rank_holds_its_slice_of_the_whole(torch_path):
    """Rank r's requests, experts and shared-expert shard are the single process's, cut (construction
    only: a stand-in for the process group names the rank, no collective runs)."""

    class Rank1Of2:
        real, rank, ranks = True, 1, 2

    whole = DecodeWorkload(TINY.with_expert_parallel(1), concurrency=4, context=CONTEXT, dtype=torch.float32, seed=SEED,
                           layout="dp-ep")
    part = DecodeWorkload(TINY, concurrency=2, context=CONTEXT, dtype=torch.float32, seed=SEED, comm=Rank1Of2(),
                          layout="dp-ep")
    assert torch.equal(part.contexts, whole.contexts[2:]) and part.max_context == whole.max_context
    half = TINY.experts // 2
    assert list(part.resident_experts) == list(range(half, TINY.experts))
    for a, b in zip(part.layers, whole.layers):
        assert torch.equal(a.w["w13"].packed, b.w["w13"].packed[half:])
        assert torch.equal(a.w["w2"].scales, b.w["w2"].scales[half:])
        assert torch.equal(a.w["wq_b"].w8.view(torch.uint8), b.w["wq_b"].w8.view(torch.uint8))
        pages = a.swa.data.shape[0]
        assert torch.equal(a.swa.data, b.swa.data[pages:])
        if a.extra is not None:
            assert torch.equal(a.extra.data, b.extra.data[a.extra.data.shape[0]:])
            assert torch.equal(a.state, b.state[2:])
    # The shard: the second half of the gate rows and of the up rows, and of the down columns.
    w = TINY.expert_width
    full13, part13 = whole.layers[0].w["shared_w13"].dense(), part.layers[0].w["shared_w13"].dense()
    assert torch.equal(part13, torch.cat([full13[w // 2 : w], full13[w + w // 2 :]]))
    assert torch.equal(part.layers[0].w["shared_w2"].dense(), whole.layers[0].w["shared_w2"].dense()[:, w // 2 :])
    # Its MoE routes only its own experts, for every rank's rows.
    table = part.local_expert[0]
    assert (table[:half] == -1).all() and torch.equal(table[half:], torch.arange(half, dtype=torch.int32))
