#!/usr/bin/env python3
"""Whole-process speed and peak memory on big traces: dsv4opt analyze vs HTA's kernel breakdown vs
a plain json.load loop, same files, same machine, interleaved runs.

    python -m venv /root/.cache/hta-venv && /root/.cache/hta-venv/bin/pip install torch HolisticTraceAnalysis
    python benchmarks/bench_reader.py ../shared/traces/tracelens_h100_qwen1.5_0.5b.json.gz --mb 53.7 500 --repeat 3 \
        --hta-python /root/.cache/hta-venv/bin/python

HTA is not a dsv4opt dependency: its row runs under --hta-python (a virtualenv of its own), or under
this interpreter when HTA is importable here.

dsv4opt's modules are compiled to bytecode first (--no-compile: not), as an installed package's
are. Each size is built once by benchmarks/make_big_trace.py (whole time-shifted copies of the source,
so a size is reached to within one copy) into /tmp/dsv4opt-bench/<size>/, a folder of its own as
HTA reads folders. Every row is a fresh process timed by /usr/bin/time (wall, user+sys CPU of the
process and the children it waited for, peak resident memory of the largest of them), and the CPU
time of its work after its imports, measured inside it (interpreter start, importing pandas and
parsing the command line are a fixed ~0.5 s of dsv4opt's time). `dsv4opt analyze` is the command
as a user types it, `python -m dsv4opt analyze TRACE --json OUT`; the row "(work timed)" runs the
same main() with a timer from its call of analyze_paths, plus the CPU time of the helper that
reads the trace while the command imports (trace/prefetch.py). Then, apart from the timed runs
(sampling costs CPU), each row runs --memory-runs times more while its process tree's memory is
sampled every 5 ms: the peak of the sum of its processes' PSS (shared pages divided among the
processes sharing them) and of their RSS (shared pages counted in each), since /usr/bin/time
reports the largest single process only. Ratios on medians of the runs. The check runs first:
dsv4opt's GPU total must equal the plain json.load sum exactly; when it does not, no ratio is
printed. Benchmarks never assert.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = Path("/tmp/dsv4opt-bench")

# Each row prints, last, a JSON line with its GPU total and the CPU time of its work after its
# imports ("work"), so the fixed cost of starting Python and importing pandas can be told apart.
# dsv4opt's timed row runs the command as `dsv4opt analyze` does, its imports inside the command;
# its work is timed from the command's call of analyze_paths (read, analyse, print, write the
# profile), plus all the CPU time of the reading helper it forked and reaped (children's times).
DSV4OPT = """
import contextlib, io, json, os, sys, time
import dsv4opt.analysis
from dsv4opt.cli import main
lazy = dsv4opt.analysis.__getattr__
start = []
def timed(name):
    found = lazy(name)
    if name != 'analyze_paths':
        return found
    def analyze_paths(*args, **kwargs):
        start.append(time.process_time())
        return found(*args, **kwargs)
    return analyze_paths
