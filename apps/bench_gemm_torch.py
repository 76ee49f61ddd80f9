#!/usr/bin/python3
"""bf16 GEMM: clustr's cpu::gemm_bf16 against torch.matmul on bf16 tensors (oneDNN), interleaved.

The shapes of apps/bench_gemm (--shapes transformer | square | all). For each round, our
benchmark runs every shape (build/apps/bench_gemm --precision bf16, one sample per shape, its
own process), then PyTorch runs the same shapes in a fresh process, so that both see the same
host load; the ratio of each round is ours / PyTorch's GFLOP/s, and the table gives the medians
over the rounds. Ours returns float32 C; torch.matmul on bf16 tensors returns bf16 C.

Run with Debian's python3-torch (1.13):
  /usr/bin/python3 apps/bench_gemm_torch.py --binary build/apps/bench_gemm
Both processes get OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive; PyTorch uses
torch.set_num_threads(t) for each thread count t.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_common import (  # noqa: E402
    add_output_args, check_output, child_env, run_worker)


def cases(which):
    """(group, M, K, N, layout) in bench_gemm's order."""
    out = []
    if which in ("all", "square"):
        out += [("square", n, n, n, "NN") for n in (256, 512, 1024, 2048)]
    if which in ("all", "transformer"):
        for m, k, n in ((4096, 192, 576), (4096, 192, 768), (4096, 768, 192)):
            out += [("transformer", m, k, n, lay) for lay in ("NT", "NN", "TN")]
    return out


def torch_worker(args):
    """Every case at one thread count in this (fresh) process: a JSON line of GFLOP/s."""
    import torch

    torch.set_num_threads(args.threads[0])
    torch.manual_seed(0)
    result = {}
    for group, m, k, n, lay in cases(args.shapes):
        # Stored shapes as in bench_gemm: A is M x K (K x M when transposed), B K x N (N x K).
        a = torch.rand(k, m) if lay[0] == "T" else torch.rand(m, k)
        b = torch.rand(n, k) if lay[1] == "T" else torch.rand(k, n)
        a = (a * 2 - 1).to(torch.bfloat16)
        b = (b * 2 - 1).to(torch.bfloat16)
        opa = a.t() if lay[0] == "T" else a
        opb = b.t() if lay[1] == "T" else b
        flops = 2.0 * m * n * k

        def sample(iters):
            torch.matmul(opa, opb)
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.matmul(opa, opb)
            return flops * iters / (time.perf_counter() - t0) * 1e-9

        one = flops / sample(3) * 1e-9
        iters = max(1, int(args.sample_ms * 1e-3 / one))
        time.sleep(args.pause_ms * 1e-3)
        result[f"{m}x{k}x{n}:{lay}"] = sample(iters)
    print(json.dumps({"gflops": result, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


def run_ours(args, threads):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.csv")
        cmd = [args.binary, "--precision", "bf16", "--operands", args.operands, "--shapes",
               args.shapes, "--threads", str(threads), "--reps", "1", "--sample-ms",
               str(args.sample_ms), "--pause-ms", str(args.pause_ms), "--csv", path]
        if args.kernel:
            cmd += ["--kernel", args.kernel]
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(path) as f:
            rows = list(csv.DictReader(f))
    kernel = rows[0]["kernel"]
    return kernel, {f"{r['M']}x{r['K']}x{r['N']}:{r['layout']}": float(r["ours_median"])
                    for r in rows}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/bench_gemm")
    p.add_argument("--shapes", default="transformer", choices=["all", "square", "transformer"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="alternations ours/PyTorch")
    p.add_argument("--sample-ms", type=float, default=40)
    p.add_argument("--pause-ms", type=float, default=50)
    p.add_argument("--operands", default="bf16", choices=["bf16", "f32"],
                   help="our operands: bf16, or float32 rounded as packed")
    p.add_argument("--kernel", default="", help="our bf16 kernel (default: the best)")
    add_output_args(p, "bench_gemm_torch.csv")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return torch_worker(args)
    check_output(args)

    rows = []
    for t in args.threads:
        ours, theirs, kernel = {}, {}, ""
        for _ in range(args.rounds):
            kernel, o = run_ours(args, t)
            th = run_worker(__file__, ["--worker", "--threads", t, "--shapes", args.shapes,
                                       "--sample-ms", args.sample_ms, "--pause-ms",
                                       args.pause_ms])["gflops"]
            for key in o:
                ours.setdefault(key, []).append(o[key])
                theirs.setdefault(key, []).append(th[key])
        print(f"\n{t} thread(s), ours: {kernel} kernel, {args.operands} operands; "
              f"medians of {args.rounds} interleaved rounds")
        print(f"{'M x K x N':>16} {'op':>3} | {'ours GFLOP/s':>12} {'torch GFLOP/s':>13} "
              f"{'ratio':>6} | {'load':>5}")
        for key in ours:
            dims, lay = key.split(":")
            ratios = [a / b for a, b in zip(ours[key], theirs[key])]
            o, th, r = (statistics.median(ours[key]), statistics.median(theirs[key]),
                        statistics.median(ratios))
            load = os.getloadavg()[0]
            print(f"{dims:>16} {lay:>3} | {o:12.1f} {th:13.1f} {r:6.2f} | {load:5.2f}", flush=True)
            rows.append({"shape": dims, "layout": lay, "threads": t, "kernel": kernel,
                         "operands": args.operands, "ours_gflops": o, "torch_gflops": th,
                         "ratio": r, "load": load})
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
