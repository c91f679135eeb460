"""The headline of a profile: what is #1, how fragmented the glue is, which fix matches."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.analysis.categories import GLUE
from dsv4opt.analysis.profile import CategoryRow, KernelRow, Profile
from dsv4opt.decision.fragmentation import Fragmentation, fragmentation
from dsv4opt.decision.recommend import Recommendation, recommend


@dataclass
class Diagnosis:
    top_kernel: KernelRow | None
    top_category: CategoryRow | None
    glue: Fragmentation
    recommendation: Recommendation
    cpu: bool = False  # ranked by CPU self time: "kernels" are CPU operators

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.top_kernel is None:
            return ["no kernels in this profile: nothing to diagnose"]
        k, c = self.top_kernel, self.top_category
        what = "operator" if self.cpu else "kernel"
        line = f"#1 {what}: {k.display_name} ({k.category_label}) {k.share:.1%}"
        if c is not None:
            line += f"; #1 category: {c.label} {c.share:.1%}"
        out.append(line)
        g = self.glue
        shape = "fragmented" if g.tiny else "not especially fragmented"
        out.append(
            f"glue: {g.share:.1%} over {g.launches_per_step:.0f} launches/step, median kernel "
            f"{g.median_kernel_us:.1f} µs ({shape})"
        )
        out += self.recommendation.explanation
        return out


def diagnose(profile: Profile, enabled: list[str] | None = None) -> Diagnosis:
    return Diagnosis(
        top_kernel=profile.top_kernel,
        top_category=profile.top_category,
        glue=fragmentation(profile, GLUE),
        recommendation=recommend(profile, enabled),
        cpu=profile.time_basis != "gpu",
    )
