"""A fake ``vllm`` executable for failure-case tests: prints a recorded log, then exits or serves and misbehaves.

Invoked as ``vllm serve MODEL --host H --port P --served-model-name NAME [ALIAS...] ...`` (other flags are
ignored). Behaviour comes from the JSON in ``$FAKE_VLLM`` (the test's environment reaches the server through the
process runtime):

- ``start_log``: a file printed first (the report's startup lines);
- ``exit``: exit with this status right after the start log (a start-time crash);
- ``fail_if``: ``[{"arg": FLAG, "log": FILE, "exit": N}]``: a start whose command line has FLAG prints FILE and
  exits N (a component that fails only with that flag on; ``"unless": FLAG`` instead of ``arg``: a start without
  FLAG, e.g. every start not in eager mode); ``signal``: killed by that signal after the start log;
- otherwise serve an OpenAI-compatible API on the port: ``/health``, ``/v1/models`` (every served name, in
  order, with ``max_model_len`` when ``serve.max_model_len`` is set), ``/tokenize``, ``/v1/completions``,
  ``/v1/chat/completions`` (plain and streamed). Prompt tokens are counted by whitespace and reported in
  ``usage``; a chat question "What is A + B?" is answered with the sum. ``serve`` options:
  - ``crash_after``: the number of generation requests answered before the next one crashes the server
    (``crash_log`` printed, exit status ``crash_code``, default 134 = SIGABRT);
  - ``die_above_tokens``: a generation request whose prompt has more tokens than this crashes the server the
    same way (default log: a CUDA illegal memory access raised in MiniMax-M3's MSA sparse attention, as vLLM 0.26
    did on an H200 for any prompt beyond one 128-token MSA block);
  - ``reasoning_in_content``: the reasoning comes back inside ``content`` between the ``think`` markers
    (default ``["<think>", "</think>"]``) and ``reasoning_content`` stays null (N05);
  - ``raw_tool_calls``: a tool request gets the model's raw ``<minimax:tool_call>`` markup as ``content`` and
    no ``tool_calls``;
  - ``wrong_answer``: arithmetic is answered wrong (a server whose kernels produce wrong output);
  - ``error_event``: a streamed chat answer sends its first chunk, then an error event
    (``data: {"error": {...}}``, as vLLM does when a request fails mid-stream) while HTTP stays 200;
  - ``split_tool_call``: a streamed tool call comes in two parts under two indexes, the second without a
    function name (the arguments land in a nameless call);
  - ``traceback_on_chat``: every chat request logs a Python traceback (a tool parser's error, as vLLM logs it)
    and is still answered 200;
  - ``tokenize``: false = no ``/tokenize`` (404, as a non-vLLM server);
  - ``block_size``: the KV block size ``/metrics`` reports (``vllm:cache_config_info``); no ``/metrics`` without;
  - ``itl_s``: seconds between the chunks of a streamed answer (a measured phase that lasts);
  - ``stream_log``: a file that gets one line (the requested tokens) per streamed completion request;
  - ``degenerate``: ``"nul"`` (NUL characters) or ``"repeat"`` (one token repeated) as every generated text
    after the first completion (readiness passes);
  - ``start_delay``: seconds to wait before listening (a server still loading: the fault suite signals it then);
  - ``kill_noise``: what a killed vLLM leaves in its log: a helper process (as multiprocessing's resource
    tracker) prints its ``KeyError: '/psm_...'`` traceback once the server is gone, and a SIGTERM first logs
    "Error in completion stream generator." with a ``CancelledError`` (then the server dies by the signal);
  - ``token_delay``: seconds between streamed chunks (a bench that is still measuring when the fault lands);
    ``GET /fake/generations`` says how many generation requests have arrived (a test awaits the bench's).

An API key (``--api-key K`` or ``VLLM_API_KEY`` in the environment) guards ``/v1`` as vLLM does: 401 without
``Authorization: Bearer K``; ``/health`` stays open.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPEC = json.loads(os.environ.get("FAKE_VLLM", "{}"))
ARGS = sys.argv[1:]

#: The crash ``die_above_tokens`` prints by default: the shape of vLLM 0.26's MSA failure on an H200 (a CUDA illegal
#: memory access raised in MiniMax-M3's sparse attention, then the engine-dead wrappers); not a captured log.
MSA_CRASH_LOG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "fixtures", "smoke", "msa-long-prompt-crash.log"
)


def _arg(flag: str, default: str) -> str:
    return ARGS[ARGS.index(flag) + 1] if flag in ARGS[:-1] else default


def _args(flag: str) -> list[str]:
    """Every value after ``flag`` up to the next flag (``--served-model-name a b``)."""
    if flag not in ARGS:
        return []
    out = []
    for a in ARGS[ARGS.index(flag) + 1 :]:
        if a.startswith("-"):
            break
        out.append(a)
    return out


def _print_file(key: str) -> None:
    if SPEC.get(key):
        with open(SPEC[key]) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()


_print_file("start_log")
# {"corrupt_cache_log": FILE}: a start whose VLLM_CACHE_ROOT holds torch_compile_cache/CORRUPT prints FILE (the
# engine's error reading a compiled artifact back) and exits 1, as vLLM does; a cleared cache starts normally.
if SPEC.get("corrupt_cache_log") and os.path.exists(
    os.path.join(os.environ.get("VLLM_CACHE_ROOT", "/nonexistent"), "torch_compile_cache", "CORRUPT")
):
    _print_file("corrupt_cache_log")
    time.sleep(0.3)
    sys.exit(1)
# {"fail_if": [{"arg": "--speculative-config", "log": FILE, "exit": 1}]}: a start whose command line has ARG prints
# FILE (an engine stack of the component that flag turns on) and exits; a start without it goes on.
for _rule in SPEC.get("fail_if", []):
    if _rule["arg"] in ARGS if "arg" in _rule else _rule["unless"] not in ARGS:
        with open(_rule["log"]) as _f:
            sys.stdout.write(_f.read())
        sys.stdout.flush()
        time.sleep(0.3)
        sys.exit(_rule.get("exit", 1))
# {"signal": N}: the engine is killed by signal N after the start log, with no error of its own (a kill from outside).
if "signal" in SPEC:
    time.sleep(0.3)
    os.kill(os.getpid(), int(SPEC["signal"]))
if "exit" in SPEC:
    time.sleep(0.3)
    sys.exit(SPEC["exit"])

NAMES = _args("--served-model-name") or ["fake"]
MODEL = NAMES[0]
SERVE = SPEC.get("serve", {})
THINK = SERVE.get("think", ["<think>", "</think>"])
state = {"generations": 0}


_TRACKER = """\
import os, sys, time
parent = int(sys.argv[1])
while os.getppid() == parent:
    time.sleep(0.05)
