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
    assert r.exit_code == 0 and "WARNING: settings differ, concurrency: 1 -> 64" in r.output
    same = root / "embedded-dsv4-flash-c1-ctx8192-mma-attn+bf16-gemm.json"
    r = runner.invoke(app, ["compare", str(a), str(same)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "WARNING" not in r.output
