"""One rank's embedded capture: plan the run once (device, config, layout, graph width), build the
workload, warm up, profile, time.

Warm-up steps run outside the profiler; on a GPU the step (sampling included) is captured as one
CUDA graph and replayed, as SGLang does. One eager step is profiled first so the analysis can map
the graph's kernels (which carry only the graph launch's correlation) back to model parts. The
S profiled steps and the S timed steps are separate runs, so profiler overhead never enters ms/step.
Used by capture/embedded.py for one process and by capture/ranks.py in each rank's process.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from dsv4opt.capture.kineto_markers import quiet_profiler
from dsv4opt.capture.naming import profile_path
from dsv4opt.capture.result import Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings, check_device
from dsv4opt.compilestats import CompileCounters
from dsv4opt.errors import CaptureError
from dsv4opt.fileio import check_new_file
from dsv4opt.optimizations.registry import implementations
from dsv4opt.workload.attention.flashmla import hopper, missing_on
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.layout import Deployment, Layout
from dsv4opt.workload.memory import HOST_WORKSPACE, WORKSPACE, estimate_memory
from dsv4opt.workload.paths import DEFAULT_PATH, HOPPER_0523, SGLangPath
from dsv4opt.tritonlib import sm_count
from dsv4opt.workload.production.choice import AUTO, KernelChoice, choose, first_calls, fits_the_build, verified

GPU_CONFIG, CPU_CONFIG = "dsv4-flash", "dsv4-tiny"
MEMORY_HEADROOM = 0.95  # of the free device memory a run may plan to use


def default_config(device: str | None) -> str:
    """The config a run on `device` (None: the one picked automatically) uses when none is named."""
    return GPU_CONFIG if _pick_device(device).type == "cuda" else CPU_CONFIG


@dataclass(frozen=True)
class RunPlan:
    """What a run resolves from its settings before building anything."""

    device: torch.device
    config_name: str
    cfg: ModelConfig
    dtype: torch.dtype
    max_new: int
    use_graph: bool
    deploy: Deployment  # what one rank of the layout holds
    graph_context: int  # tokens the index rows are sized to (0: as the drawn contexts need)
    notes: list[str] = field(default_factory=list)
    kernels: KernelChoice = field(default_factory=KernelChoice)  # SGLang's own kernels that run (Hopper path)


def plan_run(settings: EmbeddedSettings, device: torch.device | None = None) -> RunPlan:
    """Device (picked when None), config, dtype, graph use, layout and graph width of a run."""
    device = device or _pick_device(settings.device)
    config_name = settings.config or default_config(settings.device)
    cfg = ModelConfig.from_name(config_name).with_layers(settings.layers)
    ranks = getattr(settings, "ranks", 1)
    deploy = Layout.from_name(settings.layout).deploy(cfg, ranks if ranks > 1 else None)
    max_new = tokens_decoded(settings)
    graph_context = cfg.max_context if settings.graph_context is None else settings.graph_context
    longest = max(1, round(1.25 * settings.context)) + max_new
    if graph_context and graph_context < longest:
        raise CaptureError(f"--graph-context {graph_context} is shorter than the longest request can grow ({longest} "
                           f"tokens at --context {settings.context}); raise it, or pass 0 to size it to the contexts")
    path = SGLangPath.from_name(getattr(settings, "sglang", DEFAULT_PATH))
    if path.name == HOPPER_0523 and (missing := missing_on(device)):
        raise CaptureError(missing)  # before minutes of building: the path runs FlashMLA itself on Hopper
    notes = []
    if device.type == "cpu":
        notes.append(f"no GPU in use: running {config_name} on the CPU; the ranking is over CPU operators by "
                     "self time, not GPU kernels")
    if path.name == HOPPER_0523 and not hopper(device):
        notes.append(f"SGLang {path.name}'s Hopper path off Hopper: the sm_120 kernel stands in for FlashMLA")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = None
    if path.name == HOPPER_0523 and device.type == "cuda":
        shapes = fits_the_build(cfg, settings.concurrency, sm_count(device))
    kernels = choose(path.name, device.type, dtype == torch.bfloat16, deploy.tensor_parallel,
                     getattr(settings, "sglang_kernels", AUTO), flashmla=path.name == HOPPER_0523 and hopper(device),
                     shapes=shapes)
    if kernels.any_real:  # each family's first call, outside any capture: a failure keeps its stand-in
        kernels = verified(kernels, first_calls(device), getattr(settings, "sglang_kernels", AUTO))
    if kernels.any_real and "torch-compile" in settings.optimizations:
        raise CaptureError("torch-compile cannot compile through SGLang's own kernels yet (they are not torch ops); "
                           "add --kernels stand-in to compile the stand-in path")
    notes += list(kernels.notes)
    return RunPlan(device=device, config_name=config_name, cfg=cfg, dtype=dtype,
                   max_new=max_new, use_graph=settings.cuda_graph and device.type == "cuda",
                   deploy=deploy, graph_context=graph_context, notes=notes, kernels=kernels)


def tokens_decoded(settings: EmbeddedSettings) -> int:
    """Tokens each request decodes in one run, with room to spare: the warm-up, the eager reference
    step, the profiler's own warm-up step and the profiled steps, then `repeat` timed windows (and
    a few for graph-capture warm-ups). The caches and RoPE tables are sized for this many."""
    return settings.warmup + 2 + settings.steps + max(1, settings.repeat) * settings.steps + 8


@dataclass
class RankRun:
    """What one rank's run leaves: its traces, its timed windows (ms/step) and its meta."""

    trace: Path
    capture_trace: Path | None
    windows: list[float]
    meta: dict