sys.stdout.write(
    "/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear to be 1 "
    "leaked shared_memory objects to clean up at shutdown\\n"
    "Traceback (most recent call last):\\n"
    '  File "/usr/lib/python3.12/multiprocessing/resource_tracker.py", line 239, in main\\n'
    "    cache[rtype].remove(name)\\n"
    "KeyError: '/psm_5f1c9e2a'\\n"
)
sys.stdout.flush()
"""

_STREAM_ERROR = """\
(APIServer pid={pid}) ERROR 11-20 17:00:05 [serving_completion.py:462] Error in completion stream generator.
(APIServer pid={pid}) ERROR 11-20 17:00:05 [serving_completion.py:462] Traceback (most recent call last):
(APIServer pid={pid}) ERROR 11-20 17:00:05 [serving_completion.py:462]   File "/usr/local/lib/python3.12/dist-packages/\
vllm/entrypoints/openai/serving_completion.py", line 380, in completion_stream_generator
(APIServer pid={pid}) ERROR 11-20 17:00:05 [serving_completion.py:462]     async for prompt_idx, res in result_generator:
(APIServer pid={pid}) ERROR 11-20 17:00:05 [serving_completion.py:462] asyncio.exceptions.CancelledError
"""


def _kill_noise() -> None:
    """Start the resource-tracker stand-in and the SIGTERM handler of ``kill_noise``."""
    import signal
    import subprocess

    subprocess.Popen([sys.executable, "-c", _TRACKER, str(os.getpid())], stdout=sys.stdout, stderr=subprocess.STDOUT)

    def on_term(signum, frame):
        sys.stdout.write(_STREAM_ERROR.format(pid=os.getpid()))
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def _crash() -> None:
    if SPEC.get("crash_log"):
        _print_file("crash_log")
    else:
        with open(MSA_CRASH_LOG) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
    os._exit(SERVE.get("crash_code", 134))


#: What ``traceback_on_chat`` logs: the shape of vLLM's log when a tool parser raises inside a request that is
#: still answered 200 (vllm/entrypoints/openai/serving_chat.py logs it with the exception); not a captured log.
CHAT_TRACEBACK = """ERROR 12-06 07:50:01 [serving_chat.py:1012] Error trying to handle streaming tool call.
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/vllm/entrypoints/openai/serving_chat.py", line 1004, in chat_completion_stream_generator
    delta_message = tool_parser.extract_tool_calls_streaming(
  File "/usr/lib/python3/site-packages/vllm/tool_parsers/minimax_m2_tool_parser.py", line 311, in extract_tool_calls_streaming
    args = json.loads(self.current_arguments)
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
"""


def _text(kind: str, n: int = 0) -> str:
    deg = SERVE.get("degenerate")
    if deg and state["generations"] > 1:
        return "\x00" * 8 if deg == "nul" else " the" * 24
    if kind == "tokens":
        return " tok" * n
    return {"completion": " Paris, a city of bridges.", "answer": "4"}.get(kind, kind)


def _answer(question: str) -> str:
    m = re.search(r"What is (\d+)\s*\+\s*(\d+)", question)
    if not m:
        return "Red."
    total = int(m.group(1)) + int(m.group(2))
    return _text(str(total + 1 if SERVE.get("wrong_answer") else total))


def _prompt_tokens(req: dict) -> int:
    if "messages" in req:
        return sum(len(str(m.get("content") or "").split()) for m in req["messages"]) + 4
    p = req.get("prompt") or ""
    return len((p if isinstance(p, str) else " ".join(map(str, p))).split())


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

    def do_GET(self):
        if self._refused():
            return
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/fake/generations":
            self._send(200, {"generations": state["generations"]})
        elif self.path == "/v1/models":
            extra = {"max_model_len": SERVE["max_model_len"]} if "max_model_len" in SERVE else {}
            self._send(200, {"object": "list", "data": [{"id": n, "object": "model", **extra} for n in NAMES]})
        elif self.path == "/metrics" and "block_size" in SERVE:
            body = (
                f'vllm:cache_config_info{{block_size="{SERVE["block_size"]}",cache_dtype="auto",engine="0"}} 1.0\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._send(404, {})

    def _generation(self, req: dict) -> None:
        state["generations"] += 1
        if "crash_after" in SERVE and state["generations"] > SERVE["crash_after"]:
            _crash()
        if "die_above_tokens" in SERVE and _prompt_tokens(req) > SERVE["die_above_tokens"]:
            _crash()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self._refused():
            return
        if self.path == "/tokenize":
            if SERVE.get("tokenize", True):
                self._send(200, {"count": _prompt_tokens(req), "max_model_len": SERVE.get("max_model_len", 4096)})
            else:
                self._send(404, {"detail": "Not Found"})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, {})
            return
        self._generation(req)
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        pt = _prompt_tokens(req)
        if self.path == "/v1/completions" and req.get("stream"):  # bench: one token per chunk, then usage
            if SERVE.get("stream_log"):  # a bench's request arrived (a test awaits the measured phase)
                with open(SERVE["stream_log"], "a") as f:
                    f.write(f"{n}\n")
            self._sse(
                [
                    {
                        "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}],
                        **(
                            {"usage": {"prompt_tokens": pt, "completion_tokens": i + 1, "total_tokens": pt + i + 1}}
                            if (req.get("stream_options") or {}).get("continuous_usage_stats")
                            else {}
                        ),
                    }
                    for i in range(n)
                ]
                + (
                    [{"choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}}]
                    if (req.get("stream_options") or {}).get("include_usage")
                    else []
                )
            )
            return
        if self.path == "/v1/completions":
            text = _text("tokens", n) if req.get("ignore_eos") else _text("completion")
            done = n if req.get("ignore_eos") else min(n, len(text.split()))
            self._send(
                200,
                {
                    "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": pt, "completion_tokens": done, "total_tokens": pt + done},
                },
            )
            return
        if SERVE.get("traceback_on_chat"):
            sys.stdout.write(CHAT_TRACEBACK)
            sys.stdout.flush()
        question = " ".join(str(m.get("content") or "") for m in req.get("messages") or [])
        msg: dict = {
            "role": "assistant",
            "content": _answer(question),
            "reasoning_content": "2 plus 2 is 4.",
            "tool_calls": [],
        }
        if req.get("tools"):
            msg["reasoning_content"] = None
            if SERVE.get("raw_tool_calls"):
                msg["content"] = (
                    '<minimax:tool_call>\n<invoke name="get_weather">\n'
                    '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>'
                )
            else:
                msg["content"] = None
                msg["tool_calls"] = [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ]
        elif SERVE.get("reasoning_in_content"):
            msg["content"] = f"{THINK[0]}\n2 plus 2 is 4.\n{THINK[1]}\n\n" + _answer(question)
            msg["reasoning_content"] = None
        if not req.get("stream"):
            self._send(
                200,
                {
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": pt, "completion_tokens": 8, "total_tokens": pt + 8},
                },
            )
            return
        deltas = [{"reasoning_content": msg["reasoning_content"]}] if msg.get("reasoning_content") else []
        if msg["tool_calls"]:
            fn = msg["tool_calls"][0]["function"]
            second = 1 if SERVE.get("split_tool_call") else 0  # the arguments under another index, no name
            deltas += [
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_0",
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                },
                {"tool_calls": [{"index": second, "function": {"arguments": fn["arguments"]}}]},
            ]
        else:
            deltas.append({"content": msg["content"]})
        chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        if SERVE.get("error_event"):  # the first chunk, then the error as an event: the status stays 200
            chunks = chunks[:1] + [
                {"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError", "code": 500}}
            ]
        else:
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self._sse(chunks)

    def _sse(self, chunks: list[dict]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i, chunk in enumerate(chunks):
            if i and SERVE.get("itl_s"):  # a slow stream: the time between tokens
                self.wfile.flush()
                time.sleep(SERVE["itl_s"])
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if SERVE.get("token_delay"):
                self.wfile.flush()
                time.sleep(float(SERVE["token_delay"]))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


if SERVE.get("kill_noise"):
    _kill_noise()
time.sleep(float(SERVE.get("start_delay", 0)))
ThreadingHTTPServer(("127.0.0.1", int(_arg("--port", "8000"))), Handler).serve_forever()
