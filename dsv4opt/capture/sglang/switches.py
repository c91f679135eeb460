"""dsv4opt's optimisations mapped onto SGLang's own switches for DeepSeek-V4, as data.

SGLang does not contain dsv4opt's kernels. What it has are switches that choose between its own
implementations of the same slots; each mapping below picks the SGLang choice that applies the same
fix (tensor cores instead of a CUDA-core/float32 fallback). Everything here was read from SGLang's
source (see SOURCES); none of it has been run against a live server, and each switch says how far it
was confirmed. The switches only matter on sm_120 (RTX PRO 6000 / RTX 50xx): on Hopper and B200,
SGLang already uses FlashMLA and DeepGEMM for these slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4opt.errors import DsvOptError
from dsv4opt.fileio import check_new_file, make_output_folder, write_text_atomic
from dsv4opt.optimizations.mma_attn.sglang_contract import SGLANG_VERSION, WRITTEN_FOR
from dsv4opt.optimizations.registry import get as get_optimization


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    commit: str | None  # None: read through code search, which did not name the commit
    what: str


@dataclass(frozen=True)
class EnvSwitch:
    name: str
    value: str
    sglang_default: str  # the default in the source read
    selects: str  # what the value makes SGLang run
    confirmed: str  # how far this was confirmed (read in source; never run live)
    caveat: str = ""


@dataclass(frozen=True)
class SGLangMapping:
    optimization: str
    summary: str
    env: tuple[EnvSwitch, ...]
    launch_flags: tuple[str, ...]  # extra `python -m sglang.launch_server` flags (none needed so far)
    restart: str
    older_versions: str
    dropin: bool = False  # dsv4opt's own kernel can replace SGLang's (python -m dsv4opt.sglang.launch)


SOURCES: tuple[Source, ...] = (
    Source(
        "sgl-project/sglang",
        "python/sglang/srt/environ.py",
        "0003215cf1464f44b389cd0b18d0b4c56f2a3da6",
        "names and defaults: SGLANG_SM120_FLASHMLA_BACKEND (flashinfer|triton|torch, default flashinfer), "
        "SGLANG_OPT_DEEPGEMM_HC_PRENORM (True), SGLANG_OPT_USE_TILELANG_MHC_PRE (True), "
        "SGLANG_OPT_USE_TILELANG_INDEXER (False), SGLANG_FP8_PAGED_MQA_LOGITS_TORCH (False)",
    ),
    Source(
        "sgl-project/sglang",
        "python/sglang/srt/layers/attention/flash_mla_sm120.py",
        None,
        "older versions: SGLANG_SM120_TRITON_FLASHMLA=1 (default) Triton kernel, =0 pure-torch fallback",
    ),
    Source(
        "sgl-project/sglang",
        "python/sglang/srt/server_args.py",
        None,
        "older versions: on sm_120, DeepseekV4ForCausalLM sets SGLANG_OPT_USE_TILELANG_MHC_PRE and "
        "SGLANG_OPT_DEEPGEMM_HC_PRENORM to False and SGLANG_FP8_PAGED_MQA_LOGITS_TORCH to True "
        "unconditionally, so environment values for them are overwritten",
    ),
    Source(
        "sgl-project/sglang",
        "python/sglang/srt/arg_groups/overrides.py",
        None,
        "newer versions: the same sm_120 overrides apply only when the variable is not set "
        "(envs.X.is_set()), so the environment wins; the indexer defaults to the TileLang kernel "
        "and 'a DeepGEMM build with SM120 attention support can opt into fp8_paged_mqa_logits'",
    ),
)

READ_FROM = "sgl-project/sglang main as of mid-2026 (environ.py at commit 0003215c); release number not pinned"

_NOT_LIVE = "name, values and default read in SGLang's source; not run against a live server"

MAPPINGS: dict[str, SGLangMapping] = {
    m.optimization: m
    for m in (
        SGLangMapping(
            optimization="mma-attn",
            summary=(
                "sparse-MLA decode attention on tensor cores: select FlashInfer's SM120 sparse-MLA "
                "kernel instead of SGLang's CUDA-core Triton kernel or its pure-torch path"
            ),
            env=(
                EnvSwitch(
                    name="SGLANG_SM120_FLASHMLA_BACKEND",
                    value="flashinfer",
                    sglang_default="flashinfer",
                    selects="FlashInfer's CUTLASS sparse-MLA decode for sm_120 (tensor cores)",
                    confirmed=_NOT_LIVE,
                    caveat=(
                        "already the default where this variable exists: check that nothing in your "
                        "launch script sets it to triton or torch. Needs a FlashInfer that ships the "
                        "sm_120 sparse-MLA kernel; SGLang imports it without a fallback, so an older "
                        "FlashInfer fails at start-up rather than silently"
                    ),
                ),
            ),
            launch_flags=(),
            restart="restart the SGLang server (the backend is read when it starts)",
            older_versions=(
                "versions before SGLANG_SM120_FLASHMLA_BACKEND offer only SGLANG_SM120_TRITON_FLASHMLA "
                "(1 = Triton CUDA-core kernel, 0 = torch): neither uses tensor cores; on SGLang "
                f"{SGLANG_VERSION} start the server with sglang-mma-attn-launch.sh instead, which puts "
                "dsv4opt's kernel in place of the Triton one"
            ),
            dropin=True,
        ),
        SGLangMapping(
            optimization="bf16-gemm",
            summary=(
                "take the indexer score and the hyper-connection pre-mix off the float32 CUDA-core "
                "fallbacks and onto SGLang's TileLang/DeepGEMM kernels"
            ),
            env=(
                EnvSwitch(
                    name="SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
                    value="0",
                    sglang_default="False (forced True on sm_120 unless set)",
                    selects="the indexer's DeepGEMM/TileLang kernel instead of the float32 torch.bmm path",
                    confirmed=_NOT_LIVE,
                    caveat=(
                        "with 0 and SGLANG_OPT_USE_TILELANG_INDEXER=1 the TileLang indexer runs; "
                        "without TileLang it needs a DeepGEMM build with sm_120 attention support"
                    ),
                ),
                EnvSwitch(
                    name="SGLANG_OPT_USE_TILELANG_INDEXER",
                    value="1",
                    sglang_default="False (set True on sm_120 unless set)",
                    selects="TileLang fp8 paged MQA-logits kernel for the lightning indexer",
                    confirmed=_NOT_LIVE,
                ),
                EnvSwitch(
                    name="SGLANG_OPT_USE_TILELANG_MHC_PRE",
                    value="1",
                    sglang_default="True (forced False on sm_120 unless set)",
                    selects="TileLang kernel for the hyper-connection pre-mix instead of float32 F.linear",
                    confirmed=_NOT_LIVE,
                    caveat=(
                        "UNCONFIRMED on sm_120: SGLang's own comment says the standalone TileLang "
                        "mhc_pre split-K kernel is unsupported there; if start-up or the first decode "
                        "fails, set it back to 0 and keep the indexer switches"
                    ),
                ),
                EnvSwitch(
                    name="SGLANG_OPT_DEEPGEMM_HC_PRENORM",
                    value="1",
                    sglang_default="True (forced False on sm_120 unless set)",
                    selects="DeepGEMM GEMM for the hyper-connection pre-norm linear",
                    confirmed=_NOT_LIVE,
                    caveat="UNCONFIRMED on sm_120: DeepGEMM targets sm_90/sm_100",
                ),
            ),
            launch_flags=(),
            restart="restart the SGLang server (these variables are read at start-up)",
            older_versions=(
                "in versions whose server_args.py forces these on sm_120 unconditionally, the "
                "environment is overwritten and nothing changes: upgrade SGLang or patch that block"
            ),
        ),
    )
}


def mapping_for(name: str) -> SGLangMapping:
    opt = get_optimization(name)  # unknown names get the registry's message
    try:
        return MAPPINGS[opt.name]
    except KeyError:
        raise DsvOptError(
            f"{opt.name} has no SGLang mapping yet; mapped: {', '.join(MAPPINGS)}"
        ) from None


def describe(name: str) -> str:
    """What the user must do after writing the files, in a few lines (`apply --target sglang` prints it)."""
    m = mapping_for(name)
    sets = ", ".join(f"{s.name}={s.value}" for s in m.env)
    unconfirmed = [s.name for s in m.env if s.caveat.startswith("UNCONFIRMED")]
    doubts = f"\nUnconfirmed on sm_120: {', '.join(unconfirmed)} (see the notes in the env file)." if unconfirmed else ""
    dropin = (
        f"\nOr, on {WRITTEN_FOR}: start the server with {launcher_name(m)} ARGS (dsv4opt's kernel in place "
        "of SGLang's; not yet run on a live server)."
        if m.dropin else ""
    )
    return (
        f"{m.optimization} on SGLang: {m.summary}.\n"
        f"Sets {sets}; {m.restart}.\n"
        f"Mapping read from {READ_FROM}; not verified on a live server.{doubts}{dropin}"
    )


sglang_summary = describe


def render_env_file(m: SGLangMapping) -> str:
    """KEY=value lines with # comments: works with `set -a; . FILE`, docker --env-file and systemd."""
    lines = [
        f"# dsv4opt {m.optimization} -> SGLang switches (DeepSeek-V4)",
        f"# {m.summary}",
        f"# Then: {m.restart}.",
        f"# Read from {READ_FROM}; not verified on a live server.",
        f"# Older SGLang: {m.older_versions}.",
    ]
    for s in m.env:
        lines += ["", f"# {s.selects}. SGLang default: {s.sglang_default}. {s.confirmed}."]
        if s.caveat:
            lines.append(f"# Note: {s.caveat}.")
        lines.append(f"{s.name}={s.value}")
    return "\n".join(lines) + "\n"