def run_rank(settings: EmbeddedSettings, plan: RunPlan, trace_path: Path, eager_path: Path,
             progress: Progress = no_progress, comm=None) -> RankRun:
    """Build this rank's workload, warm up, profile, time. `comm`: the ranks of a process group (None:
    one process alone); every rank runs the same steps, so their collectives meet."""
    from dsv4opt.workload.model import DecodeWorkload

    device, cfg, C = plan.device, plan.cfg, settings.concurrency
    stamp = dt.datetime.now()
    compiled_before = CompileCounters.now()
    with _cpu_threads(device):
        progress.stage(f"building {plan.config_name} ({cfg.layers} layers)", cfg.layers)
        wl = DecodeWorkload(
            cfg, concurrency=C, context=settings.context, device=device,
            experts_resident=settings.experts_resident, impls=implementations(settings.optimizations),
            seed=settings.seed, dtype=plan.dtype, kv=_kv(settings), max_new_tokens=plan.max_new,
            on_layer=lambda i: progress.advance(), comm=comm, layout=settings.layout,
            graph_context=plan.graph_context or None, sglang=getattr(settings, "sglang", DEFAULT_PATH),
            kernels=plan.kernels,
        )
        # Under DP attention every rank draws the tokens of all ranks and keeps its own, as it does
        # its requests; tensor-parallel ranks all decode the same requests.
        first = C * wl.comm.rank if wl.comm.real and not wl.tensor_parallel else 0
        tokens = torch.randint(cfg.vocab, (first + C,), generator=torch.Generator().manual_seed(settings.seed))
        tokens = tokens[first:].to(device)
        eager = _eager_step(wl, tokens)

        progress.stage("warming up", max(settings.warmup, 1))
        first_step_s = None  # the first step compiles whatever is compiled (torch-compile's blocks)
        for _ in range(settings.warmup):
            t0 = time.perf_counter()
            eager()
            _sync(device)
            first_step_s = first_step_s if first_step_s is not None else time.perf_counter() - t0
            progress.advance()

        capture_trace = None
        step = eager
        if plan.use_graph:
            progress.stage("profiling one eager step (kernel -> model part map)", None)
            # Python stacks cost little for one step and let kernels be traced to model source lines.
            capture_trace = _profile_steps(eager, 1, device, eager_path, with_stack=True)
            progress.stage("capturing the step as a CUDA graph", None)
            step = _graph_step(wl, tokens)
        progress.stage("profiling", settings.steps)
        trace = _profile_steps(step, settings.steps, device, trace_path, on_step=progress.advance)
        progress.stage("timing", None)
        windows = []
        for _ in range(max(1, getattr(settings, "repeat", 1))):
            _sync(device)
            wl.comm.barrier()  # the ranks start each window together
            windows.append(_time_steps(step, settings.steps, device))
    meta = _meta(settings, wl, plan, device, stamp)
    compiled = CompileCounters.now().since(compiled_before)
    if compiled.graphs or compiled.graph_breaks:
        meta["compile"] = {**compiled.as_meta(), "first_step_s": first_step_s}
        progress.note(f"torch.compile: {compiled.graphs} graphs, {compiled.graph_breaks} graph breaks, "
                      f"{compiled.compile_s:.1f} s compiling (first step {first_step_s or 0:.1f} s)")
    return RankRun(trace=trace, capture_trace=capture_trace, windows=windows, meta=meta)


