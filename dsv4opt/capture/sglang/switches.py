"""dsv4opt's optimisations on SGLang, per SGLang version: the settings files `sglang-switches` and
`apply --target sglang` write, read from the version table (dsv4opt/optimizations/sglang_versions.py).

SGLang does not contain dsv4opt's kernels. For each version and GPU family the table says what SGLang
runs where an optimisation works, whether SGLang already does the same itself (then nothing is
proposed: "already upstream"), which of its env switches would apply the same fix, and which of its
functions dsv4opt's drop-in replaces (then a launcher script is written). None of it has been run
against a live server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4opt.errors import DsvOptError
from dsv4opt.fileio import check_new_file, make_output_folder, write_text_atomic
from dsv4opt.optimizations import sglang_versions as V
from dsv4opt.optimizations.registry import get as get_optimization


@dataclass(frozen=True)
class SGLangMapping:
    optimization: str
    summary: str
    restart: str


MAPPINGS: dict[str, SGLangMapping] = {
    m.optimization: m
    for m in (
        SGLangMapping(
            "mma-attn",
            "sparse-MLA decode attention on tensor cores, one split-K launch over both KV caches",
            "restart the SGLang server (the attention backend is chosen when it starts)",
        ),
        SGLangMapping(
            "bf16-gemm",
            "the indexer score and the hyper-connection pre-mix off the float32 CUDA-core fallbacks",
            "restart the SGLang server (these variables are read at start-up)",
        ),
        SGLangMapping(
            "grouped-moe",
            "the routed experts as grouped MXFP4 GEMMs on tensor cores instead of per-slot GEMVs",
            "restart the SGLang server (the MoE runner is chosen when it starts)",
        ),
    )
}


@dataclass(frozen=True)
class OnVersion:
    """One optimisation on one SGLang version, every family the table has."""

    mapping: SGLangMapping
    version: V.SGLangVersion
    parts: dict[str, V.Part]  # family -> part

    @property
    def env(self) -> list[V.EnvSetting]:
        return list(dict.fromkeys(s for p in self.parts.values() for s in p.env))

    @property
    def dropin(self) -> bool:
        return any(p.slots for p in self.parts.values())

    @property
    def upstream_everywhere(self) -> bool:
        return all(p.upstream for p in self.parts.values())


def mapping_for(name: str) -> SGLangMapping:
    opt = get_optimization(name)  # unknown names get the registry's message
    try:
        return MAPPINGS[opt.name]
    except KeyError:
        raise DsvOptError(f"{opt.name} has no SGLang mapping yet; mapped: {', '.join(MAPPINGS)}") from None


def on_version(name: str, sglang_version: str | None = None) -> OnVersion:
    """`name` on the SGLang named (else the one installed here); a one-line refusal for a version the
    table does not know."""
    m = mapping_for(name)
    version = V.resolve(sglang_version)
    parts = {f: p for f in V.FAMILIES if (p := version.part(m.optimization, f)) is not None}
    if not parts:
        raise DsvOptError(f"the SGLang {version.version} table has nothing for {m.optimization}")
    return OnVersion(m, version, parts)


def _families(o: OnVersion, what) -> str:
    return "; ".join(f"{V.FAMILIES[f]}: {what(p)}" for f, p in o.parts.items() if what(p))


def describe(name: str, sglang_version: str | None = None) -> str:
    """What applies `name` on that SGLang, in a few lines (`apply --target sglang` prints it)."""
    o = on_version(name, sglang_version)
    v, m = o.version.version, o.mapping
    if o.upstream_everywhere:
        return f"{m.optimization}: already upstream in SGLang {v} ({_families(o, lambda p: p.upstream)}): nothing to switch."
    lines = [f"{m.optimization} on SGLang {v}: {m.summary}."]
    upstream = _families(o, lambda p: p.upstream)
    if upstream:
        lines.append(f"Already upstream on {upstream}.")
    if o.env:
        lines.append(f"Sets {', '.join(f'{s.name}={s.value}' for s in o.env)}; {m.restart}.")
    if o.dropin:
        slots = _families(o, lambda p: ", ".join(f"{s.module}.{s.attribute}" for s in p.slots))
        lines.append(f"Start the server with {launcher_name(m)} ARGS: dsv4opt's kernel in place of SGLang's "
                     f"({slots}); not yet run on a live server.")
    lines.append(f"Read from {o.version.source}; not verified on a live server.")
    return "\n".join(lines)


sglang_summary = describe


def render_env_file(o: OnVersion) -> str:
    """KEY=value lines with # comments: works with `set -a; . FILE`, docker --env-file and systemd."""
    m, v = o.mapping, o.version
    lines = [
        f"# dsv4opt {m.optimization} -> SGLang {v.version} (DeepSeek-V4): {m.summary}",
        f"# Read from {v.source}; not verified on a live server. Then: {m.restart}.",
    ]
    for family, part in o.parts.items():
        lines += ["", f"# {V.FAMILIES[family]}: SGLang runs {part.sglang_runs}."]
        if part.upstream:
            lines.append(f"# Already upstream: {part.upstream}.")
        if part.note:
            lines.append(f"# Note: {part.note}.")
        if part.slots:
            lines.append(f"# dsv4opt's drop-in replaces {', '.join(s.module + '.' + s.attribute for s in part.slots)}: "
                         f"{launcher_name(m)}.")
        for s in v.switches.get(family, ()):
            lines.append(f"#   {s.name}: {s.default} by default ({s.selects}; {s.source})")
    for s in o.env:
        lines += ["", f"# {s.selects}." + (f" Note: {s.caveat}." if s.caveat else ""), f"{s.name}={s.value}"]
    if not o.env:
        lines += ["", f"# No switch of SGLang {v.version} applies {m.optimization}: nothing to set here."]
    return "\n".join(lines) + "\n"


