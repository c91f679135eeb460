"""The SGLang target end to end against the stand-in server, including every fault in the issue.

Each fault must end with a CaptureError that says what to do, leave no request open on the server
and no profile (or temporary file) where --out pointed.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from dsv4opt.loop.profiles import profile_sglang
from dsv4opt.capture.sglang.client import SGLangClient
from dsv4opt.capture.sglang.load import LoadGenerator
from dsv4opt.errors import CaptureError, DsvOptError
from tests.capture.sglang.conftest import small_settings

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _gpu_time_us(trace: dict) -> float:
    return sum(e["dur"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS)


def _calls(standin, path):
    return [body for _, p, body in standin.calls if p == path]


def test_profile_end_to_end(standin, served_trace, tmp_path):
    settings = small_settings(standin.url, tmp_path, optimizations=["mma-attn"])
    prof, path = profile_sglang(settings)

    assert path == settings.out and path.is_file()
    saved = json.loads(path.read_text())
    assert saved["meta"]["target"] == "sglang" and saved["meta"]["concurrency"] == 4
    assert saved["meta"]["model"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert saved["meta"]["sglang_version"] == standin.version
    assert saved["meta"]["optimizations"] == ["mma-attn"]
    assert saved["meta"]["load"]["steady"] is True and saved["meta"]["rank_names"] == ["TP0", "TP1"]
    # Both ranks serve the same trace: GPU time is twice its plain sum of durations.
    assert prof.total_us == pytest.approx(2 * _gpu_time_us(served_trace))
    assert saved["throughput"]["tokens_per_s"] > 0 and saved["throughput"]["ms_per_step"] > 0

    (body,) = _calls(standin, "/start_profile")
    assert body["output_dir"] == saved["meta"]["trace_dir"] and body["num_steps"] == 3
    assert body["activities"] == ["CPU", "GPU"]
    assert standin.max_active == 4  # exactly C in flight
    assert standin.wait_idle()  # and all cancelled at the end


def test_stage_split_traces_use_decode_files(standin, tmp_path):
    prof, _ = profile_sglang(small_settings(standin.url, tmp_path, profile_by_stage=True))
    assert all(s.endswith("-DECODE.trace.json.gz") for s in prof.meta["sources"])
    assert len(prof.meta["sources"]) == 2


def test_older_server_routes(standin, tmp_path):
    standin.legacy_routes = True
    prof, _ = profile_sglang(small_settings(standin.url, tmp_path))
    assert prof.meta["sglang_version"] == standin.version
    assert ("GET", "/get_server_info", None) in standin.calls


def test_load_keeps_exactly_c_in_flight_and_replaces_finished(standin):
    async def run():
        async with SGLangClient(standin.url, connect_timeout_s=1, request_timeout_s=2, stall_timeout_s=1) as client:
            load = LoadGenerator(client, concurrency=3, prompt_len=4, max_new_tokens=5, stall_timeout_s=1)
            load.start()
            await load.run_for(0.4)
            await load.close()
            return load

    load = asyncio.run(run())
    assert standin.max_active == 3
    assert standin.generate_requests > 3
    # a request sent just before close() may not have reached the server: at most one per slot
    assert standin.generate_requests <= len(load.records) <= standin.generate_requests + 3
    done = [r for r in load.records if r.finished_s is not None]
    assert done and all(r.finish_reason == {"type": "length", "length": 5} for r in done)
    assert all(r.events[-1][1] == 5 for r in done)
    assert standin.wait_idle()


def _fails(settings, match):
    with pytest.raises(CaptureError, match=match):
        profile_sglang(settings)
    out_dir = settings.out.parent
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_unreachable_server(free_port_url, tmp_path):
    _fails(small_settings(free_port_url, tmp_path), "cannot reach an SGLang server")


def test_wrong_url(standin, tmp_path):
    standin.not_sglang = True
    _fails(small_settings(standin.url, tmp_path), "not an SGLang server")


def test_http_500_on_generate(standin, tmp_path):
    standin.generate_status = 500
    _fails(small_settings(standin.url, tmp_path), "HTTP 500 for /generate: stand-in failure")
    assert standin.wait_idle()


def test_http_500_on_start_profile(standin, tmp_path):
    standin.profile_status = 500
    _fails(small_settings(standin.url, tmp_path), "HTTP 500 for /start_profile")
    assert _calls(standin, "/stop_profile") == []  # not ours to stop
    assert standin.wait_idle()


def test_profile_never_finishes_writing(standin, tmp_path):
    standin.profile_mode = "never_finishes"
    _fails(small_settings(standin.url, tmp_path), "TP-0.trace.json.gz.*never finished writing")
    assert len(_calls(standin, "/stop_profile")) == 1  # best-effort: leave no profiler running
    assert standin.wait_idle()


def test_trace_directory_stays_empty(standin, tmp_path):
    standin.profile_mode = "no_files"
    _fails(small_settings(standin.url, tmp_path), "stayed empty")
    assert standin.wait_idle()


def test_traces_written_on_another_machine(standin, tmp_path):
    standin.profile_mode = "elsewhere"
    _fails(small_settings(standin.url, tmp_path), "does not exist on this machine.*--trace-dir.*dsv4opt analyze")
    assert standin.wait_idle()


def test_stalled_requests(standin, tmp_path):
    # Each stream goes silent after its first token, so once all four are decoding none will ever
    # send again: the window must find all four silent however late the loop gets to it. Timeouts
    # long enough that only the window check can end the run, on a loaded machine too.
    standin.stall_after = 1
    settings = small_settings(standin.url, tmp_path, stall_timeout_s=60.0, ready_timeout_s=60.0)
    _fails(settings, "4 of 4 requests got no token during the 0.3 s window: the server stalled")
    assert standin.wait_idle()


def test_prefill_never_ends(standin, tmp_path):
    standin.stall_after = 0
    _fails(small_settings(standin.url, tmp_path, ready_timeout_s=0.5, stall_timeout_s=5.0),
           "gave up after 0.5 s waiting for all 4 requests")
    assert standin.wait_idle()


def test_existing_output_is_not_touched(standin, tmp_path):
    settings = small_settings(standin.url, tmp_path)
    settings.out.write_text("mine")
    with pytest.raises(DsvOptError, match="exists"):
        profile_sglang(settings)
    assert settings.out.read_text() == "mine" and standin.calls == []


def test_url_without_scheme(tmp_path):
    with pytest.raises(DsvOptError, match="http://HOST:PORT"):
        profile_sglang(small_settings("127.0.0.1:30000", tmp_path))


def _cli(url, tmp_path, *extra):
    from typer.testing import CliRunner

    from dsv4opt.cli import app

    (tmp_path / "out").mkdir(exist_ok=True)  # --out's folder is the user's to make
    args = ["profile", "--target", "sglang", "--url", url, "-c", "4", "--prompt-len", "8", "--steps", "3",
            "--window", "0.3", "--timeout", "3", "--stall-timeout", "1", "--max-new-tokens", "100000",
            "--trace-dir", str(tmp_path / "traces"), "--out", str(tmp_path / "out" / "p.json"), *extra]
    return CliRunner().invoke(app, args)


def test_cli_profile(standin, tmp_path):
    result = _cli(standin.url, tmp_path, "--with", "mma-attn")
    assert result.exit_code == 0, result.output
    assert "profile saved" in result.output
    assert json.loads((tmp_path / "out" / "p.json").read_text())["meta"]["optimizations"] == ["mma-attn"]


def test_cli_fault_is_one_line(standin, tmp_path):
    standin.generate_status = 500
    result = _cli(standin.url, tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: server returned HTTP 500 for /generate" in result.output
    assert list((tmp_path / "out").iterdir()) == []


def test_default_output_goes_under_profiles(standin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, path = profile_sglang(small_settings(standin.url, tmp_path, out=None))
    assert path.resolve().parent == (tmp_path / "profiles").resolve()
    assert path.name.startswith("sglang-c4-baseline-") and path.is_file()