def _kv(settings: EmbeddedSettings) -> str:
    """The KV layout asked for; settings without the field (older profiles) mean fp8."""
    return getattr(settings, "kv", None) or "fp8"


def _pick_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CaptureError("--device cuda asked for, but this torch sees no CUDA GPU; use --device cpu")
    return torch.device(name)


def output_path(settings: EmbeddedSettings, config_name: str) -> Path:
    if settings.out is not None:
        out = Path(settings.out)
        check_new_file(out, settings.force, "--out")
        if out.suffix != ".json":
            raise CaptureError(f"{out}: a profile is a .json file; give --out a name ending in .json")
        return out
    return profile_path("embedded", config_name, settings.concurrency, list(settings.optimizations),
                        ranks=getattr(settings, "ranks", 1))


def refuse_if_too_big(plan: RunPlan, settings: EmbeddedSettings, ranks: int = 1, sharing: int = 1) -> None:
    """Estimate weights + KV + activations of one of `ranks` ranks and refuse before allocating anything
    that will not fit; `sharing` ranks share the device's memory (a CPU's RAM)."""
    cfg, device = plan.cfg, plan.device
    est = estimate_memory(
        cfg, settings.concurrency, settings.context, settings.experts_resident,
        elem_bytes=plan.dtype.itemsize, kv_fp8=_kv(settings) == "fp8", max_new_tokens=plan.max_new, ranks=ranks,
        layout=settings.layout, graph_context=plan.graph_context or None,
        workspace=WORKSPACE if device.type == "cuda" else HOST_WORKSPACE, marlin_copies=plan.kernels.marlin,
    )
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _free_host_memory()
    if free is not None and sharing * est.total > MEMORY_HEADROOM * free:
        gib = 1 << 30
        each = f" for each of {sharing} ranks" if sharing > 1 else ""
        raise CaptureError(
            f"{cfg.name} at C={settings.concurrency}, context {settings.context}, {cfg.layers} layers needs about "
            f"{est.total / gib:.1f} GiB{each} (weights {est.weights / gib:.1f}, KV {est.caches / gib:.1f}, "
            f"activations {est.activations / gib:.1f}) but {free / gib:.1f} GiB is free on the {device.type}; lower --layers, "
            "--experts-resident, --concurrency or --context"
        )


def _free_host_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of RAM a new allocation can have now: Linux's MemAvailable, which counts the page cache it
    would drop (free pages alone can be a few GiB on a host with 20 GiB to give); None where unknown."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _eager_step(wl, tokens: torch.Tensor) -> Callable[[], None]:
    """One decode step that feeds its greedy next tokens back into `tokens` (static buffer)."""

    def run() -> None:
        tokens.copy_(wl.step(tokens).argmax(-1))

    return run


def _graph_step(wl, tokens: torch.Tensor) -> Callable[[], None]:
    """The same step captured once as a CUDA graph; each call replays it (no host work per kernel)."""
    graph = torch.cuda.CUDAGraph()
    # Capture on a side stream after one eager run there, as torch's CUDA-graph notes advise.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tokens.copy_(wl.step(tokens).argmax(-1))
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph):
            tokens.copy_(wl.step(tokens).argmax(-1))
    except RuntimeError as exc:
        raise CaptureError(
            f"the decode step could not be captured as a CUDA graph ({str(exc).splitlines()[0]}); "
            "rerun with --no-cuda-graph"
        ) from None
    return graph.replay


