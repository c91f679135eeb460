"""A gate's figures as `apply` and `list --check` print them: measured, bound, and the share of it."""

from rich.console import Console

from dsv4opt.optimizations.registry import CheckResult
from dsv4opt.report.decision import print_check


def _render(result: CheckResult) -> str:
    console = Console(record=True, width=80)
    print_check(result, console)
    return console.export_text()


def test_each_bounded_figure_shows_how_much_of_its_bound_it_uses():
    figures = {"recall_loss_mean": 0.0, "premix_err": 0.0027, "model_recall": 0.62, "nonfinite": 0.0, "cases": 12.0}
    bounds = {"recall_loss_mean": 1e-3, "premix_err": 0.0175, "model_recall": 1e-3, "nonfinite": 0.0}
    text = _render(CheckResult("gate", False, "cpu", figures, bounds, "FAILED: model_recall 0.62 > 0.001"))
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()}
    assert rows["recall_loss_mean"][-1] == "0.0%"
    assert rows["premix_err"][-1] == "15.4%"  # 0.0027 / 0.0175
    assert rows["model_recall"][-1] == "620x"
    assert rows["nonfinite"][-1] == "0.0%"
    assert rows["cases"] == ["12"]  # a count with no bound: nothing to compare it with
    assert "gate check on cpu: FAILED" in text and "FAILED: model_recall 0.62 > 0.001" in text


def test_a_check_without_figures_prints_its_verdict_only():
    text = _render(CheckResult("gate", True, "cpu", {}, {}, "nothing to measure"))
    assert "figure" not in text and "gate check on cpu: passed" in text and "nothing to measure" in text
