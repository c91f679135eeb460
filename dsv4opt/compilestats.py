"""What torch.compile did in this process: Dynamo's own counters, snapshot and difference.

Read without importing Dynamo (importing it costs seconds): a process that never imported it
compiled nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

_TOP_REASONS = 5  # break reasons a record keeps, most frequent first
_REASON_CHARS = 200  # Dynamo's reasons run to paragraphs; the first line says what broke


@dataclass(frozen=True)
class CompileCounters:
    graphs: int = 0  # FX graphs Dynamo produced (each compiled by the backend)
    graph_breaks: int = 0
    break_reasons: dict[str, int] = field(default_factory=dict)
    compile_s: float = 0.0  # time in Dynamo's frame compilation, the backend's (Inductor's) included
    fx_cache_hits: int = 0  # graphs Inductor loaded from its on-disk cache instead of compiling

    @classmethod
    def now(cls) -> "CompileCounters":
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return cls()
        c = utils.counters
        return cls(
            graphs=int(c["stats"].get("unique_graphs", 0)),
            graph_breaks=int(sum(c["graph_break"].values())),
            break_reasons={_first_line(k): int(v) for k, v in c["graph_break"].items()},
            compile_s=float(sum(utils.compilation_time_metrics.get("_compile.compile_inner", []))),
            fx_cache_hits=int(c["inductor"].get("fxgraph_cache_hit", 0)),
        )

    def since(self, before: "CompileCounters") -> "CompileCounters":
        reasons = {k: v - before.break_reasons.get(k, 0) for k, v in self.break_reasons.items()}
        return CompileCounters(
            graphs=self.graphs - before.graphs,
            graph_breaks=self.graph_breaks - before.graph_breaks,
            break_reasons={k: v for k, v in reasons.items() if v > 0},
            compile_s=self.compile_s - before.compile_s,
            fx_cache_hits=self.fx_cache_hits - before.fx_cache_hits,
        )

    def as_meta(self) -> dict:
        top = sorted(self.break_reasons.items(), key=lambda kv: -kv[1])[:_TOP_REASONS]
        return {"graphs": self.graphs, "graph_breaks": self.graph_breaks, "break_reasons": dict(top),
                "compile_s": round(self.compile_s, 3), "fx_cache_hits": self.fx_cache_hits}


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0][:_REASON_CHARS] if reason.strip() else "?"
