"""What a capture is asked to do; filled by cli.py, read by the capture modules."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4opt.errors import unknown_name

# Settings a profile does not carry back: where files went, and what was switched on (kept apart).
_NOT_RECORDED = ("out", "force", "trace_dir", "optimizations", "rendezvous_timeout_s")
# Older profiles' top-level meta keys -> field names, where they differ.
_META_ALIASES = {"device_kind": "device"}
# What profiles from before a setting existed ran with: one dp-ep rank, index rows sized to the contexts,
# our stand-ins in SGLang 0.5.23's kernels' places.
_LEGACY = {"layout": "dp-ep", "graph_context": 0, "sglang_kernels": "stand-in"}


def check_device(name: str | None) -> None:
    """Refuse a device the embedded workload cannot be asked for: cuda, cpu or cuda:N (None: the default)."""
    if name is None or name in ("cuda", "cpu") or re.fullmatch(r"cuda:\d+", name):
        return
    raise unknown_name("device", name, ("cuda", "cpu", "cuda:N"), lead="use",
                       aliases={"gpu": "cuda", "cuda0": "cuda:0", "cuda1": "cuda:1"})


@dataclass
class EmbeddedSettings:
    concurrency: int = 32
    context: int = 8192
    steps: int = 10
    warmup: int = 5
    repeat: int = 3  # timed windows of `steps` steps: median and spread of ms/step
    config: str | None = None  # None: dsv4-flash on a GPU, dsv4-tiny on a CPU
    layers: int | None = None  # None: all layers of the config
    experts_resident: int | None = None  # None: the config's per-rank default
    device: str | None = None  # None: cuda when available, else cpu
    cuda_graph: bool = True
    kv: str = "fp8"  # KV cache layout: fp8 (SGLang's) or bf16
    optimizations: list[str] = field(default_factory=list)
    out: Path | None = None  # None: a new file under profiles/
    force: bool = False  # replace an existing `out`
    trace_dir: Path | None = None  # keep the raw trace here when given
    seed: int = 0
    layout: str = "tp4"  # how the deployment is split (dsv4opt/workload/layout.py): tp4, tp8 or dp-ep
    sglang: str = "0.5.14"  # the SGLang decode path reproduced (dsv4opt/workload/paths.py)
    # SGLang's own kernels on the 0.5.23 path: auto, sglang or stand-in (dsv4opt/workload/production/choice.py;
    # the profile's meta["kernels"] records what each part then ran)
    sglang_kernels: str = "auto"
    # tokens SGLang's decode metadata is sized to: None = the model's context length (SGLang's
    # default), 0 = as wide as the drawn contexts need (the project's profiles before this setting)
    graph_context: int | None = None
    ranks: int = 1  # processes of the deployment on this host (1: one rank alone, no communication)
    rendezvous_timeout_s: float = 120.0  # how long ranks may take to meet before the run is given up

    def check_names(self) -> None:
        """Refuse a mistyped SGLang path, layout, config, device or optimisation now, in a light import,
        before a command loads torch (2-3 s) to run anything."""
        from dsv4opt.optimizations.registry import get
        from dsv4opt.workload.config import ModelConfig
        from dsv4opt.workload.layout import Layout
        from dsv4opt.workload.paths import SGLangPath
        from dsv4opt.workload.production.choice import check_mode

        SGLangPath.from_name(self.sglang)
        check_mode(self.sglang_kernels)
        Layout.from_name(self.layout)
        if self.config is not None:
            ModelConfig.from_name(self.config)
        check_device(self.device)
        for name in self.optimizations:
            get(name)

    def to_meta(self, device: str, config: str) -> dict[str, Any]:
        """What was asked, with device and config as resolved, for a profile's meta["settings"]."""
        asked = {k: v for k, v in dataclasses.asdict(self).items() if k not in _NOT_RECORDED}
        return {**asked, "device": device, "config": config}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "EmbeddedSettings":
        """The settings a profile was captured with (meta["settings"]; older profiles' top-level keys)."""
        recorded = dict(meta.get("settings") or {})
        names = {f.name for f in dataclasses.fields(cls)} - set(_NOT_RECORDED)
        for key, name in _META_ALIASES.items():
            if key in meta and name not in recorded:
                recorded[name] = meta[key]
        for name in names - {"device"}:
            if name not in recorded and name in meta:
                recorded[name] = meta[name]
        for name, value in _LEGACY.items():
            recorded.setdefault(name, value)
        return cls(**{k: v for k, v in recorded.items() if k in names})


@dataclass
class SGLangSettings:
    url: str = "http://127.0.0.1:30000"
    concurrency: int = 32
    prompt_len: int = 256
    max_new_tokens: int = 4096
    profile_steps: int = 10
    trace_dir: Path | None = None  # where the server writes traces (must be readable here)
    connect_timeout_s: float = 10.0
    ready_timeout_s: float = 300.0  # until all C requests are decoding
    trace_timeout_s: float = 120.0  # until the trace files are complete
    stall_timeout_s: float = 60.0  # no token from any request for this long = stalled
    out: Path | None = None
    force: bool = False  # replace an existing `out`
    window_s: float = 10.0  # steady-state seconds measured (before profiling, so the profiler costs nothing)
    request_timeout_s: float = 30.0  # control calls: server info, start/stop profile
    settle_s: float = 3.0  # no new rank trace for this long = all ranks are in
    profile_by_stage: bool = False  # True: SGLang splits traces into -EXTEND/-DECODE files
    with_stack: bool = False  # Python stacks make traces many times larger
    record_shapes: bool = False
    optimizations: list[str] = field(default_factory=list)  # declared by the user: what the server runs
    seed: int = 0
