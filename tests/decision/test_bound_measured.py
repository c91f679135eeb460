"""recommend's Amdahl bound is an upper bound on what applying the optimisation measured.

Every committed pair of embedded profiles under evidence/h200/profiles/ that differ by one optimisation: the same
settings, device and commit (tokens/s from two commits would mix a code change into the ratio), the
"after" profile's optimisations those of "before" plus one. The bound recommend gives that
optimisation on "before" must reach the measured tokens/s ratio, within 2% (the run-to-run noise of
the committed repeats, and GPU time per step against wall-clock tokens/s). An optimisation recommend
does not list on "before" is bounded at 1x: it promised nothing.
"""

from __future__ import annotations

import json
from functools import cache
from itertools import permutations

import pytest

from dsv4opt.analysis.profile import Profile
from dsv4opt.decision.recommend import candidates
from tests.helpers import EVIDENCE_PROFILES

PROFILES = EVIDENCE_PROFILES
TOLERANCE = 0.02


@cache
def _embedded() -> dict[str, dict]:
    out = {}
    for path in sorted(PROFILES.rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        meta = data.get("meta") if isinstance(data, dict) else None
        if meta and meta.get("target") == "embedded" and (data.get("throughput") or {}).get("tokens_per_s"):
            out[str(path.relative_to(PROFILES))] = data
    return out


def _run(data: dict) -> str:
    meta = data["meta"]
    return json.dumps([meta.get("settings"), meta.get("device"), meta.get("commit")], sort_keys=True)


def _pairs() -> list[tuple[str, str, str]]:
    """(before, after, the optimisation added) for every committed pair."""
    profiles = _embedded()
    out = []
    for (a, da), (b, db) in permutations(profiles.items(), 2):
        before, after = set(da["meta"]["optimizations"] or []), set(db["meta"]["optimizations"] or [])
        if _run(da) == _run(db) and before < after and len(after - before) == 1:
            out.append((a, b, next(iter(after - before))))
    return out


PAIRS = _pairs()


def test_the_committed_campaign_pairs_are_found():
    # the tp4 loops of docs/results.md: four applies at C = 1, 32 and 64, and the earlier C = 32 loop's
    # three (cut before torch-compile, the previous grouped-moe kernel)
    profiles = _embedded()
    campaign = [(n, profiles[a]["meta"]["concurrency"]) for a, _, n in PAIRS if a.startswith("layouts/campaign/")]
    assert sorted(campaign) == sorted(
        [(n, c) for n in ("mma-attn", "bf16-gemm", "grouped-moe", "torch-compile") for c in (1, 32, 64)]
        + [("mma-attn", 32), ("grouped-moe", 32), ("bf16-gemm", 32)])
    assert len(PAIRS) >= 30


@pytest.mark.parametrize("before,after,added", PAIRS, ids=[f"{a} +{n}" for a, _, n in PAIRS])
def test_the_bound_on_before_reaches_the_measured_ratio(before, after, added):
    profiles = _embedded()
    measured = (profiles[after]["throughput"]["tokens_per_s"] / profiles[before]["throughput"]["tokens_per_s"])
    listed = {c.name: c for c in candidates(Profile.load(PROFILES / before))}
    bound = listed[added].amdahl_bound if added in listed else 1.0
    assert bound >= measured * (1 - TOLERANCE), f"{added}: bound {bound:.3f}x, measured {measured:.3f}x"
