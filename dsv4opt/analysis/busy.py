"""Per-step means of a profile's timeline (busy, idle, overlap, exposure), for reading and
comparing: plain Python over the typed rows, so compare and the renderers need no pandas."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.analysis.profile import Timeline


@dataclass(frozen=True)
class BusyMeans:
    """Means per step of one device, stream or category row group of a timeline."""

    label: str  # "device 0", "stream 7", a category name
    kernel_us: float
    busy_us: float
    idle_us: float | None = None
    span_us: float | None = None
    overlap_us: float | None = None  # devices: at least two streams busy
    exposed_us: float | None = None  # categories: busy while no other category ran
    overlapped_us: float | None = None


@dataclass(frozen=True)
class TimelineSummary:
    steps: int  # windows averaged over (rank x step)
    devices: list[BusyMeans]
    streams: list[BusyMeans]  # only when some device has more than one stream
    categories: list[BusyMeans]  # by busy time, descending

    def device_total(self, field: str) -> float:
        """A per-step figure summed over the devices (one per rank's trace)."""
        return sum(getattr(d, field) or 0.0 for d in self.devices)


def timeline_summary(tl: Timeline | None) -> TimelineSummary | None:
    """Per-step means of a profile's timeline, for reading and comparing: a device's and a stream's
    over its rank's steps, a category's over every rank's steps."""
    if tl is None or not tl.devices:
        return None
    windows = {(d.rank, d.step) for d in tl.devices}
    per_rank = {r: sum(1 for w in windows if w[0] == r) for r, _ in windows}

    def prefix(rank_id) -> str:
        return "" if rank_id is None else f"rank {rank_id} "

    def means(rows, key, label, fields, count) -> list[BusyMeans]:
        groups: dict = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        return [BusyMeans(label=label(k), **{f: sum(getattr(r, f) for r in g) / count(k) for f in fields})
                for k, g in groups.items()]

    devices = means(tl.devices, lambda r: (r.rank, r.device), lambda k: f"{prefix(k[0])}device {k[1]}",
                    ("kernel_us", "busy_us", "idle_us", "span_us", "overlap_us"), lambda k: per_rank[k[0]])
    streams = means(tl.streams, lambda r: (r.rank, r.device, r.stream), lambda k: f"{prefix(k[0])}stream {k[2]}",
                    ("kernel_us", "busy_us", "idle_us"), lambda k: per_rank[k[0]])
    cats = means(tl.categories, lambda r: r.category, lambda k: k, ("kernel_us", "busy_us", "exposed_us", "overlapped_us"),
                 lambda k: len(windows))
    return TimelineSummary(len(windows), devices, streams if len(streams) > len(devices) else [],
                           sorted(cats, key=lambda c: -c.busy_us))


@dataclass(frozen=True)
class WholeTrace:
    """The whole trace's busy, idle and overlap time (every GPU event, inside a step or not), summed
    over its devices, and how much of that busy time the profiled steps hold."""

    span_us: float
    busy_us: float
    idle_us: float
    overlap_us: float
    steps: int  # windows of the per-step rows (rank x step)
    in_steps_busy_us: float  # the per-step busy time summed over every step, not averaged


def whole_trace(tl: Timeline | None) -> WholeTrace | None:
    """None for a profile written before the whole trace was kept."""
    if tl is None or not tl.whole:
        return None
    total = {f: sum(getattr(d, f) for d in tl.whole) for f in ("span_us", "busy_us", "idle_us", "overlap_us")}
    return WholeTrace(**total, steps=len({(d.rank, d.step) for d in tl.devices}),
                      in_steps_busy_us=sum(d.busy_us for d in tl.devices))
