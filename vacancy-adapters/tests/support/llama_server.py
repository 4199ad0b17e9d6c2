#!/usr/bin/env python3
"""Run llama.cpp's HTTP server in-process through the PyPI wheel `xllamacpp`,
for vacancy-adapters' live tests. Blocks until SIGTERM/SIGINT.

Adapted from the project's shared/upstreams/scripts/xllamacpp_server.py, with
the switches the tests need: --api-key, --api-prefix, --no-slots, --sleep.

usage: llama_server.py MODEL.gguf --port P [--ctx 1024] [--parallel 2]
       [--threads 2] [--alias NAME] [--api-key KEY] [--api-prefix /p]
       [--no-slots] [--sleep SECONDS]
"""
import argparse
import signal
import sys
import threading

import xllamacpp as xlc

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--ctx", type=int, default=1024)
ap.add_argument("--parallel", type=int, default=2)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--alias", default=None)
ap.add_argument("--api-key", default=None)
ap.add_argument("--api-prefix", default=None)
ap.add_argument("--no-slots", action="store_true")
ap.add_argument("--sleep", type=int, default=None)
a = ap.parse_args()

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
if a.sleep:
    p.sleep_idle_seconds = a.sleep
srv = xlc.Server(p)
print("listening on", srv.listening_address, flush=True)
done = threading.Event()
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda *_: done.set())
done.wait()
sys.exit(0)
