"""Readable kernel names: demangle C++ symbols, then shorten templates and parameter lists."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from functools import lru_cache
from itertools import chain

_MAX_CHARS = 96


def _load_cxa_demangle():
    # The usual sonames first: find_library runs `ldconfig -p` in a process of its own.
    for path in chain(("libstdc++.so.6", "libc++.so.1"), filter(None, map(ctypes.util.find_library, ("stdc++", "c++")))):
        try:
            lib = ctypes.CDLL(path)
            fn = lib.__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
        free = ctypes.CDLL(None).free
        free.argtypes = [ctypes.c_void_p]
        return fn, free
    return None


_demangler = lru_cache(maxsize=1)(_load_cxa_demangle)  # loaded on the first mangled name: most traces have none


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """`_ZN7cutlass13device_kernel...` -> `void cutlass::device_kernel<...>(...)`; other names unchanged.

    Uses libstdc++'s __cxa_demangle through ctypes. Older libstdc++ rejects newer manglings (such as
    DF16b for std::bfloat16_t); then the qualified name is read from the symbol's prefix instead.
    """
    if not name.startswith("_Z"):
        return name
    found = _demangler()
    if found is not None:
        fn, free = found
        status = ctypes.c_int(0)
        ptr = fn(name.encode(), None, None, ctypes.byref(status))
        if ptr:
            try:
                if status.value == 0:
                    return ctypes.string_at(ptr).decode("utf-8", "replace")
            finally:
                free(ptr)
    return _prefix_demangle(name)


_SOURCE_NAME = re.compile(r"(\d+)")


def _prefix_demangle(name: str) -> str:
    """`_ZN5aiter24add_rmsnorm_quant_kernelI...` -> `aiter::add_rmsnorm_quant_kernel<…>`; else `name`."""
    i = 3 if name.startswith("_ZN") else 2
    parts: list[str] = []
    while i < len(name):
        m = _SOURCE_NAME.match(name, i)
        if not m:
            break
        n = int(m.group(1))
        start = m.end()
        parts.append(name[start : start + n])
        i = start + n
    if not parts:
        return name
    text = "::".join(parts)
    if name.startswith("I", i):
        text += "<…>"
    return text


_QUALIFIER = re.compile(r"\b(?:[A-Za-z_]\w*::)+(?=[A-Za-z_~])")
_ANON = re.compile(r"\(anonymous namespace\)::")


@lru_cache(maxsize=65536)
def short_name(name: str) -> str:
    """A one-line name for tables: demangled, no return type, no parameter list, templates nested
    deeper than one level shown as <…>, namespaces dropped, at most ~96 characters."""
    return _readable(name, levels=1, limit=_MAX_CHARS)


@lru_cache(maxsize=65536)
def long_name(name: str) -> str:
    """short_name with every template level kept: what tells apart two kernels whose short names
    are equal (vectorized_elementwise_kernel<4, BinaryFunctor<…> > over a mul and over an add)."""
    return _readable(name, levels=64, limit=4 * _MAX_CHARS)


def _readable(name: str, levels: int, limit: int) -> str:
    text = _ANON.sub("", demangle(name))
    if text.startswith("void "):
        text = text[5:]
    text = _drop_parameters(text)
    text = _collapse_templates(text, levels)
    text = _QUALIFIER.sub("", text)
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text or name[:limit]


def _drop_parameters(text: str) -> str:
    """Cut the function's own parameter list: the first '(' at template depth 0 after a name."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_>"):
            return text[:i]
    return text


def _collapse_templates(text: str, levels: int = 1) -> str:
    """Keep the first `levels` template levels (the first: tile sizes, dtypes); replace anything
    deeper by <…>, and drop lambdas' and functions' parameter lists inside template arguments."""
    out: list[str] = []
    angle = paren = 0
    for ch in text:
        if ch == "(" and angle >= 1:
            paren += 1
            if paren == 1:
                out.append("()")
            continue
        if ch == ")" and paren:
            paren -= 1
            continue
        if paren:
            continue
        if ch == "<":
            angle += 1
            if angle == levels + 1:
                out.append("<…>")
            if angle > levels:
                continue
        elif ch == ">":
            angle = max(0, angle - 1)
            if angle >= levels:
                continue
        elif angle > levels:
            continue
        out.append(ch)
    return "".join(out)
