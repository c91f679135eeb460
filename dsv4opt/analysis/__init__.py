"""Classify, rank, attribute, diagnose and diff GPU kernels from a trace.

Public entry points (documented in docs/analysis.md): analyze_paths, load_profile_or_trace,
compare_profiles / Comparison, Profile.
"""

from dsv4opt.analysis.profile import Profile


def __getattr__(name):
    # Lazy: `from dsv4opt.analysis.profile import Profile` must not pull pandas-heavy modules in.
    if name in ("analyze_paths", "load_profile_or_trace"):
        from dsv4opt.analysis import api

        return getattr(api, name)
    if name in ("compare_profiles", "Comparison"):
        from dsv4opt.analysis import compare

        return getattr(compare, name)
    raise AttributeError(name)


__all__ = ["Comparison", "Profile", "analyze_paths", "compare_profiles", "load_profile_or_trace"]
