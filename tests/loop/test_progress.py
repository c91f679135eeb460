"""Long loops report runs done of the total through the progress callbacks; the CLI renders them."""

from __future__ import annotations

import io

from rich.console import Console

from dsv4opt.capture.result import Progress
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.loop.apply import check_all
from dsv4opt.loop.sweep import sweep
from dsv4opt.optimizations.registry import OPTIMIZATIONS, CheckResult, Optimization
from dsv4opt.report.progress import rich_progress
from tests.decision.profiles import make_profile


class Heard(Progress):
    def __init__(self):
        self.runs_heard = []

    def runs(self, done, total, next_label):
        self.runs_heard.append((done, total, next_label))


def test_sweep_counts_its_runs(tmp_path):
    def profile_fn(settings):
        prof = make_profile([("k", "attention", 1, 1.0)],
                            meta={"concurrency": settings.concurrency, "optimizations": settings.optimizations},
                            throughput={"tokens_per_s": 1.0, "ms_per_step": 1.0})
        return prof, prof.save(settings.out)

    heard = Heard()
    result = sweep([1, 16], [["bf16-gemm"]], EmbeddedSettings(config="dsv4-tiny", device="cpu"), out_dir=tmp_path,
                   profile_fn=profile_fn, progress=heard)
    assert heard.runs_heard == [(0, 4, "C=1 baseline"), (1, 4, "C=1 bf16-gemm"), (2, 4, "C=16 baseline"),
                                (3, 4, "C=16 bf16-gemm"), (4, 4, None)]
    assert len({r.profile for r in result.rows}) == 4 and all(r.profile.startswith(str(tmp_path)) for r in result.rows)


def test_list_check_counts_the_gates(monkeypatch):
    ran = []

    def check(self, device=None):
        ran.append(self.name)
        return CheckResult(self.name, True, "cpu", {}, {}, "ok")

    monkeypatch.setattr(Optimization, "check", check)
    heard = Heard()
    verdicts = check_all(heard)
    names = list(OPTIMIZATIONS)
    assert ran == names and set(verdicts) == set(names)
    assert heard.runs_heard == [(i, len(names), f"{n}'s gate") for i, n in enumerate(names)] + [(len(names),) * 2 + (None,)]


def test_the_runs_line_is_drawn_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    with rich_progress(console) as progress:
        progress.runs(2, 16, "C=32 mma-attn")
        progress.stage("profiling", 10)
        progress.advance()
        console.file.flush()
        progress._progress.refresh()
    text = out.getvalue()
    assert "runs, next: C=32 mma-attn" in text and "2/16" in text and "profiling" in text and "1/10" in text
