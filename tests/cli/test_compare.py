import json

from typer.testing import CliRunner

from dsv4opt.cli import app

runner = CliRunner()


def _trace(path, kernels):
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": float(i), "dur": d} for i, (n, d) in enumerate(kernels)]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_compare_traces_and_profiles(tmp_path):
    a = _trace(tmp_path / "a.json", [("flash_decode_kernel", 57.0), ("ampere_sgemm_128x64_nn", 19.0), ("elementwise_kernel", 24.0)])
    b = _trace(tmp_path / "b.json", [("flash_decode_kernel", 5.0), ("ampere_sgemm_128x64_nn", 19.0), ("elementwise_kernel", 24.0)])
    pa = tmp_path / "pa.json"
    assert runner.invoke(app, ["analyze", str(a), "--json", str(pa)]).exit_code == 0
    out = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", str(pa), str(b), "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["bottleneck_moved"] and data["verdict"].startswith("bottleneck moved: attention 57.0%")
    assert "bottleneck moved" in r.output


def test_compare_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "dsv4opt.profile/9"}')
    out = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", str(bad), str(tmp_path / "missing.json"), "--json", str(out)])
    assert r.exit_code == 1 and "Traceback" not in r.output and not out.exists()


def test_compare_refuses_profiles_run_under_different_settings(tmp_path):
    """C = 1 baseline against C = 64 with both optimisations: tokens/s would read as 'x1.23' of nothing."""
    from tests.helpers import FIXTURE_PROFILES as root

    a, b = root / "embedded-dsv4-flash-c1-ctx8192-baseline.json", root / "embedded-dsv4-flash-c64-ctx8192-mma-attn+bf16-gemm.json"
    r = runner.invoke(app, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "concurrency: 1 -> 64" in r.output and "--force" in r.output
    r = runner.invoke(app, ["compare", str(a), str(b), "--force"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "warning: settings differ, concurrency: 1 -> 64" in r.output
    same = root / "embedded-dsv4-flash-c1-ctx8192-mma-attn+bf16-gemm.json"
    r = runner.invoke(app, ["compare", str(a), str(same)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "warning" not in r.output.lower()


CAMPAIGN_C32 = "layouts/campaign/embedded-dsv4-flash-c32-baseline-20261204-112517.json"  # SGLang 0.5.14, sm_120
HOPPER_C32 = "hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"  # SGLang 0.5.23, Hopper


def test_compare_refuses_two_sglang_paths(tmp_path):
    """The sm_120 baseline against the Hopper one once read "45.97x, faster": two baselines, not a change."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "evidence" / "h200" / "profiles"
    a, b = root / CAMPAIGN_C32, root / HOPPER_C32
    assert (json.loads(a.read_text())["meta"]["sglang"], json.loads(b.read_text())["meta"]["sglang"]) == ("0.5.14", "0.5.23")
    r = runner.invoke(app, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "sglang: 0.5.14 -> 0.5.23" in r.output and "--force" in r.output and "faster" not in r.output
    r = runner.invoke(app, ["compare", str(a), str(b), "--force"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "warning: settings differ, sglang: 0.5.14 -> 0.5.23: this comparison mixes runs" in r.output


def test_a_profile_from_before_the_sglang_setting_ran_the_sm120_path(tmp_path):
    """Campaign profiles of 3 December record no SGLang path: they ran 0.5.14's, the only one then."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "evidence" / "h200" / "profiles"
    old = root / "layouts/campaign/embedded-dsv4-flash-c1-baseline-20261203-091834.json"
    assert "sglang" not in json.loads(old.read_text())["meta"]
    hopper = root / "hopper-0.5.23/embedded-dsv4-flash-c1-baseline-20261204-033701.json"
    r = runner.invoke(app, ["compare", str(old), str(hopper)], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "sglang: 0.5.14 -> 0.5.23" in r.output
