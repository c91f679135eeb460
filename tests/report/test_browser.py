"""The HTML report in a real headless browser: it loads without a console message, every chart
decodes, the page is no wider than the window (wide tables scroll in their box), and the
screenshot shows a page rather than a blank. Skipped where no Chromium is installed (.ci/run
installs Debian's)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dsv4opt.analysis.profile import Profile
from dsv4opt.loop.report_facts import build_report
from dsv4opt.report.page import render_html
from tests.decision.profiles import make_profile
from tests.helpers import EVIDENCE_PROFILES

BROWSER = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = [
    pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (apt-get install -y chromium); the HTML "
                                               "report is not checked in a browser here"),
    pytest.mark.slow,
]
SWEEP = sorted((EVIDENCE_PROFILES / "archive" / "sweep").glob("embedded-c*.json"))
WINDOW = (1280, 2400)

# Run in the page after it loads; anything it finds becomes a console message, which fails the test.
PROBE = """<script>addEventListener('load', () => {
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length;
  if (broken) console.error('charts that did not decode: ' + broken);
  if (document.documentElement.scrollWidth > innerWidth + 1)
    console.error('page wider than the window: ' + document.documentElement.scrollWidth);
});</script>"""


def _open(page: str, tmp_path: Path, name: str) -> tuple[list[str], np.ndarray]:
    """Load the page (with PROBE) in headless Chromium: its console messages and a screenshot."""
    html_path = tmp_path / f"{name}.html"
    html_path.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    shot = tmp_path / f"{name}.png"
    run = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
         "--v=0", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.is_file(), run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    import matplotlib.image

    return console, matplotlib.image.imread(shot)


def _looks_like_a_page(pixels: np.ndarray) -> bool:
    rgb = pixels[..., :3]
    inked = (rgb < 0.9).any(axis=-1).mean()  # share of pixels that are not near-white
    colours = len(np.unique((rgb[::4, ::4] * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    return inked > 0.02 and colours > 50


def test_the_probe_can_fail(tmp_path):
    """A page with a broken chart and a table too wide for the window: both are caught."""
    page = ("<!doctype html><html><body><img src='data:image/png;base64,AAAA'>"
            "<table><tr><td style='white-space:nowrap'>" + "x" * 600 + "</td></tr></table></body></html>")
    console, pixels = _open(page, tmp_path, "bad")
    assert any("did not decode" in line for line in console) and any("wider than" in line for line in console)
    blank = np.ones((100, 100, 4))
    assert not _looks_like_a_page(blank)


def test_a_before_after_report(tmp_path):
    steps = [{"name": f"ProfilerStep#{i}", "gpu_us": 900.0 + 10 * i, "launches": 50, "span_us": 1000.0}
             for i in range(1, 6)]
    before = make_profile([("simt_decode", "attention", 50, 4000.0), ("gemm", "gemm_tc", 100, 1000.0)], steps=5,
                          meta={"concurrency": 8, "optimizations": []},
                          throughput={"tokens_per_s": 8.0, "ms_per_step": 1.0, "ms_per_step_windows": [0.98, 1.0, 1.03]})
    before.steps["steps"] = steps
    after = make_profile([("mma_decode", "attention", 50, 500.0), ("gemm", "gemm_tc", 100, 1000.0)], steps=5,
                         meta={"concurrency": 8, "optimizations": ["mma-attn"], "sources": [str(tmp_path / "t.json")]},
                         throughput={"tokens_per_s": 20.0, "ms_per_step": 0.4, "ms_per_step_windows": [0.39, 0.4, 0.42]})
    page = render_html(build_report(["before.json", "after.json"], [before, after]))
    for text in ("What moved most", "Per-step timeline", "Raw traces", str(tmp_path / "t.json"), "0.98-1.03"):
        assert text in page
    console, pixels = _open(page, tmp_path, "pair")
    assert console == []
    assert _looks_like_a_page(pixels)


@pytest.mark.skipif(len(SWEEP) != 16, reason="the committed 16-profile sweep is not in this checkout")
def test_the_sixteen_profile_sweep_page(tmp_path):
    profiles = [Profile.load(p) for p in SWEEP]
    page = render_html(build_report([str(p) for p in SWEEP], profiles, title="sweep"))
    console, pixels = _open(page, tmp_path, "sweep")
    assert console == []
    assert _looks_like_a_page(pixels)
