"""The version table (dsv4opt/optimizations/sglang_versions.py) against SGLang's own code, per version,
on a CPU: each version's modules come from its PyPI wheel (tests/sglang/wheels.py; skipped, saying
why, when the wheel cannot be downloaded).

- every slot a drop-in replaces is a function of that version, with the parameters the table says;
- every env switch is read where the table says, with the default it says;
- SGLang's own dispatchers and the DeepSeek-V4 backend's calls, run as that version runs them after
  dsv4opt's plugin has loaded, reach dsv4opt's functions, on tensors built as that version builds
  them, and give the float64 reference's result;
- the keywords the backend passes (read from its source) are the ones the drop-ins are called with.
"""

from __future__ import annotations

import ast
import functools
import re

import pytest
import torch

from dsv4opt.optimizations import sglang_versions as V
from dsv4opt.optimizations.mma_attn import sglang_contract as C
from dsv4opt.optimizations.mma_attn import sglang_entry as E
from dsv4opt.sglang import dropins, plugin
from tests.optimizations.test_mma_attn_sglang import (
    INTERPRETED, SGLANG_CASES, Case, assert_close, assert_flashmla_lse, backend_flashmla_kwargs, build_call,
    reference, reference_flashmla_lse,
)
from tests.sglang.wheels import WheelModules, source, stub, wheel

on_cpu = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
FLASH_MLA = ("sgl-flash-mla", "1.0.0")  # the FlashMLA 0.5.23 pins (METADATA:272)
BACKEND = {C.SGLANG_VERSION: "sglang/srt/layers/attention/deepseek_v4_backend.py",
           C.SGLANG_023: "sglang/srt/layers/attention/deepseek_v4_backend.py"}
SM120_DISPATCH = {C.SGLANG_VERSION: C.DISPATCH_MODULE, C.SGLANG_023: C.SM120_MODULE_023}


def _no_flash_mla_kernels(use_legacy):
    raise RuntimeError("test stub: no FlashMLA kernels on a CPU")


def sglang_stubs(version: str) -> dict:
    if version == C.SGLANG_VERSION:
        return {}
    # sglang/srt/utils/__init__.py imports the server's dependencies; flash_mla_sm120.py needs is_hip only
    return {"sglang.srt.utils": stub("sglang.srt.utils", "stands for sglang.srt.utils (is_hip only)",
                                     is_hip=lambda: False)}


@pytest.fixture
def flash_mla():
    """sgl-flash-mla's Python side from its wheel, its CUDA extensions left out (they need a GPU):
    flash_mla/__init__.py's names, set on the package by hand, and a _loader whose ops raise."""
    loader = stub("flash_mla._loader", "stands for the loader of the CUDA extensions",
                  get_ops=_no_flash_mla_kernels, has_legacy=lambda: False)
    with WheelModules(wheel(*FLASH_MLA), "flash_mla", {"flash_mla._loader": loader}) as w:
        interface = w.load("flash_mla.flash_mla_interface")
        package = w.load("flash_mla")
        for name in ("get_mla_metadata", "get_mla_decoding_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"):
            setattr(package, name, getattr(interface, name))
        package.fused_norm_rope_attn_rope_cast = w.load("flash_mla.fused_norm_rope_attn_rope_cast")
        yield package


@pytest.fixture
def sglang(request, monkeypatch):
    """`sglang(version)`: that version's modules from its wheel, with dsv4opt told it is installed."""
    opened = []

    def _open(version: str) -> WheelModules:
        w = WheelModules(wheel("sglang", version), "sglang", sglang_stubs(version)).__enter__()
        opened.append(w)
        monkeypatch.setattr(dropins, "_version", lambda: version)
        return w

    yield _open
    for w in opened:
        w.__exit__(None, None, None)


def load_plugin(monkeypatch, family: str) -> None:
    """What SGLang's scheduler does first (load_plugins), with the launcher's variables set."""
    monkeypatch.setenv(dropins.ENV_WITH, "mma-attn")
    monkeypatch.setenv(dropins.ENV_FAMILY, family)
    monkeypatch.setattr(E, "_fallback", {})
    plugin.load()


SLOTS = [(v.version, family, slot) for v in V.VERSIONS.values() for (_, family), part in v.parts.items()
         for slot in part.slots]


@pytest.mark.parametrize("version, family, slot", SLOTS, ids=[f"{v}-{f}-{s.attribute}" for v, f, s in SLOTS])
def test_every_slot_is_a_function_of_its_version(sglang, flash_mla, version, family, slot):
    sglang(version)
    fn = getattr(__import__(slot.module, fromlist=[slot.attribute]), slot.attribute)
    assert dropins.parameters_of(fn) == slot.parameters
    if slot.dispatcher is not None:  # the dispatcher's global exists and, by default, reaches a slot
        module, name, values = slot.dispatcher
        assert getattr(__import__(module, fromlist=[name]), name) in values


