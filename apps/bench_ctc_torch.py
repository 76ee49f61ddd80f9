#!/usr/bin/python3
"""CTC loss, forward + backward: clustr's ctc_loss against torch.nn.functional.ctc_loss.

Random logits of shape T x B x V (T = 800 frames, B = 8, V = 50 classes) with targets of
90..110 labels (spread evenly over the batch, as apps/bench_ctc does), every input full length,
reduction mean. For each thread count, in turn: our benchmark (apps/bench_ctc, its own
process), then PyTorch in a fresh process, so both see the same host load. Prints the median
milliseconds per step and the ratio torch / ours (> 1: ours is faster); writes a CSV.

What is timed is the same work on both sides: clustr's op takes logits and includes the
log-softmax, so the PyTorch step is log_softmax + ctc_loss + backward (PyTorch's ctc_loss takes
log-probabilities (T, B, V); ours takes logits (B, T, V)).

Run with Debian's python3-torch (1.13):
  /usr/bin/python3 apps/bench_ctc_torch.py --binary build/apps/bench_ctc
--device cuda times both on the GPU (the logits in device memory, the lengths and targets built
where each side keeps them, each step synchronised), once per round; --threads is then ignored.
Both processes get OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive (see
bench_torch_common.py); PyTorch uses torch.set_num_threads(threads).
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_common import (  # noqa: E402
    add_output_args, check_output, child_env, run_worker)


def target_lengths(batch, min_labels, max_labels):
    """min..max spread evenly over the batch, rounded as apps/bench_ctc.cpp does."""
    if batch == 1:
        return [min_labels]
    span = max_labels - min_labels
    return [min_labels + (span * b + (batch - 1) // 2) // (batch - 1) for b in range(batch)]


def torch_worker(args):
    """One measurement in this (fresh) process: prints a JSON line with the step times."""
    import json

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    T, B, V = args.frames, args.batch, args.classes
    dev = torch.device(args.device)
    x = torch.randn(T, B, V, device=dev, requires_grad=True)
    lengths = torch.tensor(target_lengths(B, args.min_labels, args.max_labels), device=dev)
    targets = torch.randint(1, V, (int(lengths.sum()),), device=dev)
    input_lengths = torch.full((B,), T, dtype=torch.long, device=dev)

    def step():
        F.ctc_loss(x.log_softmax(2), targets, input_lengths, lengths,
                   reduction="mean").backward()
        x.grad = None
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step()
    ms = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    print(json.dumps({"ms_median": ms[len(ms) // 2], "ms_min": ms[0],
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


def shape_args(args):
    return ["--frames", args.frames, "--batch", args.batch, "--classes", args.classes,
            "--min-labels", args.min_labels, "--max-labels", args.max_labels,
            "--device", args.device]


def run_ours(args, threads):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.csv")
        cmd = [args.binary, "--reps", str(args.reps), "--threads", str(threads), "--csv", path]
        cmd += [str(a) for a in shape_args(args)]
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(path) as f:
            row = next(csv.DictReader(f))
    return float(row["ms_median"])


def run_torch(args, threads):
    return run_worker(__file__, ["--worker", "--reps", args.reps, "--threads", threads]
                      + shape_args(args))["ms_median"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/bench_ctc")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--frames", type=int, default=800)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--classes", type=int, default=50)
    p.add_argument("--min-labels", type=int, default=90)
    p.add_argument("--max-labels", type=int, default=110)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--reps", type=int, default=20, help="timed steps per process (median)")
    p.add_argument("--rounds", type=int, default=3, help="alternations ours/PyTorch per count")
    add_output_args(p, "bench_ctc_torch.csv")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        return torch_worker(args)
    check_output(args)
    if args.device == "cuda":
        args.threads = args.threads[:1]

    print(f"CTC loss forward + backward on {args.device}, T={args.frames} B={args.batch} "
          f"V={args.classes}, "
          f"{args.min_labels}..{args.max_labels} labels, reduction mean; both sides include "
          f"the log-softmax; median of {args.reps} steps, {args.rounds} round(s)")
    print(f"{'threads':>7} | {'ours ms':>8} {'torch ms':>9} {'speedup':>7} | {'load':>5}")
    rows = []
    for threads in args.threads:
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(run_ours(args, threads))
            theirs.append(run_torch(args, threads))
        o, t = statistics.median(ours), statistics.median(theirs)
        load = os.getloadavg()[0]
        print(f"{threads:>7} | {o:8.2f} {t:9.2f} {t / o:7.2f} | {load:5.2f}", flush=True)
        rows.append({"device": args.device, "threads": threads, "ours_ms": o, "torch_ms": t, "speedup": t / o,
                     "load": load})
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
