#!/usr/bin/python3
"""Full attention, forward + backward: clustr's fused op against PyTorch's.

For each sequence length N, in turn: our benchmark (apps/bench_attention, one N, in its own
process), then PyTorch (also in a fresh process), so that both see the same host load; --rounds
such alternations per N, the median over the rounds is reported. Batch 1, 6 heads x 64 dims by
default (the paper's supplementary C.1 setting); --causal masks both sides. Microseconds per
element are the time of one forward + backward / N (whatever the batch).

--device cpu (the default): PyTorch's plain composition softmax(Q K^T / sqrt(E)) V with
autograd, f32. Prints microseconds per element, their ratio (speedup: torch / ours), and the
peak extra memory of each; writes a CSV. Memory, the same way on both sides: the growth of the
process's peak resident set over the first forward + backward (VmHWM after it minus VmRSS
before it; the peak is reset through /proc/self/clear_refs first), in a process that has just
made its inputs. Python's tracemalloc does not see torch's allocations, hence the resident set.
Ours also prints the bytes of tensor storage it counts itself (bench_attention's "tensor"
column). Run with Debian's python3-torch (1.13):
  /usr/bin/python3 apps/bench_attention_torch.py --binary build/apps/bench_attention \
      --n 512 1024 2048 4096 8192 --ours-only 16384
The environment of both processes gets OPENBLAS_CORETYPE=SkylakeX (OpenBLAS misdetects this
CPU otherwise) and OMP_WAIT_POLICY=passive; PyTorch uses torch.set_num_threads(--threads).

--device cuda: the peer users have on a GPU, torch.nn.functional.scaled_dot_product_attention
(SDPA: a FlashAttention-class kernel where PyTorch has one for the dtype), forward + backward
on CUDA tensors of shape (B, H, N, E), --causal as is_causal, against ours with
`bench_attention --device cuda --precision P`, for each --precision P (fp32 and bf16 by
default): PyTorch's tensors are float32 for fp32, bfloat16 for bf16. For fp32 PyTorch's TF32
settings are left as they are (matmul off by default; recorded as torch_allow_tf32) and ours
runs without --tf32. SDPA timing: --warmup untimed calls (at least 3), then --reps calls, each
timed on its own by a pair of CUDA events after a torch.cuda.synchronize() (so that, as ours
does, each call starts on an idle GPU and no call overlaps the previous one's launches); the
median per call is reported. Ours: its CSV's seconds_median (one untimed run, then --reps runs,
each between two synchronizations, wall clock). Prints for both sides microseconds per element,
TFLOP/s and GB/s, the time ratio ours / SDPA (> 1: ours is slower), and the peak extra device
memory of the first call (ours: its allocator's; SDPA: torch.cuda.max_memory_allocated());
its CSV has a precision column and these figures. TFLOP/s and GB/s are recomputed here with
the definitions of apps/bench_attention.cpp (attention_flops and attention_bytes below match
its full_attention_flops and attention_traffic_bytes): FLOPs 14 B H N^2 E (forward 4 B H N^2 E
for Q K^T and P V, backward 2.5 times that, FlashAttention's count), halved with --causal;
bytes: read Q, K, V, dO, out and logsumexp, write out, logsumexp, dQ, dK and dV at 4 bytes an
element, the size of our f32 tensors. PyTorch's bf16 tensors are 2 bytes an element, so for
SDPA in bf16 the figure counts about twice the bytes it must move: the column compares the
sides' times on the same operands, it is not SDPA's use of the bandwidth. Both modes write the
CSV row by row (a run cut short keeps its finished rows). --ours-only lengths run ours alone
(none by default with cuda). Run on a GPU with PyTorch 2.x (it exits with a message when
PyTorch sees no GPU):
  python3 apps/bench_attention_torch.py --device cuda --binary build-gpu/apps/bench_attention \
      --n 2048 4096 16384 65536 --precision bf16 fp32
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


def attention_flops(b, h, n, e, causal):
    """FLOPs of one full-attention forward + backward, as apps/bench_attention.cpp's
    full_attention_flops counts them: 14 B H N^2 E (FlashAttention's count), halved when
    causal."""
    flops = 14.0 * b * h * n * n * e
    return flops / 2 if causal else flops


def attention_bytes(b, h, n, e):
    """Bytes of the least traffic of one forward + backward, as apps/bench_attention.cpp's
    attention_traffic_bytes counts them: Q, K, V, dO, out (read and written), dQ, dK, dV and
    logsumexp (read and written), 4 bytes an element."""
    rows = float(b) * h * n
    return 4.0 * (9.0 * rows * e + 2.0 * rows)


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
    """One N in this (fresh) process, on the CPU: prints a JSON line with the timings and the
    memory."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.worker, args.dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape)
    scale = 1.0 / math.sqrt(args.dim)
    # --causal: key j > query i masked out.
    future = (torch.ones(args.worker, args.worker, dtype=torch.bool).triu(1)
              if args.causal else None)

    def step():
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if future is not None:
            scores = scores.masked_fill(future, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
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


def sdpa_worker(args):
    """One N and precision in this (fresh) process, on the GPU: scaled_dot_product_attention
    forward + backward; prints a JSON line with the timings, the peak device memory of the first
    call and PyTorch's settings."""
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        sys.exit("bench_attention_torch: --device cuda, but this PyTorch sees no GPU")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    precision = args.precision[0]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    shape = (args.batch, args.heads, args.worker, args.dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    # The peak extra memory of the first call (outputs, saved tensors, gradients, scratch).
    torch.cuda.synchronize()
    live = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - live
    for _ in range(args.warmup - 1):
        step()
    # Each call between its own pair of events, on an idle GPU (as ours: synchronized runs).
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.reps)]
    for start, end in events:
        torch.cuda.synchronize()
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) / 1e3 for start, end in events)
    backends = {name: int(getattr(torch.backends.cuda, name + "_sdp_enabled", lambda: 0)())
                for name in ("flash", "mem_efficient", "math")}
    print(json.dumps({"N": args.worker, "precision": precision,
                      "seconds_median": times[len(times) // 2], "seconds_min": times[0],
                      "peak_bytes": peak, "torch": torch.__version__,
                      "allow_tf32": int(torch.backends.cuda.matmul.allow_tf32),
                      "sdp_enabled": backends, "gpu": torch.cuda.get_device_name()}))


def run_ours(args, n, precision="fp32"):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.csv")
        # --max-full-n n: bench_attention skips full attention above its own default otherwise.
        cmd = [args.binary, "--n", str(n), "--reps", str(args.reps), "--threads",
               str(args.threads), "--heads", str(args.heads), "--dim", str(args.dim),
               "--batch", str(args.batch), "--max-full-n", str(n), "--csv", path]
        if args.device == "cuda":
            cmd += ["--device", "cuda", "--precision", precision]
        if args.causal:
            cmd.append("--causal")
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(path) as f:
            row = next(csv.DictReader(f), None)
    if row is None:
        sys.exit(f"bench_attention_torch: {args.binary} wrote no row for N = {n}")
    return {"seconds_median": float(row["seconds_median"]),
            "rss_peak_bytes": int(row["rss_peak_bytes"]),
            "tensor_peak_bytes": int(row["tensor_peak_bytes"])}


def run_torch(args, n, precision="fp32"):
    return run_worker(__file__, ["--worker", n, "--reps", args.reps, "--threads", args.threads,
                                 "--heads", args.heads, "--dim", args.dim, "--batch", args.batch,
                                 "--device", args.device, "--precision", precision,
                                 "--warmup", args.warmup] + (["--causal"] if args.causal else []))


def load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def lengths(args):
    """The lengths in order, each with whether PyTorch runs it too."""
    return ([(n, True) for n in args.n] +
            [(n, False) for n in args.ours_only if n not in args.n])


def check_cuda_peer():
    """Before any work: a PyTorch with scaled_dot_product_attention that sees a GPU."""
    try:
        import torch
    except ImportError:
        sys.exit("bench_attention_torch: --device cuda needs PyTorch 2.x with CUDA in this "
                 f"python ({sys.executable}); torch is not importable")
    if not torch.cuda.is_available():
        sys.exit(f"bench_attention_torch: --device cuda, but PyTorch {torch.__version__} sees "
                 "no GPU (torch.cuda.is_available() is False)")
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"bench_attention_torch: PyTorch {torch.__version__} has no "
                 "scaled_dot_product_attention (PyTorch 2.0 or later needed)")


