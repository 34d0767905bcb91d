"""A scripted OpenAI-compatible chat server for tests: a real HTTP/1.1 server on 127.0.0.1.

It stands in for SGLang, which needs a GPU. Replies are deterministic functions of the last user
turn (`expected_reply`), so a test can check that every completion is whole. A `Script` sets the
misbehaviour: slow replies, HTTP 500 or a dropped connection (no response at all) for the first
attempts of each prompt, 400 for prompts holding a marker, `/health` answering 503 for a while,
where the reasoning goes (`reasoning_content`, inline `<think>` in the content, or nowhere), and the
speculative-decoding counters `/get_server_info` reports (none: 404, as a server without them).

In-process: `with ScriptedOpenAIServer(Script(...)) as server: server.url`.
As a process (what a plan's server command launches): `python tests/openai_server.py --port N`;
it prints `CUDA_VISIBLE_DEVICES=<value>` first, so tests can check the launcher set it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

MODEL_NAME = "scripted-target"


@dataclass
class Script:
    delay_s: float = 0.0  # each reply waits this long (+ up to `jitter_s`)
    jitter_s: float = 0.0
    fail_first: int = 0  # per prompt: the first N attempts answer HTTP 500
    drop_first: int = 0  # per prompt: the next N attempts close the connection without a reply
    reasoning: Literal["field", "inline", "none"] = "field"
    length_every: int = 0  # every k-th distinct prompt finishes with finish_reason="length"
    reject_marker: str | None = None  # prompts whose last user turn holds this get HTTP 400
    health_failures: int = 0  # the first N /health calls answer 503
    spec_counters: tuple[int, int] | None = None  # /get_server_info: (accepted tokens, draft-verify cycles)


def last_user(messages: list[dict[str, Any]]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def expected_reply(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(reasoning, answer) the server gives for a prompt."""
    digest = hashlib.sha256(last_user(messages).encode()).hexdigest()[:12]
    return f"Let me think about {digest} step by step.", f"The answer for {digest} is 42."


class ScriptedOpenAIServer:
    def __init__(self, script: Script | None = None, port: int = 0):
        self.script = script or Script()
        self.attempts: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.health_calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self), bind_and_activate=False)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 256
        self.httpd.allow_reuse_address = True
        self.httpd.server_bind()
        self.httpd.server_activate()
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "ScriptedOpenAIServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ScriptedOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ behaviour

    def decide(self, body: dict[str, Any]) -> tuple[str, int]:
        """What to do with one chat request: ("reply"|"fail"|"drop"|"reject", attempt number)."""
        user = last_user(body["messages"])
        with self.lock:
            self.requests.append(body)
            self.attempts[user] += 1
            attempt = self.attempts[user]
        s = self.script
        if s.reject_marker and s.reject_marker in user:
            return "reject", attempt
        if attempt <= s.fail_first:
            return "fail", attempt
        if attempt <= s.fail_first + s.drop_first:
            return "drop", attempt
        return "reply", attempt

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        reasoning, answer = expected_reply(body["messages"])
        thinking = body.get("chat_template_kwargs", {}).get("enable_thinking", True)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if thinking and self.script.reasoning == "field":
            message["reasoning_content"] = reasoning
        elif thinking and self.script.reasoning == "inline":
            message["content"] = f"<think>\n{reasoning}\n</think>\n\n{answer}"
        k = self.script.length_every
        digest = int(hashlib.sha256(last_user(body["messages"]).encode()).hexdigest(), 16)
        finish = "length" if k and digest % k == 0 else "stop"
        completion_tokens = len(message["content"].split()) + len(message.get("reasoning_content", "").split())
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": sum(len(m["content"].split()) for m in body["messages"]),
                      "completion_tokens": completion_tokens},
        }


def _handler(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()  # no Nagle: headers and body go out as separate writes
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: Any) -> None:  # keep test output quiet
            return None

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                with server.lock:
                    server.health_calls += 1
                    starting = server.health_calls <= server.script.health_failures
                self._send(503 if starting else 200, {"ok": not starting})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
            elif self.path == "/get_server_info" and server.script.spec_counters:
                accepted, cycles = server.script.spec_counters
                self._send(200, {"internal_states": [{"avg_spec_accept_length": 9.9,  # a recent window's
                                                      "spec_cumulative_num_accept_tokens": accepted,
                                                      "spec_cumulative_num_forward_ct": cycles}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            action, _ = server.decide(body)
            with server.lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._answer(action, body)
            finally:
                with server.lock:
                    server.in_flight -= 1

        def _answer(self, action: str, body: dict[str, Any]) -> None:
            s = server.script
            if s.delay_s or s.jitter_s:
                time.sleep(s.delay_s + random.uniform(0, s.jitter_s))
            if action == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif action == "fail":
                self._send(500, {"error": {"message": "scripted internal error"}})
            elif action == "reject":
                self._send(400, {"error": {"message": "prompt is longer than the context length"}})
            else:
                self._send(200, server.completion(body))

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--health-failures", type=int, default=0)
    args = parser.parse_args()
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    server = ScriptedOpenAIServer(Script(delay_s=args.delay_s, health_failures=args.health_failures), args.port)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
