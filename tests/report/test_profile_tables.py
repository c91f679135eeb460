"""`analyze`'s tables at 80 and 120 columns: figures whole, names distinct, the launchers said once."""

import re

import pytest
from rich.console import Console

from dsv4opt.analysis import analyze_paths
from dsv4opt.report.tables import print_profile
from tests.trace.traces import ids, real_traces

TRACES = real_traces()


def _ms_or_us(us: float) -> str:  # the house format (dsv4opt/display.py), written out here
    if abs(us) >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs" if abs(us) >= 1 or us == 0 else f"{us:.2f} µs"


@pytest.fixture(scope="module")
def profiles():
    return {p: analyze_paths([p]) for p in TRACES}


@pytest.mark.skipif(not TRACES, reason="no real traces")
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("path", TRACES, ids=ids(TRACES))
def test_figures_are_whole_and_names_distinct(profiles, path, width):
    profile = profiles[path]
    console = Console(record=True, width=width)
    print_profile(profile, top=10, console=console)
    lines = console.export_text().splitlines()
    assert max(len(x) for x in lines) <= width
    start = next(i for i, x in enumerate(lines) if x.startswith("top "))
    rule = next(i for i in range(start, len(lines)) if set(lines[i].strip()) == {"─"})
    table = lines[rule + 1:rule + 1 + min(10, len(profile.kernels))]
    names = []
    for i, (k, line) in enumerate(zip(profile.kernels, table), 1):
        cells = re.split(r"\s{3,}", line.strip())
        assert cells[0] == str(i) and cells[1] == f"{100 * k.share:.1f}%" and cells[2] == _ms_or_us(k.total_us), line
        assert cells[3] == str(k.count) and cells[4] == _ms_or_us(k.mean_us), line
        names.append(cells[-1])
    assert len(set(names)) == len(names), names
    text = "\n".join(lines)
    assert text.count("who launched") <= 1 and "launched by " not in text.replace("launched by   ", "")


@pytest.mark.skipif("hta_a100_train_control.json.gz" not in {p.name for p in TRACES},
                    reason="../shared/traces absent (hta_a100_train_control)")
def test_busy_and_efficiency_shown_where_the_trace_allows(profiles):
    by_name = {p.name: prof for p, prof in profiles.items()}
    console = Console(record=True, width=120)
    print_profile(by_name["hta_a100_train_control.json.gz"], console=console)
    text = console.export_text()
    assert "GPU busy time" in text and "stream 21" in text and "categories under other work" in text
    assert "efficiency of the operator calls" in text and "A100 40GB" in text
