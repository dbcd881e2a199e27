"""A fake ``vllm`` executable for failure-case tests: prints a recorded log, then exits or serves and misbehaves.

Invoked as ``vllm serve MODEL --host H --port P --served-model-name NAME ...`` (other flags are ignored).
Behaviour comes from the JSON in ``$FAKE_VLLM`` (the test's environment reaches the server through the
process runtime):

- ``start_log``: a file printed first (the report's startup lines);
- ``exit``: exit with this status right after the start log (a start-time crash);
- otherwise serve an OpenAI-compatible API on the port: ``/health``, ``/v1/models``, ``/v1/completions``,
  ``/v1/chat/completions`` (plain and streamed), with:
  - ``crash_after``: the number of generation requests answered before the next one crashes the server
    (``crash_log`` printed, exit status ``crash_code``, default 134 = SIGABRT);
  - ``reasoning_in_content``: the reasoning comes back inside ``content`` as ``<think>...</think>`` and
    ``reasoning_content`` stays null (N05);
  - ``raw_tool_calls``: a tool request gets the model's raw ``<minimax:tool_call>`` markup as ``content`` and
    no ``tool_calls``;
  - ``degenerate``: ``"nul"`` (NUL characters) or ``"repeat"`` (one token repeated) as every generated text
    after the first completion (readiness passes).

An API key (``--api-key K`` or ``VLLM_API_KEY`` in the environment) guards ``/v1`` as vLLM does: 401 without
``Authorization: Bearer K``; ``/health`` stays open.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPEC = json.loads(os.environ.get("FAKE_VLLM", "{}"))
ARGS = sys.argv[1:]


def _arg(flag: str, default: str) -> str:
    return ARGS[ARGS.index(flag) + 1] if flag in ARGS[:-1] else default


def _print_file(key: str) -> None:
    if SPEC.get(key):
        with open(SPEC[key]) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()


_print_file("start_log")
if "exit" in SPEC:
    time.sleep(0.3)
    sys.exit(SPEC["exit"])

MODEL = _arg("--served-model-name", "fake")
SERVE = SPEC.get("serve", {})
state = {"generations": 0}


def _text(kind: str) -> str:
    deg = SERVE.get("degenerate")
    if deg and state["generations"] > 1:
        return "\x00" * 8 if deg == "nul" else " the" * 24
    return {"completion": " Paris, a city of bridges.", "answer": "4"}[kind]


API_KEY = _arg("--api-key", os.environ.get("VLLM_API_KEY", ""))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _refused(self) -> bool:
        if API_KEY and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._send(401, {"error": "Unauthorized"})
            return True
        return False

    def log_message(self, *a):  # keep the server log to the recorded lines
        pass

    def _send(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self._refused():
            return
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(404, {})

    def _generation(self) -> None:
        state["generations"] += 1
        if "crash_after" in SERVE and state["generations"] > SERVE["crash_after"]:
            _print_file("crash_log")
            os._exit(SERVE.get("crash_code", 134))

    def do_POST(self):  # noqa: N802
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self._refused():
            return
        self._generation()
        if self.path == "/v1/completions" and req.get("stream"):  # bench: one token per chunk, then usage
            n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            self._sse([{"choices": [{"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}],
                        **({"usage": {"prompt_tokens": 8, "completion_tokens": i + 1, "total_tokens": 9 + i}}
                           if (req.get("stream_options") or {}).get("continuous_usage_stats") else {})}
                       for i in range(n)]
                      + ([{"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}]
                         if (req.get("stream_options") or {}).get("include_usage") else []))
            return
        if self.path == "/v1/completions":
            self._send(200, {"choices": [{"index": 0, "text": _text("completion"), "finish_reason": "length"}]})
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {})
            return
        msg: dict = {"role": "assistant", "content": _text("answer"), "reasoning_content": "2 plus 2 is 4.",
                     "tool_calls": []}
        if req.get("tools"):
            msg["reasoning_content"] = None
            if SERVE.get("raw_tool_calls"):
                msg["content"] = ('<minimax:tool_call>\n<invoke name="get_weather">\n'
                                  '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>')
            else:
                msg["content"] = None
                msg["tool_calls"] = [{"id": "call_0", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
        elif SERVE.get("reasoning_in_content"):
            msg["content"] = "<think>\n2 plus 2 is 4.\n</think>\n\n" + _text("answer")
            msg["reasoning_content"] = None
        if not req.get("stream"):
            self._send(200, {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]})
            return
        deltas = [{"reasoning_content": msg["reasoning_content"]}] if msg.get("reasoning_content") else []
        deltas.append({"content": msg["content"]})
        self._sse([{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas])

    def _sse(self, chunks: list[dict]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


ThreadingHTTPServer(("127.0.0.1", int(_arg("--port", "8000"))), Handler).serve_forever()