def open_csv(args, keys):
    """The CSV, written row by row (a run cut short keeps the rows it finished)."""
    f = open(args.csv, "w", newline="")
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    f.flush()
    return f, w


def main_cpu(args):
    causal = ", causal" if args.causal else ""
    print(f"full attention forward + backward{causal}, B={args.batch}, H={args.heads}, "
          f"E=M={args.dim}, {args.threads} threads, median of {args.reps} runs, "
          f"{args.rounds} round(s) per N")
    head = (f"{'N':>6} | {'ours us/el':>10} {'torch us/el':>11} {'speedup':>7} | "
            f"{'ours MB':>8} {'torch MB':>9} {'ours KB/el':>10} {'torch KB/el':>11} "
            f"{'mem ratio':>9} {'torch B/N^2':>11} | {'load':>5}")
    print(head)
    keys = ["N", "ours_us_per_element", "torch_us_per_element", "speedup",
            "ours_rss_peak_bytes", "ours_tensor_peak_bytes", "torch_rss_peak_bytes",
            "memory_ratio", "load"]
    f, w = open_csv(args, keys)
    median = statistics.median
    for n, with_torch in lengths(args):
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
        w.writerow({k: row.get(k, "") for k in keys})
        f.flush()
    f.close()
    print(f"wrote {args.csv}")


