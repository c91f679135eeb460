"""The poisoned allocator: NaN in real tensors, nothing written into a compiler's graph."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dsv4opt.numerics import nan_poisoned_allocations


def test_a_real_allocation_is_nan_and_the_allocator_is_restored():
    before = torch.empty, torch.empty_like
    with nan_poisoned_allocations():
        assert torch.empty(3, 5).isnan().all()
        assert torch.empty_like(torch.ones(4)).isnan().all()
    assert (torch.empty, torch.empty_like) == before


def test_a_traced_allocation_adds_no_fill_to_the_graph():
    """Inductor's decompositions call torch.empty while tracing: a poison there became a fill and a
    copy into the graph, which functionalisation refused (the torch-compile gate failed cold)."""

    def padded(q):
        out = torch.empty(q.shape[0], 4, q.shape[1])
        out[:, 0] = q
        return out

    with nan_poisoned_allocations():
        gm = make_fx(padded, tracing_mode="fake")(torch.randn(2, 3))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("fill" in t or "full" in t for t in targets), targets
