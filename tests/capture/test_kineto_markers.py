"""Kineto's USDT marker lines stay off the terminal; every other byte written to stderr gets through."""

from __future__ import annotations

import os

import torch

from dsv4opt.capture.kineto_markers import without_kineto_markers


def _profile_one_op() -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(4).sum()


def test_marker_lines_dropped_errors_and_partial_lines_kept(capfd):
    with without_kineto_markers():
        os.write(2, b"USDT:2026-12-01 22:11:47 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"[W kineto] ERROR: CUPTI could not be initialised\n")
        os.write(2, b"US")  # could become a marker: held until the line ends
        os.write(2, b"ER said something\n")
        os.write(2, b"\rprofiling 3/10")  # a progress bar's redraw, no newline
    err = capfd.readouterr().err
    assert err == "[W kineto] ERROR: CUPTI could not be initialised\nUSER said something\n\rprofiling 3/10"


def test_a_real_profiler_run_prints_no_marker(capfd):
    _profile_one_op()
    raw = capfd.readouterr().err
    with without_kineto_markers():
        _profile_one_op()
    filtered = capfd.readouterr().err
    assert "USDT:" not in filtered
    # what the filter removed is exactly the marker lines this torch prints
    assert filtered == "".join(line for line in raw.splitlines(keepends=True) if not line.startswith("USDT:"))


def test_stderr_is_restored_after_an_error(capfd):
    try:
        with without_kineto_markers():
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    os.write(2, b"USDT:after\n")
    assert capfd.readouterr().err == "USDT:after\n"


def test_the_per_cycle_warning_is_dropped_and_no_other(recwarn):
    """torch 2.11 warns "Profiler clears events at the end of each cycle" on every GPU capture; a
    capture profiles one cycle by design. Only that warning goes; any other still shows."""
    import warnings

    from dsv4opt.capture.kineto_markers import quiet_profiler

    cycle = ("Warning: Profiler clears events at the end of each cycle. Only events from the current cycle will be "
             "reported. To keep events across cycles, set acc_events=True.")
    with quiet_profiler():
        warnings.warn(cycle, UserWarning)
        warnings.warn("Profiler: something else went wrong", UserWarning)
    assert [str(w.message) for w in recwarn] == ["Profiler: something else went wrong"]
    warnings.warn(cycle, UserWarning)  # outside a capture the filter is gone
    assert str(recwarn[-1].message) == cycle
