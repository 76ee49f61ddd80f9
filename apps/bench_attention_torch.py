#!/usr/bin/python3
"""Full attention, forward + backward: clustr's fused op against PyTorch's plain composition.

For each sequence length N, in turn: our benchmark (apps/bench_attention, one N, in its own
process), then PyTorch's softmax(Q K^T / sqrt(E)) V with autograd (also in a fresh process),
so that both see the same host load. Batch 1, 6 heads x 64 dims by default (the paper's
supplementary C.1 setting). Prints microseconds per sequence element (time of one forward +
backward / N), their ratio, and the peak extra memory of each; writes a CSV.

Memory, the same way on both sides: the growth of the process's peak resident set over the
first forward + backward (VmHWM after it minus VmRSS before it; the peak is reset through
/proc/self/clear_refs first), in a process that has just made its inputs. Python's tracemalloc
does not see torch's allocations, hence the resident set. Ours also prints the bytes of tensor
storage it counts itself (bench_attention's "tensor" column).

Run with Debian's python3-torch (1.13):
  /usr/bin/python3 apps/bench_attention_torch.py --binary build/apps/bench_attention \
      --n 512 1024 2048 4096 8192 --ours-only 16384
The environment of both processes gets OPENBLAS_CORETYPE=SkylakeX (OpenBLAS misdetects this
CPU otherwise) and OMP_WAIT_POLICY=passive; PyTorch uses torch.set_num_threads(--threads).
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_common import (  # noqa: E402
    add_output_args, check_output, child_env, run_worker)


def proc_status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def torch_worker(args):
    """One N in this (fresh) process: prints a JSON line with the timings and the memory."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.worker, args.dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape)
    scale = 1.0 / math.sqrt(args.dim)

    def step():
        a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
        out = torch.matmul(a, v)
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    rss0 = proc_status_bytes("VmRSS")
    rss_ok = reset_peak_rss()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    hwm = proc_status_bytes("VmHWM")
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"N": args.worker, "seconds_median": times[len(times) // 2],
                      "seconds_min": times[0], "seconds_first": first,
                      "rss_peak_bytes": hwm - rss0 if rss_ok else -1,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


def run_ours(args, n):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.csv")
        cmd = [args.binary, "--n", str(n), "--reps", str(args.reps), "--threads",
               str(args.threads), "--heads", str(args.heads), "--dim", str(args.dim),
               "--batch", str(args.batch), "--csv", path]
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(path) as f:
            row = next(csv.DictReader(f))
    return {"seconds_median": float(row["seconds_median"]),
            "rss_peak_bytes": int(row["rss_peak_bytes"]),
            "tensor_peak_bytes": int(row["tensor_peak_bytes"])}


def run_torch(args, n):
    return run_worker(__file__, ["--worker", n, "--reps", args.reps, "--threads", args.threads,
                                 "--heads", args.heads, "--dim", args.dim, "--batch", args.batch])


def load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/bench_attention")
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--ours-only", type=int, nargs="*", default=[16384],
                   help="lengths to run for clustr alone (too large for PyTorch here)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per N and side (median)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternations ours/PyTorch per N (the median over rounds is reported)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    add_output_args(p, "bench_attention_torch.csv")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return torch_worker(args)
    check_output(args)

    print(f"full attention forward + backward, B={args.batch}, H={args.heads}, "
          f"E=M={args.dim}, {args.threads} threads, median of {args.reps} runs, "
          f"{args.rounds} round(s) per N")
    head = (f"{'N':>6} | {'ours us/el':>10} {'torch us/el':>11} {'speedup':>7} | "
            f"{'ours MB':>8} {'torch MB':>9} {'ours KB/el':>10} {'torch KB/el':>11} "
            f"{'mem ratio':>9} {'torch B/N^2':>11} | {'load':>5}")
    print(head)
    rows = []
    median = statistics.median
    for n in list(args.n) + list(args.ours_only):
        with_torch = n in args.n
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(run_ours(args, n))
            if with_torch:
                theirs.append(run_torch(args, n))
        o_t = median([r["seconds_median"] for r in ours]) / n * 1e6
        o_m = median([r["rss_peak_bytes"] for r in ours])
        row = {"N": n, "ours_us_per_element": o_t, "ours_rss_peak_bytes": o_m,
               "ours_tensor_peak_bytes": median([r["tensor_peak_bytes"] for r in ours])}
        line = f"{n:6d} | {o_t:10.2f} "
        if with_torch:
            t_t = median([r["seconds_median"] for r in theirs]) / n * 1e6
            t_m = median([r["rss_peak_bytes"] for r in theirs])
            row.update({"torch_us_per_element": t_t, "torch_rss_peak_bytes": t_m,
                        "speedup": t_t / o_t, "memory_ratio": t_m / max(o_m, 1)})
            line += (f"{t_t:11.2f} {t_t / o_t:7.2f} | {o_m / 2**20:8.1f} {t_m / 2**20:9.1f} "
                     f"{o_m / n / 1024:10.1f} {t_m / n / 1024:11.1f} {t_m / max(o_m, 1):9.1f} "
                     f"{t_m / n / n:11.1f}")
        else:
            line += f"{'-':>11} {'-':>7} | {o_m / 2**20:8.1f} {'-':>9} {o_m / n / 1024:10.1f}"
        row["load"] = load()
        print(line + f" | {row['load']:5.2f}", flush=True)
        rows.append(row)
    keys = ["N", "ours_us_per_element", "torch_us_per_element", "speedup",
            "ours_rss_peak_bytes", "ours_tensor_peak_bytes", "torch_rss_peak_bytes",
            "memory_ratio", "load"]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