dsv4opt.analysis.__getattr__ = timed
out = sys.argv[2]
sys.argv = ['dsv4opt', 'analyze', sys.argv[1], '--json', out, '--force']
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
children = os.times()
work = time.process_time() - start[0] + children.children_user + children.children_system
print(json.dumps({'gpu_us': json.load(open(out))['gpu_time_us'], 'work_s': work}))
"""
PLAIN = """
import json, math, sys, time
t = time.process_time()
events = json.load(open(sys.argv[1]))['traceEvents']
total = math.fsum(e['dur'] for e in events if e.get('ph') == 'X' and e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset'))
print(json.dumps({'gpu_us': total, 'work_s': time.process_time() - t}))
"""
# `python -m dsv4opt analyze TRACE --json OUT --force` with another copy of dsv4opt first on the path
# (--baseline: e.g. `git archive COMMIT dsv4opt | tar -x -C DIR`), so before and after run alike.
BASELINE = """
import sys
sys.path.insert(0, sys.argv[1])
from dsv4opt.cli import main
sys.argv = ['dsv4opt', 'analyze', *sys.argv[2:], '--force']
main()
"""
HTA = """
import json, sys, time
from hta.trace_analysis import TraceAnalysis
t = time.process_time()
kernel_type, kernels = TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)
print(json.dumps({'gpu_us': float(kernel_type['sum'].sum()), 'work_s': time.process_time() - t}))
"""


def build(source: Path, mb: float) -> Path:
    folder = OUT / f"{source.name.split('.')[0]}-{mb:g}mb"
    trace = folder / "trace.json"
    if not trace.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_big_trace.py"), str(source), str(trace), "--mb", str(mb)],
                       check=True)
    return trace


def timed(cmd: list[str]) -> dict:
    """Run cmd under /usr/bin/time; its figures and the JSON line it printed last."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        out = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%e %U %S %M", *cmd], capture_output=True, text=True, cwd=REPO)
        wall, user, sys_, rss = t.read().split()[-4:]
    row = {"wall_s": float(wall), "cpu_s": float(user) + float(sys_), "peak_mb": int(rss) / 1024, "ok": out.returncode == 0}
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if lines:
        row.update(json.loads(lines[-1]))
    elif not row["ok"]:
        row["error"] = (out.stderr.strip().splitlines() or ["?"])[-1]
    return row