def _cited_lines(whl, cite: str) -> str:
    path, lines = cite.strip().rsplit(":", 1)
    first, _, last = lines.partition("-")
    text = source(whl, f"sglang/{path}").splitlines()
    return "\n".join(text[int(first) - 1: int(last or first)])


SWITCHES = [(v.version, family, s) for v in V.VERSIONS.values() for family, switches in v.switches.items()
            for s in switches]


@pytest.mark.parametrize("version, family, switch", SWITCHES, ids=[f"{v}-{f}-{s.name}" for v, f, s in SWITCHES])
def test_every_switch_is_read_where_the_table_says(version, family, switch):
    whl = wheel("sglang", version)
    cites = switch.source.split(";")
    for cite in cites:
        assert switch.name in _cited_lines(whl, cite), cite
    environ = [c for c in cites if "environ.py" in c]
    if environ and "(" not in switch.default:  # no override on this family: environ.py's default is it
        declared = re.search(r"Env(?:Bool|Str)\((.*)\)", _cited_lines(whl, environ[0])).group(1).strip('"')
        assert declared == switch.default


def test_the_sm120_backend_switch_of_0_5_14_is_its_own_dispatcher_code():
    # 0.5.14 has no environ entry for it: the dispatcher reads os.environ itself
    text = _cited_lines(wheel("sglang", C.SGLANG_VERSION), "srt/layers/attention/flash_mla_sm120.py:198-200")
    assert 'os.environ.get("SGLANG_SM120_TRITON_FLASHMLA", "1") == "1"' in text


def _calls(text: str, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


@pytest.mark.parametrize("version", [C.SGLANG_VERSION, C.SGLANG_023])
def test_the_backend_calls_with_the_keywords_the_drop_ins_are_called_with(version):
    text = source(wheel("sglang", version), BACKEND[version])
    [sm120] = _calls(text, "flash_mla_with_kvcache_sm120")
    assert not sm120.args and [k.arg for k in sm120.keywords] == list(C.SM120_CALL_KEYWORDS)
    [hopper] = _calls(text, "flash_mla_with_kvcache")
    assert not hopper.args and [k.arg for k in hopper.keywords] == list(C.FLASHMLA_CALL_KEYWORDS)
    if version == C.SGLANG_023:  # bound once, in __init__, from the module attribute the plugin replaces
        [bound] = [c for c in _calls(text, "partial") if [k.arg for k in c.keywords] == ["use_legacy"]]
        assert ast.unparse(bound.args[0]) == "flash_mla_interface.flash_mla_with_kvcache"


def test_0_5_23_dispatcher_passes_flashinfers_slot_the_ten_arguments_in_order():
    text = source(wheel("sglang", C.SGLANG_023), C.SM120_MODULE_023.replace(".", "/") + ".py")
    dispatcher = next(n for n in ast.walk(ast.parse(text))
                      if isinstance(n, ast.FunctionDef) and n.name == "flash_mla_with_kvcache_sm120")
    [call] = _calls(ast.unparse(dispatcher), C.FLASHINFER_NAME)
    assert [ast.unparse(a) for a in call.args] == [p.name for p in C.FLASHINFER_PARAMETERS]


def test_0_5_23_triton_entry_is_0_5_14s_file_at_its_new_path():
    old = source(wheel("sglang", C.SGLANG_VERSION), C.ENTRY_MODULE.replace(".", "/") + ".py")
    new = source(wheel("sglang", C.SGLANG_023), C.TRITON_MODULE_023.replace(".", "/") + ".py")
    assert new.replace("sglang.kernels.ops.attention", "sglang.srt.layers.attention") == old


@pytest.mark.parametrize("page_size", [256, 64, 2], ids=["window", "c4", "c128"])
def test_0_5_23_v4_pages_are_our_layout(sglang, page_size):
    sglang(C.SGLANG_023)
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    v4 = KVLayout.V4
    ours = C.layout(page_size)
    assert v4.page_bytes(page_size) == ours.page_bytes == C.page_bytes(page_size)
    assert v4.row_addressing(page_size) == (ours.data_bytes, page_size * ours.data_bytes, ours.scale_bytes)
    assert v4.bytes_per_token == C.TOKEN_BYTES and not v4.is_interleaved  # so use_legacy=True (:1265-1271)


def backend_sm120_kwargs(call) -> dict:
    """The keywords deepseek_v4_backend.py passes the sm_120 dispatcher (C.SM120_CALL_KEYWORDS)."""
    kw = call.kwargs
    return dict(q=kw["q"], k_cache=kw["k_cache"], head_dim_v=C.DIM, softmax_scale=kw["softmax_scale"],
                indices=kw["indices"], topk_length=kw["topk_length"], attn_sink=kw["attn_sink"],
                extra_k_cache=kw.get("extra_k_cache"), extra_indices_in_kvcache=kw.get("extra_indices"),
                extra_topk_length=kw.get("extra_topk_length"))


@on_cpu
@pytest.mark.parametrize("version, backend", [(C.SGLANG_VERSION, None), (C.SGLANG_023, None), (C.SGLANG_023, "triton")],
                         ids=["0.5.14", "0.5.23-flashinfer", "0.5.23-triton"])
def test_sglangs_sm120_dispatcher_reaches_the_drop_in(sglang, monkeypatch, version, backend):
    if backend:  # read once, when the module is imported (flash_mla_sm120.py:209)
        monkeypatch.setenv("SGLANG_SM120_FLASHMLA_BACKEND", backend)
    sglang(version)
    dispatcher = __import__(SM120_DISPATCH[version], fromlist=["x"])
    call = build_call(Case("csa", batch=3, heads=8, topk=64), seed=21)
    if version == C.SGLANG_023 and backend is None:  # before the plugin: SGLang's own FlashInfer call
        with pytest.raises(ModuleNotFoundError, match="flashinfer"):
            dispatcher.flash_mla_with_kvcache_sm120(**backend_sm120_kwargs(call))
    load_plugin(monkeypatch, V.SM120)
    out, lse = dispatcher.flash_mla_with_kvcache_sm120(**backend_sm120_kwargs(call))
    ref_o, ref_lse = reference(call)
    assert error_report_ok(out, ref_o)
    if version == C.SGLANG_023 and backend is None:
        assert lse is None  # as _flash_mla_flashinfer's
    else:
        assert_close(out, lse, ref_o, ref_lse)


def error_report_ok(out, ref) -> bool:
    from dsv4opt.numerics import error_report

    return out.dtype == torch.bfloat16 and out.shape == ref.shape and error_report(out, ref).ok(1e-2)


@on_cpu
@pytest.mark.parametrize("case", [Case("csa-c4", batch=3, heads=8, topk=64),
                                  Case("hca-c128-empty", batch=3, heads=4, ratio=128, topk=37, pattern="empty"),
                                  Case("window-only", batch=2, heads=64, ratio=0)], ids=lambda c: c.name)
def test_hopper_backend_call_reaches_the_drop_in(sglang, flash_mla, monkeypatch, case):
    sglang(C.SGLANG_023)
    from sglang.kernels.ops.attention import flash_mla_interface

    load_plugin(monkeypatch, V.SM90)
    # As the backend's __init__ binds it after the scheduler loaded the plugins (:1268-1271)
    bound = functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=True)
    meta = flash_mla_interface.get_mla_metadata()[0]  # _create_flashmla_metadata (:210-215)
    call = build_call(case, seed=22)
    kwargs = backend_flashmla_kwargs(call, meta)
    kwargs.pop("use_legacy")
    out, lse = bound(**kwargs)
    assert error_report_ok(out, reference(call)[0])
    assert_flashmla_lse(lse, reference_flashmla_lse(call))
    assert not meta.have_initialized  # the schedule SGLang made is left for FlashMLA's own calls


