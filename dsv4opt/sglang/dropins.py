"""The SGLang functions dsv4opt can replace, per SGLang version and GPU family, and the checks that
the installed SGLang is one the replacements were written for, made before anything is replaced.

Which function each drop-in replaces is data: dsv4opt/optimizations/sglang_versions.py (a `Part`'s
slots). SGLang starts its model in spawned worker processes, which import everything afresh: a patch
made in the launcher's process alone never reaches the model. SGLang's general plugins do
(`sglang/srt/plugins/__init__.py`, `load_plugins()`, called by the scheduler process first thing:
`managers/scheduler.py:4181` in the 0.5.14 wheel, `:6323` in 0.5.23's); dsv4opt registers one (pyproject.toml,
entry point group `sglang.srt.plugins`) which installs the drop-ins named in DSV4OPT_SGLANG_WITH for
the GPU family in DSV4OPT_SGLANG_FAMILY, and nothing when the first is unset.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations import sglang_versions as V
from dsv4opt.optimizations.mma_attn import sglang_contract as attn

ENV_WITH = "DSV4OPT_SGLANG_WITH"  # comma-separated drop-in names, read by the plugin in every process
ENV_FAMILY = "DSV4OPT_SGLANG_FAMILY"  # sm_120 | sm_90: whose slots the plugin fills (the launcher sets it)
ENV_FORCE_SM120 = "DSV4OPT_SGLANG_FORCE_SM120"  # 1: SGLang's sm_120 attention path on any GPU (sm120_path.py)
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "dsv4opt"
PLUGIN_TARGET = "dsv4opt.sglang.plugin:load"

# The optimisations with a slot in some SGLang version known.
DROPINS: tuple[str, ...] = tuple(dict.fromkeys(
    name for v in V.VERSIONS.values() for (name, _), part in v.parts.items() if part.slots))


class DropInRefused(DsvOptError):
    """The installed SGLang is not one a drop-in can replace a function of."""


@dataclass(frozen=True)
class Plan:
    """What a drop-in replaces in this SGLang: its version, the GPU family and the slots."""

    optimization: str
    version: str
    family: str
    slots: tuple[V.Slot, ...]


def get(name: str) -> str:
    if name not in DROPINS:
        raise DropInRefused(f"no SGLang drop-in named {name!r}; drop-ins: {', '.join(DROPINS)}")
    return name


def written_for(name: str) -> str:
    """The SGLang versions `name` has slots in, with how to get the newest."""
    found = [v for v in V.VERSIONS.values() if any(p.slots for (n, _), p in v.parts.items() if n == name)]
    shown = " and ".join(f"{v.version} ({'/'.join(f for (n, f), p in v.parts.items() if n == name and p.slots)})"
                         for v in found)
    return f"the {name} drop-in is written for SGLang {shown}: pip install sglang=={found[-1].version}"


def _refuse(name: str, what: str) -> DropInRefused:
    return DropInRefused(f"{what}; {written_for(name)}")


def _import(name: str, module: str, version: str):
    if importlib.util.find_spec("sglang") is None:
        raise _refuse(name, f"SGLang is not installed in this Python ({sys.executable})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise _refuse(name, f"SGLang {version} has no module {module}") from None
        raise _refuse(name, f"SGLang {version} does not import here ({module}: {exc})") from None
    except Exception as exc:  # an SGLang that fails at import: say so in one line
        raise _refuse(name, f"SGLang {version} does not import here ({module}: {type(exc).__name__}: {exc})") from None


def _version() -> str | None:
    return V.installed()


def signature_of(parameters) -> str:
    shown, star = [], False
    for p in parameters:
        if p.keyword_only and not star:
            shown.append("*")
            star = True
        shown.append(p.name if p.default is attn.REQUIRED else f"{p.name}={p.default!r}")
    return f"({', '.join(shown)})"


def parameters_of(fn) -> tuple[attn.Param, ...] | None:
    """fn's parameters as Params, or None when it takes *args, **kwargs or positional-only ones."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in kinds for p in params):
        return None
    return tuple(attn.Param(p.name, attn.REQUIRED if p.default is inspect.Parameter.empty else p.default,
                            p.kind is inspect.Parameter.KEYWORD_ONLY) for p in params)


def _version_entry(name: str) -> V.SGLangVersion:
    if importlib.util.find_spec("sglang") is None:
        raise _refuse(name, f"SGLang is not installed in this Python ({sys.executable})")
    found = _version()
    if found is None or found not in V.VERSIONS:
        raise _refuse(name, f"SGLang {found or '(version unknown)'} is not a version dsv4opt knows ({V.known()})")
    return V.VERSIONS[found]


def check_entry(name: str, slot: V.Slot, version: str):
    """The SGLang module holding the slot's function, once its signature is the one `slot` was written for."""
    module = _import(name, slot.module, version)
    fn = getattr(module, slot.attribute, None)
    if fn is None or not callable(fn):
        raise _refuse(name, f"SGLang {version} has no {slot.module}.{slot.attribute}")
    if getattr(fn, "__module__", None) == slot.replacement.split(":")[0]:
        return module  # already ours (a second install in one process)
    found = parameters_of(fn)
    if found != slot.parameters:
        shown = signature_of(found) if found is not None else str(inspect.signature(fn))
        raise _refuse(name, f"SGLang {version}'s {slot.attribute}{shown} differs from "
                            f"{slot.attribute}{signature_of(slot.parameters)}")
    return module


