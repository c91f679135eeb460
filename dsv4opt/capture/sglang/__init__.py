"""The SGLang target: profile a live server's decode, and map dsv4opt's optimisations onto its switches."""

from dsv4opt.capture.sglang.capture import capture_sglang
from dsv4opt.capture.sglang.switches import MAPPINGS, apply_to_sglang, describe, sglang_summary

__all__ = ["capture_sglang", "apply_to_sglang", "describe", "sglang_summary", "MAPPINGS"]