def tree_memory(cmd: list[str]) -> dict:
    """Run cmd, sampling its process tree every 5 ms: peak of the summed PSS and of the summed RSS, MB."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    peak_pss = peak_rss = 0
    while proc.poll() is None:
        pss = rss = 0
        for pid in _tree(proc.pid):
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Rss:"):
                            rss += int(line.split()[1])
                        elif line.startswith("Pss:"):
                            pss += int(line.split()[1])
            except OSError:
                pass  # gone between listing and reading
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(0.005)
    return {"tree_pss_mb": peak_pss / 1024, "tree_rss_mb": peak_rss / 1024}


def _tree(root: int) -> list[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, p in parent.items() if p == pid]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--mb", type=float, nargs="+", default=[53.7, 500.0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-runs", type=int, default=2, help="runs per row with the process tree's memory sampled")
    ap.add_argument("--baseline", type=Path, help="a folder holding another dsv4opt package to time alike (before/after)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-python", default=None,
                    help="interpreter with HolisticTraceAnalysis installed (default: this one, if it has HTA)")
    ap.add_argument("--no-compile", action="store_true",
                    help="run the checkout's dsv4opt as it is; by default its modules are compiled to bytecode first, "
                         "as pip install does for HTA and every installed package (with PYTHONDONTWRITEBYTECODE=1 and "
                         "no __pycache__, each run compiles them from source)")
    args = ap.parse_args()
    if not args.no_compile:
        for root in (REPO, *([args.baseline] if args.baseline else [])):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "dsv4opt")], check=True)
    hta_python = args.hta_python or sys.executable
    have_hta = not args.no_hta and subprocess.run([hta_python, "-c", "import hta"], capture_output=True).returncode == 0
    if not have_hta and not args.no_hta:
        print(f"HTA not importable by {hta_python} (pip install HolisticTraceAnalysis, or --hta-python): no HTA row")
    for mb in args.mb:
        trace = build(args.source, mb)
        profile = Path(tempfile.mkdtemp()) / "p.json"
        rows = {
            "dsv4opt analyze": [sys.executable, "-m", "dsv4opt", "analyze", str(trace), "--json", str(profile), "--force"],
            "dsv4opt analyze (work timed)": [sys.executable, "-c", DSV4OPT, str(trace), str(profile)],
            "plain json.load loop": [sys.executable, "-c", PLAIN, str(trace)],
        }
        if args.baseline:
            rows["dsv4opt analyze (baseline)"] = [sys.executable, "-c", BASELINE, str(args.baseline), str(trace), "--json",
                                                  str(profile.with_name("baseline.json"))]
        if have_hta:
            rows["HTA get_gpu_kernel_breakdown"] = [hta_python, "-c", HTA, str(trace.parent)]
        runs: dict[str, list[dict]] = {k: [] for k in rows}
        for _ in range(args.repeat):
            for name, cmd in rows.items():  # interleaved, so a burst of load hits every row alike
                runs[name].append(timed(cmd))
                if name in ("dsv4opt analyze", "dsv4opt analyze (baseline)") and runs[name][-1]["ok"]:
                    written = profile if name == "dsv4opt analyze" else profile.with_name("baseline.json")
                    runs[name][-1]["gpu_us"] = json.loads(written.read_text())["gpu_time_us"]
        memory: dict[str, list[dict]] = {k: [] for k in rows}
        for _ in range(args.memory_runs):
            for name, cmd in rows.items():
                memory[name].append(tree_memory(cmd))
        size = trace.stat().st_size / 1e6
        print(f"\n{trace} ({size:.1f} MB), median of {args.repeat}")
        print(f"{'reader':30} {'wall s':>8} {'CPU s':>8} {'work CPU s':>11} {'peak MB':>8} {'tree PSS':>9} {'tree RSS':>9} "
              f"{'GPU total µs':>16}")
        med = {}
        for name, rs in runs.items():
            good = [r for r in rs if r["ok"]]
            if not good:
                print(f"{name:30} failed: {rs[-1].get('error')}")
                continue
            med[name] = {k: statistics.median(r.get(k, float("nan")) for r in good) for k in ("wall_s", "cpu_s", "work_s")}
            med[name]["peak_mb"] = max(r["peak_mb"] for r in good)
            med[name].update({k: max((r[k] for r in memory[name]), default=float("nan"))
                              for k in ("tree_pss_mb", "tree_rss_mb")})
            med[name]["gpu_us"] = good[0].get("gpu_us")
            m = med[name]
            print(f"{name:30} {m['wall_s']:>8.2f} {m['cpu_s']:>8.2f} {m['work_s']:>11.2f} {m['peak_mb']:>8.0f} "
                  f"{m['tree_pss_mb']:>9.0f} {m['tree_rss_mb']:>9.0f} {m['gpu_us'] or float('nan'):>16,.1f}")
        ours, plain = med.get("dsv4opt analyze"), med.get("plain json.load loop")
        timed_row = med.get("dsv4opt analyze (work timed)")
        if not ours or not plain or ours["gpu_us"] != plain["gpu_us"] or (timed_row and timed_row["gpu_us"] != plain["gpu_us"]):
            print("check FAILED: dsv4opt's GPU total differs from the plain sum; no ratios")
            continue
        print("check: dsv4opt's GPU total equals the plain json.load sum")
        theirs = med.get("HTA get_gpu_kernel_breakdown")
        if theirs:
            work = f", {theirs['work_s'] / timed_row['work_s']:.1f}x by the CPU time of the work after imports" if timed_row else ""
            before = med.get("dsv4opt analyze (baseline)")
            if before:
                print(f"baseline vs HTA: {theirs['wall_s'] / before['wall_s']:.1f}x faster by wall clock, "
                      f"{theirs['cpu_s'] / before['cpu_s']:.1f}x by CPU time; peak memory {before['peak_mb'] / theirs['peak_mb']:.0%} "
                      f"of HTA's (largest process), process tree {before['tree_pss_mb'] / theirs['tree_pss_mb']:.0%} by PSS")
            print(f"dsv4opt vs HTA: {theirs['wall_s'] / ours['wall_s']:.1f}x faster by wall clock, "
                  f"{theirs['cpu_s'] / ours['cpu_s']:.1f}x by CPU time{work}; peak memory "
                  f"{ours['peak_mb'] / theirs['peak_mb']:.0%} of HTA's (largest process), process tree "
                  f"{ours['tree_pss_mb'] / theirs['tree_pss_mb']:.0%} by PSS, {ours['tree_rss_mb'] / theirs['tree_rss_mb']:.0%} by RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
