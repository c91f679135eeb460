"""An async HTTP client for the few SGLang endpoints dsv4opt uses, with errors a user can act on.

Protocol (SGLang's http_server.py): `/generate` with `"stream": true` answers `data: {json}\\n\\n`
chunks ending with `data: [DONE]`; each chunk carries `meta_info` with the cumulative
`completion_tokens` and `finish_reason` (null until the end); errors arrive as
`data: {"error": {"message": ...}}`. `/start_profile` and `/stop_profile` answer plain text.
`/server_info` and `/model_info` replaced `/get_server_info` and `/get_model_info`; older servers
only have the latter, so both are tried.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx

from dsv4opt.errors import CaptureError


class StreamStalled(CaptureError):
    """A /generate stream sent nothing within the stall timeout."""


class SGLangClient:
    def __init__(self, url: str, *, connect_timeout_s: float, request_timeout_s: float, stall_timeout_s: float):
        self.url = url.rstrip("/")
        self._stall_timeout_s = stall_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            # one connection per in-flight stream plus room for control calls
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=8),
            trust_env=False,  # a loopback server must not be routed through a proxy from the environment
        )

    async def __aenter__(self) -> "SGLangClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def server_info(self) -> dict[str, Any]:
        return await self._get_json("/server_info", "/get_server_info")

    async def model_info(self) -> dict[str, Any]:
        return await self._get_json("/model_info", "/get_model_info")

    async def start_profile(self, body: dict[str, Any]) -> str:
        return await self._post_text("/start_profile", body)

    async def stop_profile(self) -> str:
        return await self._post_text("/stop_profile", None)

    async def generate_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield each streamed chunk (a dict) of one `/generate` request until `[DONE]`."""
        # The read timeout bounds the wait for the next chunk: that is the stall detector per request.
        timeout = httpx.Timeout(self._stall_timeout_s, connect=self._connect_timeout_s)
        try:
            async with self._http.stream("POST", "/generate", json=body, timeout=timeout) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise _status_error(resp, "/generate")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    chunk = _parse_chunk(payload)
                    if "error" in chunk:
                        raise CaptureError(f"server error on /generate: {_error_message(chunk['error'])}")
                    yield chunk
        except httpx.ReadTimeout:
            raise StreamStalled(
                f"a /generate stream sent nothing for {self._stall_timeout_s:g} s: the server stalled "
                "(check its log; raise --stall-timeout if steps are that slow)"
            ) from None
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "/generate") from None

    async def _get_json(self, path: str, legacy: str) -> dict[str, Any]:
        resp = await self._request("GET", path)
        if resp.status_code == 404:
            resp = await self._request("GET", legacy)
            if resp.status_code == 404:
                raise CaptureError(
                    f"{self.url} answers but has neither {path} nor {legacy} (HTTP 404): not an SGLang "
                    "server; check --url (the address `python -m sglang.launch_server` prints)"
                )
        if resp.status_code != 200:
            raise _status_error(resp, path)
        try:
            data = resp.json()
        except ValueError:
            raise CaptureError(f"{self.url}{path} did not return JSON: not an SGLang server? check --url") from None
        if not isinstance(data, dict):
            raise CaptureError(f"{self.url}{path} returned {type(data).__name__}, not an object; check --url")
        return data

    async def _post_text(self, path: str, body: dict[str, Any] | None) -> str:
        resp = await self._request("POST", path, json=body)
        if resp.status_code != 200:
            raise _status_error(resp, path)
        return resp.text

    async def _request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, path) from None

    def _transport_error(self, exc: httpx.HTTPError, path: str) -> CaptureError:
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return CaptureError(
                f"cannot reach an SGLang server at {self.url} ({_reason(exc)}); start it or pass --url"
            )
        if isinstance(exc, httpx.TimeoutException):
            return CaptureError(f"{self.url}{path} did not answer in time ({type(exc).__name__}); is the server overloaded?")
        return CaptureError(f"connection to {self.url} failed on {path} ({_reason(exc)}); check the server log")


def _status_error(resp: httpx.Response, path: str) -> CaptureError:
    detail = ""
    try:
        detail = _error_message(resp.json())
    except ValueError:
        detail = resp.text.strip().splitlines()[0] if resp.text.strip() else ""
    hint = "the URL is wrong (not an SGLang server?)" if resp.status_code == 404 else "see the server log"
    tail = f": {detail[:200]}" if detail else ""
    return CaptureError(f"server returned HTTP {resp.status_code} for {path}{tail}; {hint}")


def _error_message(obj: Any) -> str:
    if isinstance(obj, dict):
        for key in ("message", "detail", "error"):
            if key in obj:
                return _error_message(obj[key])
        return json.dumps(obj)[:200]
    return str(obj)


def _parse_chunk(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        raise CaptureError(f"/generate streamed a chunk that is not JSON ({payload[:80]!r}); check --url") from None
    if not isinstance(chunk, dict):
        raise CaptureError("/generate streamed a chunk that is not an object; check --url")
    return chunk


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__
