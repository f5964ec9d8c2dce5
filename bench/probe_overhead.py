"""The probe's own client-side cost, against the real rig.

For each protocol (gRPC stream, HTTP generate_stream) at concurrency 1 and 32: TTFT overhead
= measured TTFT - configured TTFT (p50, p99), the same against the time the model recorded it
sent the first token (transport + client only), and this process's CPU time per request.

    .venv/bin/python -m bench.probe_overhead [--requests 200] [--ttft-ms 40]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from tritonwatch.collector.probes.runner import ProbeRunner
from tritonwatch.collector.probes.stats import percentile
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.probes import ProbeConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    with TritonRig() as rig:
        rig.control(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms)
        print(f"configured ttft {args.ttft_ms} ms, itl {args.itl_ms} ms, "
              f"{args.max_tokens} tokens, {args.requests} requests per row")
        print(f"{'protocol':8} {'conc':>4} {'p50 ovh':>8} {'p99 ovh':>8} "
              f"{'p50 vs model':>12} {'p99 vs model':>12} {'CPU/req':>9}")
        for protocol in ("grpc", "http"):
            for conc in (1, 32):
                url = rig.grpc_url if protocol == "grpc" else rig.http_url
                cfg = ProbeConfig(name=f"bench-{protocol}", url=url, protocol=protocol,
                                  model="fake_llm", max_tokens=args.max_tokens,
                                  concurrency=conc, warmup=2, timeout=30, interval=60)
                runner = ProbeRunner(cfg, url)
                runner.run(conc * 2)  # open and warm every connection first
                rig.clear_response_log()
                cpu0 = time.process_time()
                results = runner.run(args.requests)
                cpu = time.process_time() - cpu0
                runner.close()
                first: dict[str, int] = defaultdict(lambda: 1 << 62)
                for e in rig.response_log():
                    if not e["final"]:
                        first[e["request_id"]] = min(first[e["request_id"]], e["t_ns"])
                ok = [r for r in results if r.ok and r.ttft_s is not None]
                ovh = sorted(r.ttft_s * 1e3 - args.ttft_ms for r in ok if r.ttft_s)
                vs_model = sorted(
                    (r.t0_ns + r.ttft_s * 1e9 - first[r.request_id]) / 1e6
                    for r in ok if r.ttft_s and r.request_id in first
                )
                print(f"{protocol:8} {conc:>4} {percentile(ovh, 50):>7.2f}ms "
                      f"{percentile(ovh, 99):>7.2f}ms {percentile(vs_model, 50):>10.3f}ms "
                      f"{percentile(vs_model, 99):>10.3f}ms {cpu / len(results) * 1e3:>7.2f}ms"
                      + (f"  ({len(results) - len(ok)} errors)" if len(ok) < len(results) else ""))


if __name__ == "__main__":
    main()
