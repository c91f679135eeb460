"""Readable at 80 and at 120 columns: no line wider than the terminal (a whole path aside), no
figure or unit cut, the names a user types whole, shortened kernel names still distinct."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from dsv4opt.optimizations.registry import OPTIMIZATIONS, CheckResult, Optimization
from dsv4opt.state import State, save_state, state_path
from tests.helpers import FIXTURE_PROFILES, REPO

runner = CliRunner()
PROFILES = FIXTURE_PROFILES
BASELINE = PROFILES / "embedded-dsv4-flash-c32-ctx8192-baseline.json"
BOTH = PROFILES / "embedded-dsv4-flash-c32-ctx8192-mma-attn+bf16-gemm.json"
WIDTHS = [80, 120]


def run(width: int, *args: str) -> str:
    r = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    return r.output


def check_lines(text: str, width: int) -> None:
    for line in text.splitlines():
        # a path is printed whole (soft-wrapped by the terminal), so only a line with one may be wider
        assert len(line) <= width or "/" in line, f"{len(line)} > {width}: {line!r}"
        # only a kernel name, the first cell of its row, may be shortened: never a figure or a unit
        if "…" in line:
            first_cell_end = line.find("  ") if "  " in line else len(line)
            assert line.rindex("…") < first_cell_end, f"cut after the first cell: {line!r}"


@pytest.mark.parametrize("width", WIDTHS)
def test_recommend(width):
    text = run(width, "recommend", str(BASELINE))
    check_lines(text, width)
    candidates = {"grouped-moe", "mma-attn", "bf16-gemm", "fuse-glue", "torch-compile", "fp8-weights"}
    first_cells = {line.split()[0] for line in text.splitlines() if line.split()}
    assert candidates <= first_cells  # each typed name whole, at the start of its row
    assert "`dsv4opt apply grouped-moe`" in text.replace("\n", " ")
    assert re.search(r"\b\d+\.\d{2}x\b", text) and re.search(r"\b\d+\.\d+ (ms|µs)\b", text)


@pytest.mark.parametrize("width", WIDTHS)
def test_list(width):
    text = run(width, "list")
    check_lines(text, width)
    for opt in OPTIMIZATIONS.values():
        assert re.search(rf"^{re.escape(opt.name)}\s.*{opt.env_gate}=1\s", text, re.M), text
    assert "`dsv4opt list --check`" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_list_after_the_gates_ran_on_a_named_gpu(width):
    """The verdict column ("passes on NVIDIA H200") made the table too wide at 80 columns and cut
    every column, the names and env gates a user types included; it goes under the table instead."""
    from dsv4opt.state import CheckVerdict

    save_state(State(checks={o: CheckVerdict(passed=o != "torch-compile", device="NVIDIA H200")
                             for o in OPTIMIZATIONS}))
    text = run(width, "list")
    check_lines(text, width)
    assert "…" not in text
    for opt in OPTIMIZATIONS.values():
        assert re.search(rf"^{re.escape(opt.name)}\s.*{opt.env_gate}=1\s", text, re.M), text
    flat = " ".join(text.split())
    assert "passes on NVIDIA H200" in flat and "FAILS on NVIDIA H200" in flat


@pytest.mark.parametrize("width", WIDTHS)
def test_compare(width):
    text = run(width, "compare", str(BASELINE), str(BOTH))
    check_lines(text, width)
    moved = text[text.index("moved most"):text.index("before: #1")].splitlines()[3:]
    names = []  # a name shortened, or shown whole over several lines where shortened ones would look alike
    for line in moved:
        cell, rest = line[:line.find("  ")] if "  " in line else line, line[line.find("  "):] if "  " in line else ""
        if rest.strip():
            names.append(cell.strip())
        elif names:
            names[-1] += cell.strip()
    assert len(names) == 10 and len(set(names)) == 10  # still ten different kernels
    before, after = Profile.load(BASELINE), Profile.load(BOTH)
    # the figures this line must carry, worked out from the profiles here
    a, b = before.throughput["ms_per_step"], after.throughput["ms_per_step"]
    assert f"ms/step {a:.2f} -> {b:.2f}: {a / b:.2f}x" in text.replace("\n", " ")
    assert "gpu_us_per_step" not in text and "tokens_per_s" not in text
    assert not re.search(r"x\d+\.\d+", text)  # one speed-up notation: 1.02x, never x1.02
    assert "glue: sum of the 5 rows above" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_status(width):
    save_state(State(enabled=["bf16-gemm"], last_profile=str(BASELINE)))
    text = run(width, "status")
    check_lines(text, width)
    assert f"state: {state_path()}" in text and f"last profile: {BASELINE}" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_and_apply(width, tmp_path, monkeypatch):
    """Both print tables from profiles; the profiles come from a stand-in of the capture here."""
    source = {(): BASELINE, ("mma-attn",): BOTH, ("bf16-gemm",): BOTH}

    def fake_profile(settings, progress=None):
        prof = Profile.load(source[tuple(settings.optimizations)])
        prof.meta.update(concurrency=settings.concurrency, optimizations=list(settings.optimizations))
        out = settings.out or tmp_path / f"p-{len(list(tmp_path.glob('p-*')))}.json"
        return prof, prof.save(out)

    monkeypatch.setattr("dsv4opt.loop.profiles.profile_embedded", fake_profile)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sw").mkdir()
    text = run(width, "sweep", "-c", "1,64", "--with", "mma-attn", "--device", "cpu", "--config", "dsv4-flash",
               "--out-dir", "sw")
    check_lines(text, width)
    assert re.search(r"^\s*64\s+mma-attn\s+[\d.]+\s+[\d.]+\s+[\d.]+x", text, re.M), text

    monkeypatch.setattr(Optimization, "check", lambda self, device=None: CheckResult(
        self.name, True, "cuda", {"rel_err": 0.001}, {"rel_err": 0.01}, "ok"))
    monkeypatch.setattr("dsv4opt.loop.apply._loop_device", lambda state: "cuda")
    save_state(State(last_profile=str(BASELINE)))
    text = run(width, "apply", "bf16-gemm")
    check_lines(text, width)
    assert "bf16-gemm is on" in text and "ms/step" in text


def test_the_width_is_read_when_printing_not_when_importing():
    """A terminal's COLUMNS when dsv4opt is imported (a developer's shell, a CI runner) must not fix the
    width: the runner's COLUMNS, set when the command runs, is what the output fits."""
    import subprocess
    import sys

    script = ("from typer.testing import CliRunner\n"
              "from dsv4opt.cli import app\n"
              f"r = CliRunner().invoke(app, ['recommend', {str(BASELINE)!r}], env={{'COLUMNS': '80'}})\n"
              "print(max(len(line) for line in r.output.splitlines()))\n")
    import os

    # keep the environment's own path (on the GPU machine msgspec comes from a carried --target folder)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) <= 80, out.stdout
