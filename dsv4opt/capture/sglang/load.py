"""Closed-loop load: exactly C streaming `/generate` requests in flight, a finished one replaced at once.

Like SGLang's own benchmark at fixed concurrency, but each of the C slots is one asyncio task that
sends its next request as soon as the previous one ends, so the count never drifts. Prompts are
random token ids (seeded, different per request, so the radix cache cannot skip their prefill);
`ignore_eos` keeps every request decoding until max_new_tokens.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dsv4opt.capture.sglang.client import SGLangClient, StreamStalled
from dsv4opt.errors import CaptureError

# Token ids drawn from a range every real vocabulary has (DeepSeek-V4's is 129280).
_TOKEN_RANGE = (1000, 30000)
_POLL_S = 0.02


@dataclass
class RequestRecord:
    slot: int
    index: int
    sent_s: float
    events: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, completion tokens)
    finished_s: float | None = None
    finish_reason: Any = None


class LoadGenerator:
    def __init__(
        self,
        client: SGLangClient,
        *,
        concurrency: int,
        prompt_len: int,
        max_new_tokens: int,
        stall_timeout_s: float,
        seed: int = 0,
    ):
        self.client = client
        self.concurrency = concurrency
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self.stall_timeout_s = stall_timeout_s
        self.seed = seed
        self.records: list[RequestRecord] = []
        self.current: list[RequestRecord | None] = [None] * concurrency
        self.failure: BaseException | None = None
        self.last_progress_s = time.monotonic()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self.last_progress_s = time.monotonic()
        self._tasks = [asyncio.create_task(self._run_slot(i), name=f"sglang-load-{i}") for i in range(self.concurrency)]

    def request_body(self, index: int) -> dict[str, Any]:
        rng = random.Random(self.seed * 1_000_003 + index)
        return {
            "input_ids": [rng.randrange(*_TOKEN_RANGE) for _ in range(self.prompt_len)],
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }

    def all_decoding(self) -> bool:
        """Every in-flight request has its first token, i.e. its prefill is over."""
        return all(r is not None and r.finished_s is None and r.events for r in self.current)

    def silent_since(self, t: float) -> int:
        """In-flight requests, already sent at t, whose latest token is older than t."""
        return sum(
            1 for r in self.current
            if r is not None and r.finished_s is None and r.sent_s <= t and (not r.events or r.events[-1][0] < t)
        )

    def finished_between(self, t0: float, t1: float) -> int:
        return sum(1 for r in self.records if r.finished_s is not None and t0 <= r.finished_s <= t1)

    def check(self, *, allow_stalls: bool = False) -> None:
        """Raise the first request failure; with allow_stalls, a stalled stream is not one."""
        if self.failure is not None and not (allow_stalls and isinstance(self.failure, StreamStalled)):
            raise self.failure
        if not allow_stalls and time.monotonic() - self.last_progress_s > self.stall_timeout_s:
            raise CaptureError(
                f"no token from any of the {self.concurrency} requests for {self.stall_timeout_s:g} s: "
                "the server stalled (check its log; raise --stall-timeout if steps are that slow)"
            )

    async def wait_until(self, predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            if predicate():
                return
            if time.monotonic() >= deadline:
                raise CaptureError(
                    f"gave up after {timeout_s:g} s waiting for {what}; the server may be overloaded "
                    "(try a lower --concurrency or --prompt-len) or raise --timeout"
                )
            await asyncio.sleep(_POLL_S)

    async def run_for(self, seconds: float) -> None:
        """Keep the load running for `seconds`, failing early if a request fails or all stall."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            await asyncio.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
        self.check()

    async def close(self, timeout_s: float = 10.0) -> None:
        """Cancel every outstanding request (closing its stream makes SGLang abort it)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)
        self._tasks = []

    async def _run_slot(self, slot: int) -> None:
        while True:
            record = RequestRecord(slot=slot, index=len(self.records), sent_s=time.monotonic())
            self.records.append(record)
            self.current[slot] = record
            try:
                await self._stream_one(record)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # reported through check(); the slot stops
                if self.failure is None:
                    self.failure = exc
                return

    async def _stream_one(self, record: RequestRecord) -> None:
        async for chunk in self.client.generate_stream(self.request_body(record.index)):
            now = time.monotonic()
            meta = chunk.get("meta_info") or {}
            # completion_tokens is cumulative; without it (not SGLang?) count one token per chunk
            tokens = meta.get("completion_tokens")
            count = int(tokens) if isinstance(tokens, (int, float)) else len(record.events) + 1
            record.events.append((now, count))
            self.last_progress_s = now
            reason = meta.get("finish_reason")
            if isinstance(reason, dict) and reason.get("type") == "abort":
                raise CaptureError(f"the server aborted a request: {reason.get('message') or reason}")
            if reason is not None:
                record.finish_reason = reason
        record.finished_s = time.monotonic()
