"""indexer-topk: the indexer's scores over each request's own entries and their top-k, in one or two launches."""

from dsv4opt.optimizations.indexer_topk.check import check
from dsv4opt.optimizations.indexer_topk.kernel import indexer_topk

IMPLEMENTATIONS = {"indexer_topk": indexer_topk}

__all__ = ["IMPLEMENTATIONS", "check", "indexer_topk"]
