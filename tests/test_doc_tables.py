"""The tables in README.md and docs/results.md are what scripts/doc_tables.py prints from the
committed H200 profiles (evidence/h200/profiles/), through the functions `dsv4opt compare` uses."""

from __future__ import annotations

import pytest

from scripts import doc_tables
from tests.helpers import EVIDENCE_PROFILES, REPO


def test_the_committed_tables_are_what_the_profiles_print():
    assert doc_tables.drift() == [], "run `python scripts/doc_tables.py` and commit the tables it rewrites"


def test_every_table_is_in_a_document():
    named = set()
    for doc in doc_tables.DOCUMENTS:
        named |= set(doc_tables.blocks((REPO / doc).read_text()))
    assert named == set(doc_tables.TABLES)


def test_the_readme_names_the_top_category_compare_names():
    """The review's case: the C = 32 campaign row once said MoE 34.8% where compare says tensor-core GEMM."""
    from dsv4opt.analysis.compare import compare_profiles
    from dsv4opt.analysis.profile import Profile

    campaign = EVIDENCE_PROFILES / "layouts" / "campaign"
    before = Profile.load(campaign / "embedded-dsv4-flash-c32-baseline-20261204-112517.json")
    after = Profile.load(campaign / "embedded-dsv4-flash-c32-mma-attn+bf16-gemm+grouped-moe+torch-compile-20261204-113101.json")
    assert "#1 category now tensor-core GEMM 36.1%" in compare_profiles(before, after).verdict
    row = next(line for line in doc_tables.blocks((REPO / "README.md").read_text())["readme-campaign"].splitlines()
               if line.startswith("| 32 |"))
    assert row.endswith("| tensor-core GEMM 36.1% |")


def test_a_loop_left_off_step_is_shown_and_not_counted():
    """Hopper C = 32: torch-compile measured 0.92x, slower beyond the noise, so apply left it off."""
    base, steps = doc_tables.loop_steps(doc_tables.HOPPER, 32)
    assert [(s.name, s.kept) for s in steps] == [("mma-attn", True), ("torch-compile", False)]
    assert steps[1].change.slower and round(steps[1].change.speedup, 2) == 0.92


@pytest.mark.parametrize("body", ["| old |\n", ""])
def test_rewrite_replaces_only_the_named_block(body):
    text = f"a\n<!-- results:x -->\n{body}<!-- /results:x -->\nb\n<!-- results:y -->\nkeep\n<!-- /results:y -->\n"
    new = doc_tables.rewrite(text, {"x": "| new |\n"})
    assert new == "a\n<!-- results:x -->\n| new |\n<!-- /results:x -->\nb\n<!-- results:y -->\nkeep\n<!-- /results:y -->\n"
    assert doc_tables.blocks(new) == {"x": "| new |\n", "y": "keep\n"}