def _profile_steps(step: Callable[[], None], n: int, device: torch.device, path: Path,
                   on_step: Callable[[], None] | None = None, with_stack: bool = False) -> Path:
    """Profile n steps, each inside a ProfilerStep#N range, after one profiler warm-up step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    # A schedule is what makes prof.step() emit ProfilerStep#N ranges; its warm-up step keeps the
    # profiler's start-up cost out of the recorded steps.
    plan = schedule(wait=0, warmup=1, active=n, repeat=1)
    # Shapes let analysis rate each kernel's operator call against the device's peak
    # (analysis/efficiency.py); they cost CPU time in the profiled steps only, not GPU time.
    with quiet_profiler(), profile(activities=activities, schedule=plan, with_stack=with_stack, record_shapes=True,
                                   on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for i in range(n + 1):
            step()
            _sync(device)
            prof.step()
            if on_step and i:
                on_step()
    return path


def _time_steps(step: Callable[[], None], n: int, device: torch.device) -> float:
    """Milliseconds per step over n steps, no profiler attached."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(n):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) * 1000.0 / n


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _meta(settings, wl, plan: RunPlan, device, stamp) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "target": "embedded",
        # what was asked, so `apply` can re-profile exactly like this run
        "settings": {**settings.to_meta(device.type, plan.config_name), "graph_context": plan.graph_context},
        "concurrency": settings.concurrency,
        "context": settings.context,
        "contexts": [int(c) for c in wl.contexts],
        "config": plan.config_name,
        "layers": wl.cfg.layers,
        "experts_resident": wl.experts_resident,
        "layout": wl.deploy.layout,
        "sglang": wl.path.name,  # the SGLang decode path reproduced (dsv4opt/workload/paths.py)
        "sglang_family": wl.path.family,
        # the baseline's kernel in each part, SGLang's own or a stand-in ({}: the sm_120 path, all ours);
        # the optimisations below replace some of them
        "kernels": plan.kernels.parts() if wl.path.name == HOPPER_0523 else {},
        "fp8_wo_a": wl.path.fp8_wo_a,
        # what one rank holds and runs: heads (and padded heads), groups, experts and their width
        "deployment": dataclasses.asdict(wl.deploy),
        "graph_context": plan.graph_context,  # 0: index rows as wide as the drawn contexts need
        "expert_parallel": None if wl.tensor_parallel else wl.deploy.ranks,  # the DP + EP ranks the MoE gathers from
        # the contract's `device` is the GPU's name ("cpu" without one); device_kind re-creates the run
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "device_kind": device.type,
        "cpu": platform.processor() or platform.machine(),
        "dtype": str(wl.dtype).removeprefix("torch."),
        "weights": f"fp8 block-{wl.cfg.fp8_block}, MXFP4 experts",
        "kv": wl.kv_layout,
        "cuda_graph": plan.use_graph,
        "optimizations": list(settings.optimizations),
        "steps": settings.steps,
        "warmup": settings.warmup,
        "seed": settings.seed,
        "torch": torch.__version__,
        "triton": triton_version,
        "date": stamp.isoformat(timespec="seconds"),
        "commit": _git_commit(),
    }


def _git_commit() -> str | None:
    """The commit of the dsv4opt checkout, '+dirty' when it has uncommitted changes; None outside git.

    DSV4OPT_COMMIT names it where the tree was copied without its .git (e.g. onto a lent GPU machine).
    """
    if os.environ.get("DSV4OPT_COMMIT"):
        return os.environ["DSV4OPT_COMMIT"]
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


@contextmanager
def _cpu_threads(device: torch.device):
    """On a CPU the tiny config's operators are microseconds long: one intra-op thread avoids
    hand-off costs that would otherwise dominate (and vary with the machine's load)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