def test_hopper_drop_in_hands_other_calls_to_sglangs_flashmla(sglang, flash_mla, monkeypatch):
    # flashmla_backend.py imports the same attribute for other models' dense MLA: SGLang's wrapper
    # gets those calls, and from it FlashMLA (here the stub that says no kernels run on a CPU).
    sglang(C.SGLANG_023)
    from sglang.kernels.ops.attention import flash_mla_interface

    load_plugin(monkeypatch, V.SM90)
    assert flash_mla_interface.flash_mla_with_kvcache is E.flash_mla_with_kvcache
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    cache = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="test stub: no FlashMLA kernels"):
        flash_mla_interface.flash_mla_with_kvcache(
            q, cache, torch.zeros(2, 4, dtype=torch.int32), torch.full((2,), 64, dtype=torch.int32), 512,
            flash_mla_interface.get_mla_metadata()[0])


@on_cpu
@pytest.mark.parametrize("case", SGLANG_CASES[:1], ids=lambda c: c.name)
def test_0_5_23_own_triton_entry_meets_the_reference_too(sglang, case):
    # SGLang's own function of 0.5.23, through its dispatcher with SGLANG_SM120_FLASHMLA_BACKEND=triton
    # and no plugin: the contract the drop-in is held to is the one SGLang's function keeps.
    sglang(C.SGLANG_023)
    triton_entry = __import__(C.TRITON_MODULE_023, fromlist=["x"])
    triton_entry._tiled_sparse_decode_kernel.configs = triton_entry._tiled_sparse_decode_kernel.configs[:1]
    call = build_call(case, seed=23)
    kw = dict(call.kwargs, q=call.kwargs["q"].to(torch.bfloat16))
    out, lse = getattr(triton_entry, C.ENTRY_NAME)(**kw)
    assert_close(out, lse, *reference(call))
