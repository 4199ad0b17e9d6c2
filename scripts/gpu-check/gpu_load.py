#!/usr/bin/env python3
"""GPU load for scripts/gpu-check/run.sh (needs PyTorch with CUDA).

`upstream --port P --mib M --duty D`: a stand-in inference server. It listens
on 127.0.0.1:P (so vacancyd finds its PID through the listening socket), holds
M MiB of GPU memory and keeps the GPU busy D of the time; it answers every GET
with a model list and every POST with a chat completion, after 10 s when the
body names the model "slow".

With `--runner`, the server itself never touches the GPU: like Ollama, it
starts a runner process that holds the memory and computes.

`owner --mib M --duty D`: the owner's own GPU work: M MiB held and the GPU busy
D of the time, until killed.

Each prints one line "ready pid=<pid>" once its memory is held and the work runs.
"""

import argparse
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import torch


def hold(mib: int) -> torch.Tensor:
    return torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")


def burn(duty: float) -> None:
    """Matrix products for `duty` of the time, forever."""
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    while True:
        start = time.monotonic()
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        busy = time.monotonic() - start
        if duty < 1.0:
            time.sleep(busy * (1.0 - duty) / duty)


class Handler(http.server.BaseHTTPRequestHandler):
    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._reply({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if b'"slow"' in body:
            time.sleep(10)  # a generation that takes a while
        self._reply(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["upstream", "owner"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--duty", type=float, default=0.5)
    p.add_argument("--runner", action="store_true")
    args = p.parse_args()
    if args.role == "upstream" and args.runner:
        runner = subprocess.Popen(
            [sys.executable, "-u", __file__, "owner", "--mib", str(args.mib), "--duty", str(args.duty)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert runner.stdout is not None
        print(f"runner {runner.stdout.readline().strip()}", flush=True)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        print(f"ready pid={os.getpid()}", flush=True)
        server.serve_forever()
        return
    memory = hold(args.mib)
    threading.Thread(target=burn, args=(args.duty,), daemon=True).start()
    torch.cuda.synchronize()
    if args.role == "upstream":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        print(f"ready pid={os.getpid()}", flush=True)
        server.serve_forever()
    else:
        print(f"ready pid={os.getpid()}", flush=True)
        while True:
            time.sleep(3600)
    del memory


if __name__ == "__main__":
    main()