def render_flags_file(m: SGLangMapping) -> str:
    """One launch flag per line after the comments, for `$(grep -v '^#' FILE)`."""
    lines = [
        f"# dsv4opt {m.optimization}: extra flags for `python -m sglang.launch_server`",
        f"# Then: {m.restart}.",
    ]
    if not m.launch_flags:
        lines.append(f"# {m.optimization} needs no launch-flag change: keep your flags, load the env file.")
    lines += list(m.launch_flags)
    return "\n".join(lines) + "\n"


def launcher_name(m: SGLangMapping) -> str:
    return f"sglang-{m.optimization}-launch.sh"


def render_launcher_script(m: SGLangMapping) -> str:
    """A shell script that starts SGLang's own server with dsv4opt's drop-in (dsv4opt/sglang/launch.py)."""
    return "\n".join([
        "#!/bin/sh",
        f"# dsv4opt {m.optimization}: SGLang's own server, with dsv4opt's kernel in place of SGLang's.",
        f"# Written for {WRITTEN_FOR}; the launcher checks the installed SGLang and refuses another.",
        f"# Usage: ./{launcher_name(m)} <python -m sglang.launch_server arguments>",
        "# PYTHON: the interpreter of the environment that has SGLang and dsv4opt (default: python).",
        f'exec "${{PYTHON:-python}}" -m dsv4opt.sglang.launch --with {m.optimization} -- "$@"',
    ]) + "\n"


def apply_to_sglang(name: str, out_dir: Path, force: bool = False) -> list[Path]:
    """Write `sglang-NAME.env`, `sglang-NAME.flags` and, where dsv4opt has a drop-in,
    `sglang-NAME-launch.sh` into out_dir; returns their paths.

    An existing file with other content is replaced only with force; otherwise the user gets an
    error and no file is written. out_dir must exist (fileio.make_output_folder).
    """
    m = mapping_for(name)
    out_dir = Path(out_dir)
    files = {
        out_dir / f"sglang-{m.optimization}.env": render_env_file(m),
        out_dir / f"sglang-{m.optimization}.flags": render_flags_file(m),
    }
    if m.dropin:
        files[out_dir / launcher_name(m)] = render_launcher_script(m)
    make_output_folder(out_dir, "--out")
    for path, text in files.items():
        if _read_or_none(path) != text:  # the same text again is no overwrite
            check_new_file(path, force, "--out")
    for path, text in files.items():
        write_text_atomic(path, text, make_dirs=False, executable=path.suffix == ".sh")
    return list(files)


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
