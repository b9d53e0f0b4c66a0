"""Serve the reference runtime over an OpenAI-compatible HTTP API, traced and metered.

Examples:
  specaudit serve --port 8000 --out traces/
  specaudit serve --algo tree --budget 15 --concurrency 16 --out traces/
  specaudit serve --inject commit-counter --out traces/      # watch the alert fire
  specaudit serve --out traces/ --baseline-tps 240 --cost-factor 1.4   # estimate gauge
  specaudit serve --target hf:./Qwen2.5-0.5B --drafter skip:12 --out traces/  # a local checkpoint
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 specaudit serve --out traces/

Then:
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "specaudit-bytegpt", "prompt": "def add(a, b):", "max_tokens": 64}'
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 64}'
  curl -s localhost:8000/metrics | grep specaudit_
  python scripts/load.py --url http://127.0.0.1:8000 --concurrency 32 --requests 128

Endpoints: POST /v1/completions and /v1/chat/completions (stream or not, with usage and
vLLM's per-request `metrics.speculative_decoding` block), GET /v1/models, /health,
/metrics (Prometheus) on one port (FastAPI on uvicorn), bound to 127.0.0.1 unless --host
says otherwise. Errors are OpenAI-shaped JSON for every status.
Requests join and leave the running batch between verify steps (continuous batching;
--concurrency slots, the rest wait in a queue of --max-queue). Every request is traced
into --out like `specaudit run` (its own run_id=<id>/ partition); the manifest's
`reported` counters are written when the server stops (Ctrl-C or SIGTERM): new requests
get 503, running and queued ones may finish for --drain-seconds, the rest end with
finish_reason abort.

OpenTelemetry: --otel (or any OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT in the
environment) exports a span per request and per verify step, configured by the
standard OTEL_* variables; OTLP needs `pip install 'specaudit[otlp]'`.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading

from specaudit.cli_vocab import hidden_alias
from specaudit.runtime.options import add_runtime_arguments, apply_host_options, model_kwargs, resolve_topk

HELP = "serve the runtime over an OpenAI-compatible API (completions, chat) with /metrics and OTel spans"
ORDER = 30
EXTRA = "serve"   # FastAPI, uvicorn and torch: pip install specaudit[serve] (specaudit/commands/_extras.py)


def add_arguments(p) -> None:
    add_runtime_arguments(p)
    p.set_defaults(concurrency=8)
    for a in p._actions:  # the runtime group's help says "default 1"; a server batches more
        if a.dest == "concurrency":
            a.help = "cache slots: requests verified per batched forward; more wait in the queue (default 8)"
        if a.dest == "max_new_tokens":
            a.help = "largest max_tokens a request may ask for (default 256)"
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    g.add_argument("--out", dest="trace_dir", metavar="DIR", help="dataset folder the run's trace goes into "
                                                                  "(required)")
    hidden_alias(g, "--trace-dir", "trace_dir")                       # old spelling, one release
    g.add_argument("--run-id", help="run id (default: serve- + config + timestamp)")
    g.add_argument("--max-queue", type=int, default=256, help="requests that may wait for a slot (default 256)")
    g.add_argument("--flush-seconds", type=float, default=5.0, help="flush step rows every S seconds (default 5)")
    g.add_argument("--log-requests", action="store_true", help="log every HTTP request on stderr")
    g.add_argument("--drain-seconds", type=float, default=30.0,
                   help="on SIGTERM / Ctrl-C, let running requests finish for up to S seconds (default 30)")
    g.add_argument("--per-request-spec-metrics", choices=("none", "summary", "detailed"), default="summary",
                   help="vLLM's per-request `metrics.speculative_decoding` block in every response, from the "
                        "runtime's own counters; detailed adds per-step arrays (default summary)")
    o = p.add_argument_group("OpenTelemetry")
    o.add_argument("--otel", action="store_true",
                   help="export spans (also on when OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT is set)")
    o.add_argument("--otel-sample-ratio", type=float, default=1.0, help="share of requests traced (default 1)")
    e = p.add_argument_group("estimated commit length (the specaudit_estimated_commit_length gauge)")
    e.add_argument("--baseline-tps", type=float, help="plain greedy tokens/s per request at the serving concurrency")
    e.add_argument("--cost-factor", type=float, help="step cost r = (t_draft + t_verify) / t_plain_step")
    e.add_argument("--cost-factor-std", type=float, help="its standard deviation (default 10%% of r)")
    hidden_alias(e, "--calibration", "calibration")                   # old spelling, one release
    e.add_argument("--profile", dest="calibration", metavar="FILE",
                   help="cost profile from `specaudit calibrate` (r per N, c; its t_ar gives the baseline "
                        "when --baseline-tps is absent)")
    e.add_argument("--estimate-window", type=float, default=30.0,
                   help="seconds of throughput per estimate (default 30)")


def main(args) -> int:
    from specaudit.serve.server import SpecServer
    from specaudit.trace.otel_sink import env_requests_otel

    logging.basicConfig(level=logging.INFO, format="specaudit serve: %(message)s", stream=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("specaudit.serve").warning(
            "binding %s: the API has no authentication; anyone who reaches this port can use it", args.host)
    if not getattr(args, "trace_dir", None):
        raise ValueError("--out DIR is required (the dataset folder the trace goes into)")
    apply_host_options(args)
    if (args.cost_factor is None) != (args.baseline_tps is None) and args.calibration is None:
        raise ValueError("--baseline-tps and --cost-factor go together (or give --profile FILE)")
    srv = SpecServer(trace_dir=args.trace_dir, algo=args.algo, budget=args.budget, topk=resolve_topk(args),
                     concurrency=args.concurrency, max_new_tokens=args.max_new_tokens, inject=args.inject,
                     seed=args.seed, device=args.device, dtype=args.dtype, eos_id=args.eos_id, run_id=args.run_id,
                     host=args.host, port=args.port, otel=True if (args.otel or env_requests_otel()) else None,
                     otel_ratio=args.otel_sample_ratio, baseline_tps=args.baseline_tps,
                     cost_factor=args.cost_factor, cost_factor_std=args.cost_factor_std,
                     calibration=args.calibration, estimate_window_s=args.estimate_window,
                     max_queue=args.max_queue, log_requests=args.log_requests, flush_s=args.flush_seconds,
                     spec_metrics=args.per_request_spec_metrics, **model_kwargs(args))
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    srv.start()
    print(f"specaudit serve: listening on {srv.url} (model {srv.model}, {args.algo} budget {args.budget}, "
          f"{args.concurrency} slots{', fault ' + args.inject if args.inject else ''}); trace {srv.run_dir}",
          file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    print(f"specaudit serve: stopping; draining for up to {args.drain_seconds:g} s", file=sys.stderr, flush=True)
    m = srv.close(drain_s=args.drain_seconds)
    rep = m.get("reported") or {}
    print(f"specaudit serve: stopped; {rep.get('verify_steps', 0)} steps, {rep.get('generated_tokens', 0)} tokens, "
          f"mean commit length {rep.get('mean_commit_len', 0.0):.2f}; trace {srv.run_dir}", file=sys.stderr, flush=True)
    return 0