def render_flags_file(o: OnVersion) -> str:
    """One launch flag per line after the comments, for `$(grep -v '^#' FILE)`."""
    return "\n".join([
        f"# dsv4opt {o.mapping.optimization}: extra flags for `python -m sglang.launch_server` (SGLang {o.version.version})",
        f"# {o.mapping.optimization} needs no launch-flag change: keep your flags.",
    ]) + "\n"


def launcher_name(m: SGLangMapping) -> str:
    return f"sglang-{m.optimization}-launch.sh"


def render_launcher_script(o: OnVersion) -> str:
    """A shell script that starts SGLang's own server with dsv4opt's drop-in (dsv4opt/sglang/launch.py)."""
    m = o.mapping
    families = ", ".join(V.FAMILIES[f] for f, p in o.parts.items() if p.slots)
    return "\n".join([
        "#!/bin/sh",
        f"# dsv4opt {m.optimization}: SGLang's own server, with dsv4opt's kernel in place of SGLang's.",
        f"# Written for SGLang {o.version.version} on {families}; the launcher checks the installed SGLang "
        "and refuses another.",
        f"# Usage: ./{launcher_name(m)} <python -m sglang.launch_server arguments>",
        "# PYTHON: the interpreter of the environment that has SGLang and dsv4opt (default: python).",
        f'exec "${{PYTHON:-python}}" -m dsv4opt.sglang.launch --with {m.optimization} -- "$@"',
    ]) + "\n"


def apply_to_sglang(name: str, out_dir: Path, force: bool = False, sglang_version: str | None = None) -> list[Path]:
    """Write `sglang-NAME.env`, `sglang-NAME.flags` and, where dsv4opt has a drop-in,
    `sglang-NAME-launch.sh` into out_dir for that SGLang version; returns their paths. Nothing is
    written where the optimisation is upstream on every family ([]), and a one-line refusal comes
    where neither a switch nor a drop-in applies it.

    An existing file with other content is replaced only with force; otherwise the user gets an
    error and no file is written. out_dir must exist (fileio.make_output_folder).
    """
    o = on_version(name, sglang_version)
    if o.upstream_everywhere:
        return []
    if not o.env and not o.dropin:
        why = _families(o, lambda p: f"already upstream: {p.upstream}" if p.upstream else (p.note or "no switch applies it"))
        raise DsvOptError(f"{o.mapping.optimization} cannot be applied to SGLang {o.version.version}: {why}")
    out_dir = Path(out_dir)
    files = {
        out_dir / f"sglang-{o.mapping.optimization}.env": render_env_file(o),
        out_dir / f"sglang-{o.mapping.optimization}.flags": render_flags_file(o),
    }
    if o.dropin:
        files[out_dir / launcher_name(o.mapping)] = render_launcher_script(o)
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
