"""The loop as a user runs it, through the CLI only: profile, then recommend, then apply what it
recommends, until it recommends nothing the tool can apply. One folder per run (its own state file),
every command's output kept, and a summary of the steps: the bound recommend predicted for each
apply and the tokens/s measured before and after it.

    python scripts/user_loop.py -c 32 --out runs/c32 [--layout tp4] [-- extra profile options]

Nothing here decides anything: the choices are recommend's, the figures the profiles'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_APPLIES = 8


def dsv4opt(args: list[str], cwd: Path, env: dict, log) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dsv4opt", *args]
    log.write(f"$ dsv4opt {' '.join(args)}\n")
    log.flush()
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    log.write(run.stdout + run.stderr + f"[exit {run.returncode}]\n\n")
    log.flush()
    print(f"dsv4opt {' '.join(args)} -> exit {run.returncode}", flush=True)
    return run


def last_profile(state_file: Path) -> str:
    return json.loads(state_file.read_text())["last_profile"]


def tokens_per_s(path: str, cwd: Path) -> float:
    return json.loads((cwd / path).read_text())["throughput"]["tokens_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--concurrency", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True, help="a new folder for this run")
    ap.add_argument("--layout", default="tp4")
    ap.add_argument("extra", nargs="*", help="more `dsv4opt profile` options (after --)")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=False)
    (out / ".dsv4opt").mkdir()
    state = out / ".dsv4opt" / "state.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "DSV4OPT_STATE": str(state), "COLUMNS": "120"}
    steps = []
    with open(out / "console.log", "w") as log:
        run = dsv4opt(["profile", "-c", str(a.concurrency), "--layout", a.layout, *a.extra], out, env, log)
        if run.returncode:
            return run.returncode
        for _ in range(MAX_APPLIES):
            before = last_profile(state)
            rec_file = out / f"recommend-{len(steps)}.json"
            if dsv4opt(["recommend", "--json", str(rec_file)], out, env, log).returncode:
                return 1
            rec = json.loads(rec_file.read_text())
            chosen = rec["chosen"]
            cand = next((c for c in rec["candidates"] if c["name"] == chosen), None)
            if chosen is None or cand is None or cand["kind"] != "optimisation" or cand["enabled"]:
                steps.append({"stop": chosen, "explanation": rec["explanation"]})
                break
            applied = dsv4opt(["apply", chosen], out, env, log)
            after = last_profile(state)
            steps.append({
                "apply": chosen, "exit": applied.returncode, "bound": cand.get("amdahl_bound"),
                "share": cand.get("share"), "before": before, "after": after,
                "tokens_per_s_before": tokens_per_s(before, out), "tokens_per_s_after": tokens_per_s(after, out),
            })
            if applied.returncode or after == before:
                break
    (out / "summary.json").write_text(json.dumps({"concurrency": a.concurrency, "layout": a.layout, "steps": steps},
                                                 indent=1))
    print(json.dumps(steps, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
