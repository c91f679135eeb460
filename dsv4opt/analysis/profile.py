"""The profile: what every capture writes and every command reads (schema dsv4opt.profile/1).

A profile is plain JSON so other tools can read it; this module is the only place that knows its
shape (docs/profile-schema.md). Its rows are typed; what a file holds is checked on load
(dsv4opt/validate.py), so a malformed field is one line naming it. Top-level keys this version
does not know pass through untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from dsv4opt.analysis.categories import CATEGORIES, GLUE, category_label
from dsv4opt.errors import ProfileError
from dsv4opt.fileio import finite, write_json_atomic
from dsv4opt.validate import convert, read_json

SCHEMA = "dsv4opt.profile/1"
TIME_BASES = ("gpu", "cpu_self")
TIME_LABELS = {"gpu": "GPU time", "cpu_self": "CPU self time"}
# Other files dsv4opt writes, named when one is given where a profile is expected.
OTHER_SCHEMAS = {
    "dsv4opt.sweep/1": "a sweep summary",
    "dsv4opt.comparison/1": "a comparison (compare --json)",
    "dsv4opt.state/1": "the project state",
}


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"category: expected one of {', '.join(CATEGORIES)}, got {category!r}")


class KernelEfficiency(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Achieved rates of a kernel's modelled launches (analysis/efficiency.py): FLOPs and bytes of
    the operator calls that launched them, over their GPU time."""

    op: str  # the operator behind most of them
    launches: int
    modelled_us: float
    tflops: float  # 1e12 FLOP/s
    gbps: float  # 1e9 bytes/s (what the operator must read and write once: a floor)
    compute_of_peak: float | None = None  # fraction of the device's dense tensor-core/FP32 peak
    bandwidth_of_peak: float | None = None  # fraction of its HBM bandwidth


class KernelRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One kernel name, all its launches summed (a CPU operator when time_basis is cpu_self)."""

    name: str
    short_name: str | None = None
    category: str
    count: int
    total_us: float
    mean_us: float | None = None
    share: float  # of the profile's total_us
    # Top kernels only: who launched them (docs/profile-schema.md).
    launched_by: str | None = None
    source: str | None = None
    graph_replay_share: float | None = None
    capture_matched: str | None = None
    part: str | None = None
    # Spread of its launch durations (GPU profiles).
    min_us: float | None = None
    median_us: float | None = None
    p90_us: float | None = None
    max_us: float | None = None
    std_us: float | None = None  # population standard deviation
    # Where the trace recorded shapes: the rate of the operator calls that launched it.
    efficiency: KernelEfficiency | None = None

    def __post_init__(self) -> None:
        _check_category(self.category)

    @property
    def display_name(self) -> str:
        return self.short_name or self.name

    @property
    def category_label(self) -> str:
        return category_label(self.category)


class CategoryRow(msgspec.Struct, kw_only=True):
    category: str
    count: int
    total_us: float
    share: float

    def __post_init__(self) -> None:
        _check_category(self.category)

    @property
    def label(self) -> str:
        return category_label(self.category)


class PartRow(msgspec.Struct, kw_only=True):
    """Time under one record_function range (a model part: attn, indexer, ...)."""

    part: str
    count: int
    total_us: float
    share: float


class RankTimeline(msgspec.Struct, kw_only=True):
    """One rank's work over its window, the whole trace (analysis/rank_balance.py)."""

    basis: str  # "gpu": its kernels; "cpu": its top-level operators and the backend's ranges, wall time
    steps: int  # profiler steps in the trace (0: none found)
    window_us: float  # the first interval's start to the last one's end
    compute_us: float  # covered by work other than communication
    comm_us: float  # covered by communication
    overlap_us: float  # covered by both: communication hidden behind compute


