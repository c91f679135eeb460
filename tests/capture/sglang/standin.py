"""A stand-in SGLang server on 127.0.0.1 that follows SGLang's HTTP protocol, with faults on demand.

What it copies from SGLang's source (python/sglang/srt/entrypoints/http_server.py, io_struct.py,
scheduler_profiler_mixin.py / utils/profile_utils.py):
- `/generate` with `stream: true`: `data: {json}\\n\\n` chunks, each with `meta_info` {id,
  finish_reason, prompt_tokens, completion_tokens, cached_tokens}; `data: [DONE]\\n\\n` last;
  finish_reason {"type": "length", "length": N} at max_new_tokens; a closed connection aborts.
- Requests of a batch advance one token per forward step (a ticker plays the scheduler); a new
  request gets its first token after its prefill.
- `/start_profile` (GET/POST, optional ProfileReqInput body, unknown fields rejected with 400) answers
  "Start profiling.\\n"; a second start while one runs is a 500 (SGLang raises RuntimeError);
  with num_steps the profiler stops by itself after that many forward steps, then exports one gzip
  chrome trace per TP rank, `{profile_id}-TP-{rank}[-DECODE].trace.json.gz`, written in place piece
  by piece as torch's export does, while the scheduler (ticker) is blocked.
- `/stop_profile`, `/server_info` + `/get_server_info`, `/model_info` + `/get_model_info`.
Faults: not_sglang (404 everywhere), legacy_routes (only /get_*), generate_status / profile_status
(HTTP errors), profile_mode "never_finishes" (half a gzip, then nothing), "no_files" (directory
made, nothing written) or "elsewhere" (traces go to another machine's disk), stall_after
(streams go silent after k tokens but stay open).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PROFILE_REQ_FIELDS = {
    "output_dir", "start_step", "num_steps", "activities", "profile_by_stage", "with_stack",
    "record_shapes", "merge_profiles", "profile_prefix", "profile_stages",
}


class StandInSGLang:
    def __init__(self, trace: dict[str, Any], *, tp_size: int = 2, step_s: float = 0.004, prefill_s: float = 0.01):
        self.trace = trace
        self.tp_size = tp_size
        self.step_s = step_s
        self.prefill_s = prefill_s
        self.version = "0.0.0-standin"
        # faults
        self.not_sglang = False
        self.legacy_routes = False
        self.generate_status: int | None = None
        self.profile_status: int | None = None
        self.profile_mode = "ok"  # "ok" | "never_finishes" | "no_files" | "elsewhere"
        self.stall_after: int | None = None
        self.export_pieces = 4
        self.export_s = 0.04
        # what the tests look at
        self.calls: list[tuple[str, str, Any]] = []
        self.active = 0
        self.max_active = 0
        self.generate_requests = 0
        self.written: list[Path] = []
        self.forward_ct = 0
        self._profile: dict[str, Any] | None = None
        self._exporting = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tick: asyncio.Event | None = None
        self._ticker: asyncio.Task | None = None

    # lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "StandInSGLang":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=5)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    @property
    def url(self) -> str:
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def wait_idle(self, timeout_s: float = 3.0) -> bool:
        """True once no /generate stream is open (the client cancelled or finished them all)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.active == 0:
                return True
            time.sleep(0.01)
        return self.active == 0

    async def _start(self) -> None:
        self._tick = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._ticker = asyncio.create_task(self._run_ticker())

    async def _stop(self) -> None:
        self._ticker.cancel()
        self._server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    # the scheduler ----------------------------------------------------------------------------
    async def _run_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            if self.active == 0:
                continue
            self.forward_ct += 1
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()
            p = self._profile
            if p is not None and p["num_steps"] is not None and self.forward_ct >= p["target"]:
                await self._export()  # blocks the ticker, as the export blocks SGLang's scheduler

    async def _export(self) -> None:
        p, self._profile = self._profile, None
        if self.profile_mode == "elsewhere":
            return  # e.g. a server in a container: its output_dir is not this machine's
        out = Path(p["output_dir"])
        out.mkdir(parents=True, exist_ok=True)  # SGLang creates it before exporting
        if self.profile_mode == "no_files":
            return
        self._exporting = True
        try:
            suffix = "-DECODE" if p["profile_by_stage"] else ""
            for rank in range(self.tp_size):
                path = out / f"{p['profile_id']}-TP-{rank}{suffix}.trace.json.gz"
                data = gzip.compress(json.dumps(self.trace).encode())
                self.written.append(path)
                with path.open("wb") as f:
                    if self.profile_mode == "never_finishes":
                        f.write(data[: len(data) // 2])
                        continue
                    step = -(-len(data) // self.export_pieces)
                    for i in range(0, len(data), step):
                        f.write(data[i : i + step])
                        f.flush()
                        await asyncio.sleep(self.export_s / self.export_pieces)
        finally:
            self._exporting = False

    # HTTP ---------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines if ":" in h)}
            n = int(headers.get("content-length", "0"))
            raw = await reader.readexactly(n) if n else b""
            body = json.loads(raw) if raw else None
            path = target.split("?", 1)[0]
            self.calls.append((method, path, body))
            await self._route(method, path, body, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, method, path, body, reader, writer) -> None:
        if self.not_sglang:
            return await _send(writer, 404, {"detail": "Not Found"})
        if path in ("/get_server_info",) or (path == "/server_info" and not self.legacy_routes):
            return await _send(writer, 200, self._server_info())
        if path in ("/get_model_info",) or (path == "/model_info" and not self.legacy_routes):
            return await _send(writer, 200, {
                "model_path": "deepseek-ai/DeepSeek-V4-Flash", "tokenizer_path": "deepseek-ai/DeepSeek-V4-Flash",
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            })
        if path == "/start_profile":
            return await self._start_profile(body, writer)
        if path == "/stop_profile":
            if self._profile is None:
                return await _send(writer, 500, "Internal Server Error")
            asyncio.create_task(self._export())
            return await _send(writer, 200, "Stop profiling. This will take some time.\n")
        if path == "/generate" and method in ("POST", "PUT"):
            return await self._generate(body, reader, writer)
        return await _send(writer, 404, {"detail": "Not Found"})

    def _server_info(self) -> dict[str, Any]:
        return {
            "model_path": "deepseek-ai/DeepSeek-V4-Flash", "served_model_name": "deepseek-ai/DeepSeek-V4-Flash",
            "tp_size": self.tp_size, "dp_size": 1, "pp_size": 1, "ep_size": 1, "enable_dp_attention": False,
            "kv_cache_dtype": "fp8_e4m3", "disable_cuda_graph": False, "cuda_graph_max_bs": 64,
            "max_req_input_len": 65536, "internal_states": [{"last_gen_throughput": 0.0}],
            "version": self.version,
        }

    async def _start_profile(self, body, writer) -> None:
        if self.profile_status is not None:
            return await _send(writer, self.profile_status, "Internal Server Error")
        body = body or {}
        unknown = set(body) - PROFILE_REQ_FIELDS
        if unknown:
            return await _send(writer, 400, {"object": "error", "message": f"unknown fields {sorted(unknown)}",
                                             "type": "Bad Request", "param": None, "code": 400})
        if self._profile is not None:
            return await _send(writer, 500, "Internal Server Error")
        num_steps = body.get("num_steps")
        self._profile = {
            "profile_id": str(time.time()),
            "output_dir": body.get("output_dir") or "/tmp",
            "num_steps": num_steps,
            "target": self.forward_ct + (num_steps or 0),
            "profile_by_stage": bool(body.get("profile_by_stage")),
        }
        return await _send(writer, 200, "Start profiling.\n")

    async def _generate(self, body, reader, writer) -> None:
        self.generate_requests += 1
        if self.generate_status is not None:
            return await _send(writer, self.generate_status, {"object": "error", "message": "stand-in failure",
                                                              "type": "Internal Server Error", "code": self.generate_status})
        if not body or not ("text" in body or "input_ids" in body):
            return await _send(writer, 400, {"object": "error", "message": "Either text or input_ids should be provided.",
                                             "type": "Bad Request", "code": 400})
        max_new = int((body.get("sampling_params") or {}).get("max_new_tokens") or 128)
        prompt = len(body.get("input_ids") or []) or len(str(body.get("text", "")).split())
        rid = uuid.uuid4().hex
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        gone = asyncio.ensure_future(reader.read(1))  # b"" when the client closes the connection
        try:
            await asyncio.sleep(self.prefill_s)
            produced = 0
            while produced < max_new:
                tick = asyncio.ensure_future(self._tick.wait())
                done, _ = await asyncio.wait({tick, gone}, return_when=asyncio.FIRST_COMPLETED)
                tick.cancel()
                if gone in done:
                    return  # SGLang aborts the request when its client disconnects
                if self.stall_after is not None and produced >= self.stall_after:
                    continue
                produced += 1
                finish = {"type": "length", "length": max_new} if produced == max_new else None
                chunk = {"text": f" t{produced}", "output_ids": [1000 + produced], "meta_info": {
                    "id": rid, "finish_reason": finish, "prompt_tokens": prompt,
                    "completion_tokens": produced, "cached_tokens": 0}}
                await _send_chunk(writer, b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await _send_chunk(writer, b"data: [DONE]\n\n")
            await _send_chunk(writer, b"")
        finally:
            gone.cancel()
            self.active -= 1


async def _send(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
    if isinstance(payload, str):
        data, ctype = payload.encode(), "text/plain; charset=utf-8"
    else:
        data, ctype = json.dumps(payload).encode(), "application/json"
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "Error")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(data)}\r\n"
        f"connection: close\r\n\r\n".encode() + data
    )
    await writer.drain()


async def _send_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
