#!/usr/bin/env python3
"""Run llama.cpp's native HTTP server (llama-server's own code, in-process) through
the PyPI wheel `xllamacpp` (prebuilt, portable CPU build).

Blocks until SIGTERM or SIGINT, then exits 0. It also exits when its parent dies
(the test binary was killed), so a crashed test run leaves no server behind.

usage: llama_server.py MODEL.gguf [--host 127.0.0.1] [--port 8080] [--ctx 1024]
                       [--parallel 1] [--threads 2] [--alias NAME] [--no-slots]
                       [--api-key KEY] [--api-prefix /PREFIX]
                       [--sleep-idle-seconds SECONDS]

Each option sets the llama-server option of the same name (xllamacpp's
CommonParams field in brackets): --alias (model_alias), --api-key (api_keys),
--api-prefix (api_prefix), --sleep-idle-seconds (sleep_idle_seconds).
"""
import argparse
import os
import signal
import sys
import threading

import xllamacpp as xlc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--alias", default=None)
    ap.add_argument("--no-slots", action="store_true",
                    help="disable the /slots endpoint (as a server started without --slots)")
    ap.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' on every non-public endpoint")
    ap.add_argument("--api-prefix", default=None,
                    help="serve every endpoint under this path prefix, e.g. /llm")
    ap.add_argument("--sleep-idle-seconds", type=int, default=None,
                    help="unload the model after this many idle seconds (sleeping state)")
    a = ap.parse_args()

    parent = os.getppid()
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())

    p = xlc.CommonParams()
    p.model.path = a.model
    p.n_ctx = a.ctx
    p.n_parallel = a.parallel
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    if hasattr(p, "hostnames"):
        p.hostnames = [a.host]
    p.port = a.port
    p.endpoint_metrics = True
    p.endpoint_slots = not a.no_slots
    p.endpoint_props = True
    if a.alias:
        p.model_alias = {a.alias}
    if a.api_key:
        p.api_keys = [a.api_key]
    if a.api_prefix:
        p.api_prefix = a.api_prefix
    if a.sleep_idle_seconds is not None:
        p.sleep_idle_seconds = a.sleep_idle_seconds

    srv = xlc.Server(p)
    print("listening on", srv.listening_address, flush=True)

    # Wake once a second to notice an orphaning (parent gone: getppid() changes).
    while not done.wait(1.0):
        if os.getppid() != parent:
            print("parent %d is gone; exiting" % parent, flush=True)
            break
    print("stopping", flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown: the server threads live in native code.
    os._exit(0)


if __name__ == "__main__":
    main()