class RankBalance(msgspec.Struct, kw_only=True):
    """The ranks of one run side by side (analysis/rank_balance.py)."""

    basis: str
    slowest_rank: int  # the most compute: the others wait for it inside their collectives
    imbalance: float  # its compute over the mean compute, minus 1
    comm_share: float  # communication over the rank's window, mean over ranks
    comm_share_max: float
    exposed_comm_share: float  # communication not hidden behind compute, mean over ranks
    compute_us_spread: float  # most minus least compute


class RankRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One trace file of a multi-file profile."""

    rank: int
    file: str
    device: str | None = None
    gpu_time_us: float
    cpu_self_us: float | None = None  # a rank with no GPU events
    launches: int | None = None
    graph_replay_share: float | None = None
    categories: list[CategoryRow] = []
    kernels: list[KernelRow] = []  # its top 10
    timeline: RankTimeline | None = None


class GlueRegionRow(msgspec.Struct, kw_only=True):
    """One glue region: the same run of glue kernels between heavy kernels, summed over the layers
    and steps it runs in (dsv4opt/analysis/glue.py); figures per step."""

    key: str  # part | where
    part: str
    where: str  # source sites, else operators, else kernel names, joined by " · "
    ops: str
    kernels: str
    instances_per_step: float
    launches_per_step: float
    gpu_us_per_step: float
    share: float  # of the profile's total_us
    median_kernel_us: float
    bytes_per_step: float | None = None  # None: the trace recorded no shapes
    fused_us_per_step: float
    saving_us_per_step: float
    launches_saved_per_step: float
    estimate: str  # what the fused estimate rests on: launch floor, bytes, hand-written kernel, one launch


class GlueRegions(msgspec.Struct, kw_only=True):
    """The glue regions of one trace (one rank) and how they were found and estimated."""

    regions: list[GlueRegionRow]  # the top ones by saving
    steps: int
    launch_floor_us: float
    floor_from: str
    copy_gbps: float | None = None
    bytes_known: bool
    keyed_by: str  # "source sites", "operators" or "kernel names"
    glue_launches_per_step: float
    glue_us_per_step: float
    glue_share: float
    step_us: float  # GPU time per step
    saving_us_per_step: float  # fusing every region, by the estimates
    in_heavy_calls: dict[str, float]  # launches_per_step, gpu_us_per_step of glue a heavy kernel's call makes
    rest: dict[str, float]  # regions beyond the kept ones: regions, launches_per_step, gpu_us_per_step, saving_us_per_step
    notes: list[str] = []
    rank: int | None = None

    @property
    def step_gain_bound(self) -> float:
        """What the step can gain at most when every region is fused: 1 / (1 - saving / step)."""
        return step_gain(self.saving_us_per_step, self.step_us)


def step_gain(saving_us: float, step_us: float) -> float:
    """Amdahl's bound on the step's speed-up when `saving_us` of `step_us` goes away."""
    return 1.0 / (1.0 - saving_us / step_us) if step_us > saving_us > 0 else 1.0


class _StepDeviceRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    rank: int | None = None  # with several trace files
    step: int  # index into steps.steps; 0 for the whole trace when it has no steps
    device: str


class DeviceBusyRow(_StepDeviceRow, kw_only=True, omit_defaults=True):
    """One device in one step: the union of its kernel intervals against their plain sum."""

    streams: int
    launches: int
    kernel_us: float  # plain sum of durations
    span_us: float  # first kernel start to last kernel end
    busy_us: float  # union of kernel intervals over all streams
    idle_us: float  # span_us - busy_us
    overlap_us: float  # time with at least two streams busy


class StreamBusyRow(_StepDeviceRow, kw_only=True, omit_defaults=True):
    stream: str
    launches: int
    kernel_us: float
    busy_us: float
    idle_us: float  # the device's span in that step minus this stream's busy time


class CategoryOverlapRow(_StepDeviceRow, kw_only=True, omit_defaults=True):
    category: str
    kernel_us: float
    busy_us: float  # union of this category's kernel intervals
    exposed_us: float  # of that, while no other category ran on the device
    overlapped_us: float  # busy_us - exposed_us

    def __post_init__(self) -> None:
        _check_category(self.category)


class Timeline(msgspec.Struct, kw_only=True):
    """Busy, idle and overlap time per step (analysis/timeline.py; docs/profile-schema.md), and of
    the whole trace: every GPU event, inside a step or not (as Holistic Trace Analysis' temporal
    breakdown counts them; empty in profiles written before it was kept)."""

    devices: list[DeviceBusyRow] = []
    whole: list[DeviceBusyRow] = []  # per device (and rank), step 0: the whole trace
    streams: list[StreamBusyRow] = []
    categories: list[CategoryOverlapRow] = []


class DevicePeak(msgspec.Struct, kw_only=True):
    """The datasheet figures efficiency fractions were taken against (analysis/devices.py)."""

    label: str
    hbm_gbps: float
    tflops: dict[str, float]  # dense rate per input kind: fp8, bf16, tf32, fp32
    source: str


class CaptureMatch(msgspec.Struct):
    replayed: int  # GPU events from graph replays
    matched: int  # of those, mapped to a launch of the capture trace


class Profile(msgspec.Struct, kw_only=True):
    """One analysed capture.

    time_basis is "gpu" when total_us is GPU kernel time, "cpu_self" when the trace had no GPU work
    and the ranking is over CPU operators by self time (labelled as such everywhere).
    """

    meta: dict[str, Any]
    time_basis: str = "gpu"
    total_us: float
    kernels: list[KernelRow]
    categories: list[CategoryRow]
    steps: dict[str, Any] | None = None
    throughput: dict[str, Any] | None = None
    parts: list[PartRow] | None = None
    ranks: list[RankRow] | None = None
    rank_balance: RankBalance | None = None
    has_stacks: bool | None = None
    capture_match: CaptureMatch | None = None
    glue: GlueRegions | None = None  # GPU profiles analysed since glue regions exist
    timeline: Timeline | None = None
    peak: DevicePeak | None = None
    note: str | None = None
    load_metrics: dict[str, Any] | None = None  # an SGLang capture's load generator figures
    run_dir: str | None = None  # an SGLang capture's trace folder
    unknown: dict[str, Any] = {}  # top-level keys this version does not know: kept, written back

    def __post_init__(self) -> None:
        if self.time_basis not in TIME_BASES:
            raise ValueError(f"time_basis: expected one of {', '.join(TIME_BASES)}, got {self.time_basis!r}")

    @property
    def time_label(self) -> str:
        """What total_us and every share measure, in words: "GPU time" or "CPU self time"."""
        return TIME_LABELS[self.time_basis]

    @property
    def step_count(self) -> int | None:
        """Profiled steps the kernel totals cover: the steps found in the trace, else the steps the
        capture says it profiled; None when neither says."""
        for source, key in ((self.steps or {}, "count"), (self.meta, "steps")):
            value = source.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
                return int(value)
        return None

    @property
    def top_kernel(self) -> KernelRow | None:
        return self.kernels[0] if self.kernels else None

    @property
    def top_category(self) -> CategoryRow | None:
        return max(self.categories, key=lambda c: c.total_us) if self.categories else None

    def category_share(self, name: str) -> float:
        return sum(c.share for c in self.categories if c.category == name)

    def category_total_us(self, name: str) -> float:
        return sum(c.total_us for c in self.categories if c.category == name)

    @property
    def glue_share(self) -> float:
        return sum(c.share for c in self.categories if c.category in GLUE)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "meta": self.meta,
            "time_basis": self.time_basis,
            "total_us": self.total_us,
            # the /1 name, still written so readers of /1 keep working (CPU self time for cpu_self)
            "gpu_time_us": self.total_us,
        }
        if self.time_basis == "cpu_self":
            out["cpu_self_us"] = self.total_us
        for name in _BODY_FIELDS:  # kernels and categories always, the rest when set
            value = getattr(self, name)
            if value is not None:
                out[name] = msgspec.to_builtins(value)
        out.update(self.unknown)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<profile>") -> "Profile":
        if not isinstance(data, dict):
            raise ProfileError(f"{source}: not a dsv4opt profile (expected a JSON object)")
        schema = data.get("schema")
        if schema != SCHEMA:
            if schema in OTHER_SCHEMAS:
                raise ProfileError(f"{source}: is {OTHER_SCHEMAS[schema]} (schema {schema!r}), not a profile "
                                   f"(schema {SCHEMA!r})")
            raise ProfileError(f"{source}: schema: expected {SCHEMA!r}, got {schema!r} "
                               "(a file from another version of dsv4opt, or not a profile)")
        fields = {k: v for k, v in data.items() if k in _FIELDS}
        if "total_us" not in fields and "gpu_time_us" in data:
            fields["total_us"] = data["gpu_time_us"]  # profiles written before total_us
        if fields.get("meta") is None:
            fields["meta"] = {}
        profile = convert(fields, cls, source, ProfileError)
        for name, schema_type in (("meta", _Meta), ("steps", _Steps), ("throughput", _Throughput)):
            value = getattr(profile, name)
            if value is not None:
                convert(value, schema_type, source, ProfileError, at=name)
        profile.unknown = {k: v for k, v in data.items() if k not in _KNOWN}
        return profile

    def save(self, path: str | Path, make_dirs: bool = True) -> Path:
        """make_dirs=False for a path the user named: a missing folder is refused, not created."""
        return write_json_atomic(path, finite(self.to_dict()), make_dirs)

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return cls.from_dict(read_json(path, ProfileError, "profile"), source=str(path))


_FIELDS = set(Profile.__struct_fields__) - {"unknown"}
_BODY_FIELDS = [f for f in Profile.__struct_fields__ if f not in ("meta", "time_basis", "total_us", "unknown")]
_KNOWN = _FIELDS | {"schema", "gpu_time_us", "cpu_self_us"}


# What dsv4opt reads back from a profile's free-form objects, checked on load; other keys pass
# through unchecked.
class _Meta(msgspec.Struct):
    target: str | None = None
    sources: list[str] | None = None
    device: str | None = None
    device_kind: str | None = None
    ranks: int | None = None
    config: str | None = None
    model: str | None = None
    model_path: str | None = None
    concurrency: int | None = None
    context: int | None = None
    layers: int | None = None
    experts_resident: int | None = None
    expert_parallel: int | None = None
    layout: str | None = None
    graph_context: int | None = None
    kv: str | None = None
    steps: int | None = None
    optimizations: list[str] | None = None
    settings: dict[str, Any] | None = None
    warnings: list[str] | None = None


class _Step(msgspec.Struct):
    name: str | None = None
    gpu_us: float | None = None
    launches: int | None = None
    median_kernel_us: float | None = None
    span_us: float | None = None
    busy_us: float | None = None
    idle_us: float | None = None
    overlap_us: float | None = None


class _Steps(msgspec.Struct):
    source: str | None = None
    count: int | None = None
    gpu_us_per_step: float | None = None
    launches_per_step: float | None = None
    median_kernel_us: float | None = None
    busy_us_per_step: float | None = None
    idle_us_per_step: float | None = None
    overlap_us_per_step: float | None = None
    steps: list[_Step] | None = None


class _Throughput(msgspec.Struct):
    tokens_per_s: float | None = None
    ms_per_step: float | None = None
    ms_per_step_windows: list[float] | None = None
    tokens_per_s_per_rank: float | None = None  # profile --ranks N: tokens_per_s is all ranks' tokens
    ms_per_step_by_rank: list[float] | None = None


def is_profile_file(path: str | Path) -> bool:
    """True when `path` is a JSON file that names a dsv4opt schema (cheap sniff): it is loaded as a
    profile, so another version's profile or another dsv4opt file is reported as such."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(4096)
    return b'"schema"' in head and b'"dsv4opt.' in head