def gpu_family(name: str, version: str) -> str | None:
    """The family SGLang's own checks say this GPU is (sm_120 first), None for another GPU."""
    for family, (module, fn_name) in V.GPU_CHECKS.items():
        check = getattr(_import(name, module, version), fn_name, None)
        if check is not None and check():
            return family
    return None


def preflight(name: str, force_sm120: bool = False, entry: bool = True) -> Plan:
    """Everything that must hold for SGLang's server to run drop-in `name` (its functions replaced
    unless entry=False; on any GPU through the sm_120 path with force_sm120), checked in this process."""
    version = _version_entry(name)
    v = version.version
    if force_sm120:
        if not version.force_sm120_path:
            raise DropInRefused(
                f"--force-sm120-path is for SGLang {', '.join(x.version for x in V.VERSIONS.values() if x.force_sm120_path)}: "
                f"SGLang {v} decides the sm_120 path process-wide (get_platform().is_sm120), which also changes "
                f"its MoE, indexer and memory pool; on Hopper the drop-in takes FlashMLA's slot without it")
        if importlib.util.find_spec(attn.BACKEND_MODULE) is None:
            raise _refuse(name, f"SGLang {v} has no module {attn.BACKEND_MODULE} to route through the sm_120 path")
        family = V.SM120
    else:
        family = gpu_family(name, v)
    part = version.part(name, family) if family else None
    if part is None or not part.slots:
        raise DropInRefused(_no_slot(name, version, family))
    if entry:
        for slot in part.slots:
            check_entry(name, slot, v)
    for slot in part.slots:
        if slot.dispatcher is not None:
            module, global_name, values = slot.dispatcher
            selected = getattr(_import(name, module, v), global_name, None)
            if selected not in values:
                raise DropInRefused(
                    f"SGLang's dispatcher {module}.{global_name} is {selected!r}, not "
                    f"{' or '.join(repr(x) for x in values)}, so it never calls {slot.attribute}: {slot.hint}")
    _check_plugin()
    return Plan(name, v, family, part.slots)


def _no_slot(name: str, version: V.SGLangVersion, family: str | None) -> str:
    with_slots = [f for (n, f), p in version.parts.items() if n == name and p.slots]
    part = version.part(name, family) if family else None
    why = f" ({part.note})" if part and part.note else ""
    if version.force_sm120_path and V.SM120 in with_slots and family != V.SM120:
        return (f"SGLang {version.version}'s DeepSeek-V4 backend calls the {name} slot only on sm_120 GPUs "
                f"(`_is_sm120`) and runs FlashMLA elsewhere, so on this GPU the drop-in would never run{why}; "
                "--force-sm120-path sends decode attention through SGLang's sm_120 path here too")
    if family is None:
        checks = " nor ".join(f"{fn}()" for _, fn in V.GPU_CHECKS.values())
        return (f"neither {checks} is true here: in SGLang {version.version} the {name} drop-in has slots on "
                f"{' and '.join(V.FAMILIES[f] for f in with_slots)} only")
    return f"SGLang {version.version} has no {name} slot on {V.FAMILIES[family]}{why}"


def _check_plugin() -> None:
    """SGLang's workers will run dsv4opt's plugin: it is registered here and SGLANG_PLUGINS lets it in."""
    registered = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not registered or registered[0].value != PLUGIN_TARGET:
        raise DropInRefused(
            f"dsv4opt's SGLang plugin ({PLUGIN_GROUP}: {PLUGIN_NAME}) is not registered in this Python, so "
            "SGLang's worker processes would run without the drop-in: pip install -e . (from the dsv4opt "
            "checkout) in this environment"
        )
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if allowed and PLUGIN_NAME not in {x.strip() for x in allowed.split(",")}:
        raise DropInRefused(f"SGLANG_PLUGINS={allowed} leaves out dsv4opt's plugin: add {PLUGIN_NAME} to it")


def install(name: str, slot: V.Slot, version: str) -> None:
    """Replace the SGLang attribute with ours in this process (idempotent); a drop-in that hands some
    calls back learns SGLang's own function first."""
    module = check_entry(name, slot, version)
    mod_name, fn_name = slot.replacement.split(":")
    ours = importlib.import_module(mod_name)
    if slot.fallback:
        ours.set_fallback(slot.attribute, getattr(module, slot.attribute))
    setattr(module, slot.attribute, getattr(ours, fn_name))


def requested() -> list[str]:
    """The drop-ins DSV4OPT_SGLANG_WITH names (the launcher sets it for SGLang's processes)."""
    return [get(n.strip()) for n in os.environ.get(ENV_WITH, "").split(",") if n.strip()]


def worker_plan(name: str) -> Plan:
    """In a worker: the slots of `name` for this SGLang and the family the launcher chose (else
    SGLang's own GPU checks, here)."""
    version = _version_entry(name)
    family = os.environ.get(ENV_FAMILY) or gpu_family(name, version.version)
    part = version.part(name, family) if family else None
    if part is None or not part.slots:
        raise DropInRefused(_no_slot(name, version, family))
    return Plan(name, version.version, family, part.slots)