def main_cuda(args):
    b, h, e = args.batch, args.heads, args.dim
    causal = ", causal" if args.causal else ""
    print(f"full attention forward + backward{causal} on the GPU: ours against "
          f"scaled_dot_product_attention, B={b}, H={h}, E=M={e}, median of {args.reps} calls "
          f"(SDPA: after {args.warmup}), {args.rounds} round(s) per N; us/el = time / N, "
          f"ratio = ours / SDPA time")
    keys = ["N", "B", "H", "E", "causal", "device", "precision", "ours_us_per_element",
            "torch_us_per_element", "time_ratio", "ours_tflops", "torch_tflops",
            "ours_gb_per_s", "torch_gb_per_s", "ours_tensor_peak_bytes", "torch_peak_bytes",
            "torch", "torch_allow_tf32", "torch_sdp_enabled", "gpu", "load"]
    f, w = open_csv(args, keys)
    median = statistics.median
    for precision in args.precision:
        print(f"\n{precision}")
        print(f"{'N':>6} | {'ours us/el':>10} {'sdpa us/el':>10} {'ratio':>6} | "
              f"{'ours TFLOP/s':>12} {'sdpa TFLOP/s':>12} | {'ours GB/s':>9} {'sdpa GB/s':>9} | "
              f"{'ours MB':>8} {'sdpa MB':>8} | {'load':>5}")
        told = False
        for n, with_torch in lengths(args):
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(run_ours(args, n, precision))
                if with_torch:
                    theirs.append(run_torch(args, n, precision))
            flops, traffic = attention_flops(b, h, n, e, args.causal), attention_bytes(b, h, n, e)
            o_s = median([r["seconds_median"] for r in ours])
            o_m = median([r["tensor_peak_bytes"] for r in ours])
            row = {"N": n, "B": b, "H": h, "E": e, "causal": int(args.causal), "device": "cuda",
                   "precision": precision, "ours_us_per_element": o_s / n * 1e6,
                   "ours_tflops": flops / o_s * 1e-12, "ours_gb_per_s": traffic / o_s * 1e-9,
                   "ours_tensor_peak_bytes": o_m}
            line = f"{n:6d} | {row['ours_us_per_element']:10.2f} "
            tail = (f"{row['ours_tflops']:12.2f} ", f"{row['ours_gb_per_s']:9.1f} ",
                    f"{o_m / 2**20:8.1f} ")
            if with_torch:
                peer = theirs[-1]
                sdp = " ".join(k for k, on in peer["sdp_enabled"].items() if on)
                if not told:
                    print(f"  (PyTorch {peer['torch']}, {peer['gpu']}, matmul allow_tf32 "
                          f"{peer['allow_tf32']}, SDPA backends enabled: {sdp})")
                    told = True
                t_s = median([r["seconds_median"] for r in theirs])
                t_m = median([r["peak_bytes"] for r in theirs])
                row.update({"torch_us_per_element": t_s / n * 1e6, "time_ratio": o_s / t_s,
                            "torch_tflops": flops / t_s * 1e-12,
                            "torch_gb_per_s": traffic / t_s * 1e-9, "torch_peak_bytes": t_m,
                            "torch": peer["torch"], "torch_allow_tf32": peer["allow_tf32"],
                            "torch_sdp_enabled": sdp, "gpu": peer["gpu"]})
                line += (f"{row['torch_us_per_element']:10.2f} {o_s / t_s:6.2f} | "
                         f"{tail[0]}{row['torch_tflops']:12.2f} | "
                         f"{tail[1]}{row['torch_gb_per_s']:9.1f} | {tail[2]}{t_m / 2**20:8.1f}")
            else:
                line += (f"{'-':>10} {'-':>6} | {tail[0]}{'-':>12} | {tail[1]}{'-':>9} | "
                         f"{tail[2]}{'-':>8}")
            row["load"] = load()
            print(line + f" | {row['load']:5.2f}", flush=True)
            w.writerow({k: row.get(k, "") for k in keys})
            f.flush()
    f.close()
    print(f"wrote {args.csv}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/bench_attention")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: PyTorch's softmax composition; cuda: both sides on the GPU, "
                   "PyTorch's scaled_dot_product_attention")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=None,
                   help="with --device cuda, one table each (default: fp32 bf16); cpu: fp32")
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--ours-only", type=int, nargs="*", default=None,
                   help="lengths to run for clustr alone (default: 16384 on cpu, none on cuda)")
    p.add_argument("--causal", action="store_true", help="causal mask, both sides")
    p.add_argument("--reps", type=int, default=3, help="timed runs per N and side (median)")
    p.add_argument("--warmup", type=int, default=3,
                   help="with --device cuda: untimed SDPA calls first (at least 3)")
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
        return sdpa_worker(args) if args.device == "cuda" else torch_worker(args)
    if args.precision is None:
        args.precision = ["fp32", "bf16"] if args.device == "cuda" else ["fp32"]
    if args.device == "cpu" and args.precision != ["fp32"]:
        p.error("--precision other than fp32 needs --device cuda")
    if args.ours_only is None:
        args.ours_only = [16384] if args.device == "cpu" else []
    if args.device == "cuda" and args.warmup < 3:
        p.error("--warmup: at least 3")
    if args.reps < 1 or args.rounds < 1:
        p.error("--reps and --rounds: at least 1")
    check_output(args)
    if args.device == "cuda":
        check_cuda_peer()
    if not (os.path.isfile(args.binary) and os.access(args.binary, os.X_OK)):
        sys.exit(f"bench_attention_torch: --binary {args.binary}: no such program")
    return main_cuda(args) if args.device == "cuda" else main_cpu(args)


if __name__ == "__main__":
    main()
