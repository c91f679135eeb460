"""Count what one decode step launches, per model part, on a CPU (tiny config, Triton interpreter).

A launch is a Triton kernel call, or an ATen operator that launches a kernel on a GPU (views and
metadata-only operators do not). Functions that are one GPU kernel but several CPU operators
(cuBLAS with an fp32 output) count once.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

# ATen operators that only make views or read metadata: no kernel on a GPU.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "expand", "slice", "select", "as_strided", "t", "transpose",
    "unsqueeze", "squeeze", "detach", "alias", "permute", "unflatten", "flatten", "view_as", "empty",
    "empty_like", "empty_strided", "lift_fresh", "split", "chunk", "unbind", "_to_copy_noop", "set_",
    "is_same_size", "lift_fresh_copy", "resolve_conj", "resolve_neg", "_reshape_alias", "diagonal", "new_empty",
}


class _Counter(TorchDispatchMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.removesuffix("_")
        if not self.owner.quiet and name not in NO_KERNEL:
            self.owner.counts[self.owner.part] += 1
            self.owner.ops[self.owner.part].append(name)
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    def __init__(self):
        self.counts: Counter = Counter()
        self.ops: dict[str, list] = {}
        self.stack = ["(none)"]
        self.quiet = 0

    @property
    def part(self) -> str:
        self.ops.setdefault(self.stack[-1], [])
        return self.stack[-1]

    @contextmanager
    def record_function(self, name):
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()

    def one_launch(self, fn, label):
        def wrapped(*args, **kwargs):
            self.counts[self.part] += 1
            self.ops[self.part].append(label)
            self.quiet += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.quiet -= 1
        return wrapped


def count_step(wl, tokens, monkeypatch, counter: LaunchCounter | None = None) -> LaunchCounter:
    """Run wl.step(tokens) once, counting launches per record_function part (into `counter` when given:
    a stand-in may count what it stands for there)."""
    import dsv4opt.workload.model as model

    counter = counter or LaunchCounter()
    monkeypatch.setattr(model, "record_function", counter.record_function)
    monkeypatch.setattr(model, "mm_out_fp32", counter.one_launch(model.mm_out_fp32, "mm_out_fp32"))
    real_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        counter.counts[counter.part] += 1
        counter.ops[counter.part].append(getattr(self.fn, "__name__", "triton"))
        counter.quiet += 1
        try:
            return real_run(self, *args, **kwargs)
        finally:
            counter.quiet -= 1

    monkeypatch.setattr(InterpretedFunction, "run", run)
    with _Counter(counter):
        wl.step(tokens)
    return counter
