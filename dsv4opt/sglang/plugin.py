"""dsv4opt's SGLang general plugin: SGLang's `load_plugins()` runs `load` in each of its processes
(main, tokenizer, scheduler/model workers). It installs the drop-ins DSV4OPT_SGLANG_WITH names, which
the launcher sets after checking the installed SGLang, in the slots of the installed version and of
the GPU family DSV4OPT_SGLANG_FAMILY names (sglang_versions.py); with the variable unset it does
nothing, so installing dsv4opt never changes an SGLang server by itself. DSV4OPT_SGLANG_FORCE_SM120=1 also sends
DeepSeek-V4 decode attention through SGLang's sm_120 path on any GPU (sm120_path.py)."""

from __future__ import annotations

import logging
import os

from dsv4opt.sglang.dropins import ENV_FORCE_SM120, install, requested, worker_plan

log = logging.getLogger("dsv4opt.sglang")


def load() -> None:
    if os.environ.get(ENV_FORCE_SM120) == "1":
        from dsv4opt.sglang import sm120_path

        sm120_path.force()
        log.info("dsv4opt: DeepSeek-V4 decode attention takes SGLang's sm_120 path in process %d", os.getpid())
    for name in requested():
        plan = worker_plan(name)
        for slot in plan.slots:
            install(name, slot, plan.version)
            log.info("dsv4opt: %s.%s is %s's drop-in in process %d (SGLang %s, %s)", slot.module, slot.attribute,
                     name, os.getpid(), plan.version, plan.family)
