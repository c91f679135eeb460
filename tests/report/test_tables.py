from rich.console import Console

from dsv4opt.analysis import compare_profiles
from dsv4opt.analysis.profile import Profile
from dsv4opt.report.tables import print_comparison, print_profile


def test_renderers_on_empty_profile():
    empty = Profile(meta={}, total_us=0.0, kernels=[], categories=[])
    console = Console(record=True, width=120)
    print_profile(empty, console=console)
    print_comparison(compare_profiles(empty, empty), console=console)
    text = console.export_text()
    assert "no kernels" in text and "nothing to compare" in text
