"""`python -m dsv4opt.sglang.launch --with mma-attn -- <sglang launch_server args>`: SGLang's own
server, with dsv4opt's drop-ins in place of the SGLang functions they replace.

Checks the installed SGLang first (dropins.preflight: its version, the GPU family, the functions the
drop-in replaces there) and refuses in one line when it is not one a drop-in was written for; then
sets DSV4OPT_SGLANG_WITH and DSV4OPT_SGLANG_FAMILY for SGLang's worker processes (dsv4opt's plugin
installs the drop-ins there), installs them here, and runs `sglang.launch_server` as its own
`python -m` would, in this process.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from rich.console import Console
from rich.markup import escape

from dsv4opt.errors import DsvOptError
from dsv4opt.sglang import sm120_path
from dsv4opt.sglang.dropins import DROPINS, ENV_FAMILY, ENV_FORCE_SM120, ENV_WITH, get, install, preflight

USAGE = ("python -m dsv4opt.sglang.launch [--with NAME ...] [--force-sm120-path] -- "
         "<sglang.launch_server arguments>")
SM120_PATH = "mma-attn"  # the drop-in whose path --force-sm120-path opens


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dsv4opt.sglang.launch", usage=USAGE,
                                description="SGLang's own server with dsv4opt's drop-ins.")
    p.add_argument("--with", dest="names", action="append", default=[], metavar="NAME",
                   help=f"drop-in to install ({', '.join(DROPINS)})")
    p.add_argument("--force-sm120-path", action="store_true",
                   help="send DeepSeek-V4 decode attention through SGLang's sm_120 path on any GPU "
                        "(alone: SGLang's own sm_120 kernel, the baseline for --with mma-attn)")
    return p


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(ours, SGLang's): SGLang's arguments follow the first `--`."""
    if "--" not in argv:
        raise DsvOptError(f"put SGLang's launch_server arguments after --: {USAGE}")
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def run_sglang_server(server_args: list[str]) -> None:
    """`python -m sglang.launch_server ARGS` in this process: its __main__ block, its argv; this module
    stays __main__, the one SGLang's spawned workers import again (and find side-effect free)."""
    sys.argv = ["sglang.launch_server", *server_args]
    runpy.run_module("sglang.launch_server", run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        ours, server_args = split_args(argv)
        opts = _parser().parse_args(ours)
        dropins = [get(name) for name in dict.fromkeys(opts.names)]
        if not dropins and not opts.force_sm120_path:
            raise DsvOptError(f"nothing to do: name a drop-in with --with ({', '.join(DROPINS)}) or pass --force-sm120-path")
        plans = [preflight(name, opts.force_sm120_path) for name in dropins]
        # --force-sm120-path alone: SGLang's own sm_120 kernel, checked as the drop-in's path would be
        family = (plans[0] if plans else preflight(SM120_PATH, force_sm120=True, entry=False)).family
    except DsvOptError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 1
    os.environ[ENV_WITH] = ",".join(dropins)
    os.environ[ENV_FAMILY] = family
    os.environ.pop(ENV_FORCE_SM120, None)  # only what this command line asks for reaches the workers
    if opts.force_sm120_path:
        os.environ[ENV_FORCE_SM120] = "1"
        sm120_path.force()
        err.print("dsv4opt: DeepSeek-V4 decode attention takes SGLang's sm_120 path on this GPU")
    for plan in plans:
        for slot in plan.slots:
            install(plan.optimization, slot, plan.version)
            err.print(f"dsv4opt: {plan.optimization} replaces {slot.module}.{slot.attribute} in SGLang "
                      f"{plan.version} ({plan.family}: {slot.reached})")
    err.print("dsv4opt: starting SGLang's server")
    run_sglang_server(server_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
