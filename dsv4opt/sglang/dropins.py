"""The SGLang functions dsv4opt can replace, and the checks that the installed SGLang is the one the
replacement was written for, made before anything is replaced.

SGLang starts its model in spawned worker processes, which import everything afresh: a patch made
in the launcher's process alone never reaches the model. SGLang's general plugins do
(`sglang/srt/plugins/__init__.py`, `load_plugins()`, called by the scheduler process first thing,
`managers/scheduler.py:4083` at 37ef295c7); dsv4opt registers one (pyproject.toml, entry point
group `sglang.srt.plugins`) which installs the drop-ins named in DSV4OPT_SGLANG_WITH, and nothing
when it is unset.
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
from dsv4opt.optimizations.mma_attn import sglang_contract as attn

ENV_WITH = "DSV4OPT_SGLANG_WITH"  # comma-separated drop-in names, read by the plugin in every process
ENV_FORCE_SM120 = "DSV4OPT_SGLANG_FORCE_SM120"  # 1: SGLang's sm_120 attention path on any GPU (sm120_path.py)
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "dsv4opt"
PLUGIN_TARGET = "dsv4opt.sglang.plugin:load"


class DropInRefused(DsvOptError):
    """The installed SGLang is not one a drop-in can replace a function of."""


@dataclass(frozen=True)
class DropIn:
    optimization: str
    module: str  # the SGLang module whose attribute the callers look up
    attribute: str
    replacement: str  # "module:function" of ours, same signature
    parameters: tuple[tuple[str, object], ...]  # (name, default or attn.REQUIRED), all positional-or-keyword
    written_for: str
    pin: str  # the pip requirement of that SGLang
    dispatcher: tuple[str, str, str]  # (module, global, value): the caller reaches the attribute only then
    dispatcher_hint: str
    gpu_check: tuple[str, str]  # (module, function): SGLang's own test for the GPU its callers need
    gpu_hint: str


DROPINS: dict[str, DropIn] = {
    "mma-attn": DropIn(
        optimization="mma-attn",
        module=attn.ENTRY_MODULE,
        attribute=attn.ENTRY_NAME,
        replacement="dsv4opt.optimizations.mma_attn.sglang_entry:flash_mla_sparse_decode_triton",
        parameters=attn.ENTRY_PARAMETERS,
        written_for=attn.WRITTEN_FOR,
        pin=f"sglang=={attn.SGLANG_VERSION}",
        dispatcher=(attn.DISPATCH_MODULE, *attn.DISPATCH_BACKEND),
        dispatcher_hint="unset SGLANG_SM120_TRITON_FLASHMLA (1, the default, selects the Triton path)",
        gpu_check=("sglang.srt.utils.common", "is_sm120_supported"),
        gpu_hint=(
            "SGLang's DeepSeek-V4 backend calls it only on sm_120 GPUs (deepseek_v4_backend.py `_is_sm120`) "
            "and runs FlashMLA elsewhere, so on this GPU the drop-in would never run; --force-sm120-path "
            "sends decode attention through SGLang's sm_120 path here too"
        ),
    ),
}


def get(name: str) -> DropIn:
    try:
        return DROPINS[name]
    except KeyError:
        raise DropInRefused(f"no SGLang drop-in named {name!r}; drop-ins: {', '.join(DROPINS)}") from None


def _refuse(d: DropIn, what: str) -> DropInRefused:
    return DropInRefused(f"{what}; the {d.optimization} drop-in was written for {d.written_for}: pip install {d.pin}")


def _import(d: DropIn, module: str, version: str):
    if importlib.util.find_spec("sglang") is None:
        raise _refuse(d, f"SGLang is not installed in this Python ({sys.executable})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise _refuse(d, f"SGLang {version} has no module {module}") from None
        raise _refuse(d, f"SGLang {version} does not import here ({module}: {exc})") from None
    except Exception as exc:  # an SGLang that fails at import: say so in one line
        raise _refuse(d, f"SGLang {version} does not import here ({module}: {type(exc).__name__}: {exc})") from None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return "(version unknown)"


def signature_of(parameters) -> str:
    shown = [name if default is attn.REQUIRED else f"{name}={default!r}" for name, default in parameters]
    return f"({', '.join(shown)})"


def _parameters(fn) -> tuple[tuple[str, object], ...] | None:
    """(name, default) of fn, or None when it takes anything but plain positional-or-keyword ones."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return tuple((p.name, attn.REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in params)


def check_entry(d: DropIn, version: str | None = None):
    """The SGLang module holding the entry point, once its signature is the one `d` was written for."""
    version = version or _version()
    module = _import(d, d.module, version)
    fn = getattr(module, d.attribute, None)
    if fn is None or not callable(fn):
        raise _refuse(d, f"SGLang {version} has no {d.module}.{d.attribute}")
    if getattr(fn, "__module__", None) == d.replacement.split(":")[0]:
        return module  # already ours (a second install in one process)
    found = _parameters(fn)
    if found != d.parameters:
        shown = signature_of(found) if found is not None else str(inspect.signature(fn))
        raise _refuse(d, f"SGLang {version}'s {d.attribute}{shown} differs from {d.attribute}{signature_of(d.parameters)}")
    return module


def preflight(d: DropIn, force_sm120: bool = False, entry: bool = True) -> str:
    """Everything that must hold for SGLang's server to run `d` (its entry point replaced unless
    entry=False; on any GPU with force_sm120), checked in this process; returns SGLang's version."""
    version = _version()
    if entry:
        check_entry(d, version)
    module, name, wanted = d.dispatcher
    selected = getattr(_import(d, module, version), name, None)
    if selected != wanted:
        raise DropInRefused(
            f"SGLang's dispatcher {module}.{name} is {selected!r}, not {wanted!r}, so it never calls "
            f"{d.attribute}: {d.dispatcher_hint}"
        )
    if force_sm120:
        if importlib.util.find_spec(attn.BACKEND_MODULE) is None:
            raise _refuse(d, f"SGLang {version} has no module {attn.BACKEND_MODULE} to route through the sm_120 path")
    else:
        mod_name, fn_name = d.gpu_check
        gpu_ok = getattr(_import(d, mod_name, version), fn_name, None)
        if gpu_ok is None or not gpu_ok():
            raise DropInRefused(f"{fn_name}() is false here: {d.gpu_hint}")
    _check_plugin()
    return version


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


def install(d: DropIn) -> None:
    """Replace the SGLang attribute with ours in this process (idempotent)."""
    module = check_entry(d)
    mod_name, fn_name = d.replacement.split(":")
    setattr(module, d.attribute, getattr(importlib.import_module(mod_name), fn_name))


def requested() -> list[DropIn]:
    """The drop-ins DSV4OPT_SGLANG_WITH names (the launcher sets it for SGLang's processes)."""
    return [get(n.strip()) for n in os.environ.get(ENV_WITH, "").split(",") if n.strip()]
