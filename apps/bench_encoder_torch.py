#!/usr/bin/python3
"""Encoder layer, forward + backward: clustr's EncoderLayer against torch.nn.TransformerEncoderLayer.

The copy-task model's layer (d_model 192, 6 heads, feed-forward 768, ReLU, post-norm, dropout 0,
batch_first), input requiring grad. For each B x N shape, in turn: our benchmark
(apps/bench_encoder, that shape only, its own process), then PyTorch's layer in a fresh
process, so both see the same host load. Prints microseconds per token (one step / (B * N)) and
the ratio torch / ours (> 1: ours is faster); writes a CSV.

--precision bf16: ours with bf16 products (bench_encoder --precision bf16), PyTorch's layer
under torch.autocast("cpu", dtype=torch.bfloat16) (forward and backward inside it).

Run with Debian's python3-torch (1.13):
  /usr/bin/python3 apps/bench_encoder_torch.py --binary build/apps/bench_encoder
Both processes get OPENBLAS_CORETYPE=SkylakeX (OpenBLAS misdetects this CPU otherwise) and
OMP_WAIT_POLICY=passive (PyTorch's threads otherwise busy-wait against OpenBLAS's); PyTorch
uses torch.set_num_threads(--threads).
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

SHAPES = ["32x64", "32x128", "32x256", "32x512", "4x1024", "4x2048", "4x4096"]


def torch_worker(args):
    """One shape in this (fresh) process: prints a JSON line with the per-token times."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, n = (int(v) for v in args.worker.split("x"))
    layer = torch.nn.TransformerEncoderLayer(d_model=args.dim, nhead=args.heads,
                                             dim_feedforward=args.hidden, dropout=0.0,
                                             batch_first=True)
    x = torch.randn(b, n, args.dim, requires_grad=True)
    dout = torch.randn(b, n, args.dim)

    def step():
        if args.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
            y.backward(dout.to(y.dtype))
        else:
            layer(x).backward(dout)
        layer.zero_grad(set_to_none=True)
        x.grad = None

    step()
    us = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        us.append((time.perf_counter() - t0) * 1e6 / (b * n))
    us.sort()
    print(json.dumps({"us_median": us[len(us) // 2], "us_min": us[0],
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


def run_ours(args, shape):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.csv")
        cmd = [args.binary, "--shapes", shape, "--reps", str(args.reps), "--threads",
               str(args.threads), "--dim", str(args.dim), "--heads", str(args.heads),
               "--hidden", str(args.hidden), "--precision", args.precision, "--csv", path]
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(path) as f:
            row = next(csv.DictReader(f))
    return float(row["us_per_token_median"])


def run_torch(args, shape):
    return run_worker(__file__, ["--worker", shape, "--reps", args.reps, "--threads",
                                 args.threads, "--dim", args.dim, "--heads", args.heads,
                                 "--hidden", args.hidden, "--precision",
                                 args.precision])["us_median"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/bench_encoder")
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--reps", type=int, default=5, help="timed steps per shape and side (median)")
    p.add_argument("--rounds", type=int, default=1, help="alternations ours/PyTorch per shape")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: ours with bf16 products, PyTorch under autocast (bfloat16)")
    add_output_args(p, "bench_encoder_torch.csv")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return torch_worker(args)
    check_output(args)

    print(f"encoder layer forward + backward, D={args.dim} H={args.heads} F={args.hidden}, "
          f"{args.threads} threads, {args.precision}, median of {args.reps} steps, "
          f"{args.rounds} round(s)")
    print(f"{'shape':>8} | {'ours us/tok':>11} {'torch us/tok':>12} {'speedup':>7} | {'load':>5}")
    rows = []
    for shape in args.shapes:
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(run_ours(args, shape))
            theirs.append(run_torch(args, shape))
        o, t = statistics.median(ours), statistics.median(theirs)
        load = os.getloadavg()[0]
        print(f"{shape:>8} | {o:11.2f} {t:12.2f} {t / o:7.2f} | {load:5.2f}", flush=True)
        rows.append({"shape": shape, "precision": args.precision, "ours_us_per_token": o,
                     "torch_us_per_token": t, "speedup": t / o, "load": load})
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
