#!/usr/bin/python3
"""Copy-task training throughput: clustr's copy_task app against the same model in PyTorch.

The paper's copy-task model (supplementary C.2, --model copy, the default): token embedding,
sinusoidal positions, 4 post-norm encoder layers (6 heads x 32, feed-forward 768, ReLU, dropout
0), a linear read-out to the vocabulary; cross-entropy on the masked positions, R-Adam (lr
2e-4), gradient clipping at norm 10, batch 32, sequence length N = 2L + 2 (L = 31 and 63 by
default: N = 64 and 128). --model bert: the same task, loss and training at BERT-base's width,
D 768 (12 heads x 64), feed-forward 3072, 4 layers, batch 16, N = 512 (L = 255) by default; our
app takes those sizes through its flags (--layers, --heads, --head-dim, --feedforward, --batch,
--length), so both sides run it. Full softmax attention on both sides (PyTorch has no clustered
attention); ours is also run with improved-clustered attention for reference.

For each length, in turn: our app (`copy_task`, that configuration only, its own process), then
PyTorch once for each --compile mode, each in a fresh process, then ours with improved-clustered
attention, so that all see the same host load; --rounds such alternations per length, the
median over the rounds is reported. A training step is everything the loop does per step:
drawing the batch, forward, loss, backward, clipping, the optimizer update. Prints one row per
(N, precision, compile mode): tokens per second of both sides, the ratio ours / torch (speedup,
> 1: ours is faster), the compile mode and PyTorch's compile seconds; writes them to a CSV, row
by row (a run cut short keeps its finished rows).

Timing. Ours: the app logs every step (--log-interval 1); its metrics CSV's ms_per_step of the
--steps steps after the --warmup ones, median: ours_full_tokens_per_s = B N / median. On the CPU
each of our steps waits for its results on the host (it reads the loss and the gradient norm),
so the sum of those step times is also our loop's time: ours_full_tokens_per_s_mean = K B N /
that sum (K = --steps), the figure to set beside PyTorch's loop on the GPU. With --device cuda
(where the app replays its step as a CUDA graph and reads the results back once per log line)
the app logs every --warmup steps instead when that divides --steps: each row is then a
window's mean step time, the warm-up (with the graph's capture) is the first window and is left
out, and the mean is K B N over the windows' summed time. PyTorch on the CPU (--device
cpu): as ours, each step timed on its own, median. PyTorch with --device cuda: the K steps as
one loop, one torch.cuda.synchronize() before and one after it, tokens/s = K B N / the loop's
time (a synchronization per step would idle the GPU while the host launches the next step,
which is what compiling and CUDA graphs remove); the CSV's torch_timing says which.

--precision bf16: our app with --precision bf16, PyTorch's forward and loss under
torch.autocast(device, dtype=torch.bfloat16), backward and the optimizer outside it, as the
autocast recipe does.

--device cuda: both sides on the GPU (ours with --device cuda; PyTorch's model, optimizer and
batches on "cuda": each batch is drawn there with torch's generators, the same distribution as
on the CPU, so the host feeds no step). PyTorch 2.x's nn.TransformerEncoderLayer computes its
attention with scaled_dot_product_attention when trained (the worker reports whether this
PyTorch has it); --tf32 turns TF32 on for both (ours --tf32, PyTorch's
torch.backends.cuda.matmul.allow_tf32), off by default on both.

--compile none|default|reduce-overhead (reduce-overhead with --device cuda; one or more, each
its own PyTorch side in its own process; none by default): none is eager PyTorch; default
wraps the training step as torch.compile(step) and reduce-overhead as torch.compile(step,
mode="reduce-overhead") (Inductor's kernels replayed as CUDA graphs). The compiled function is
the whole step as a PyTorch user writes it for these modes: zero_grad, forward and loss (under
autocast with bf16), backward, clipping and the optimizer step; the batch is drawn outside it,
the same in every mode (with reduce-overhead, torch.compiler.cudagraph_mark_step_begin() marks
each step first). TorchDynamo splits the function at loss.backward() (a graph break) and
compiles the forward (with its backward, by AOTAutograd) and the clipping + R-Adam update as
graphs of their own. Should compiling the whole step fail in some PyTorch version, the worker
says so on stderr, compiles forward + loss + backward alone and runs clipping and the optimizer
step eagerly; the JSON's and the CSV's `compiled` says which ran: "step" or
"forward+loss+backward". Compilation happens in the first calls: a compiled side first runs
max(--warmup, --compile-warmup) untimed steps (the first compiles, the next ones record the CUDA
graphs), then the timed loop. compile_s (seconds): those warm-up steps' time less the same number
of steps at the timed loop's pace (after a failed whole-step attempt, the second attempt's);
first_step_s: the first call alone. The worker also reports
the graph breaks TorchDynamo counted and the graphs for which Inductor skipped CUDA graphs
(cudagraph_skips; when not 0, reduce-overhead ran without them and its stderr names why).
PyTorch caches compiled graphs on disk, so a later round's compile_s can be shorter.

Run with Debian's python3-torch (1.13) on the CPU (no torch.compile there: --compile none only):
  /usr/bin/python3 apps/bench_copy_task_torch.py --binary build/apps/copy_task
or with a PyTorch 2.x from a virtual environment, eager and compiled:
  <venv>/bin/python3 apps/bench_copy_task_torch.py --binary build/apps/copy_task \\
      --compile none default
and on a GPU with the PyTorch 2.x installed there:
  python3 apps/bench_copy_task_torch.py --binary build-gpu/apps/copy_task --device cuda \\
      --compile none default reduce-overhead
  python3 apps/bench_copy_task_torch.py --binary build-gpu/apps/copy_task --device cuda \\
      --model bert --precision bf16 --compile none reduce-overhead
Both processes get OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive (bench_torch_common);
PyTorch uses torch.set_num_threads(--threads). A PyTorch side that fails (a compile error, say)
gets a row with no tokens/s and its error; the others still run, and the exit status is 1.
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

# The model and batch of each --model; lengths are the default word lengths L (N = 2L + 2).
MODELS = {
    "copy": {"layers": 4, "heads": 6, "head_dim": 32, "feedforward": 768, "batch": 32,
             "lengths": [31, 63]},
    "bert": {"layers": 4, "heads": 12, "head_dim": 64, "feedforward": 3072, "batch": 16,
             "lengths": [255]},
}
TASK = {"symbols": 10, "mask_ratio": 0.2}
TRAIN = {"lr": 2e-4, "clip": 10.0}
COMPILE_MODES = ["none", "default", "reduce-overhead"]
FIELDS = ["N", "device", "precision", "tf32", "torch", "torch_sdpa", "gpu",
          "ours_full_tokens_per_s", "torch_tokens_per_s", "speedup", "ours_improved_tokens_per_s",
          "load", "model", "batch", "compile", "compiled", "compile_s", "first_step_s",
          "torch_timing", "ours_full_tokens_per_s_mean", "graph_breaks", "cudagraph_skips",
          "error"]


def dynamo_counts():
    """What TorchDynamo and Inductor counted in this process: graph breaks and the graphs run
    without CUDA graphs (reduce-overhead); empty where this PyTorch keeps no such counters."""
    try:
        from torch._dynamo.utils import counters
        return {"graph_breaks": sum(counters["graph_break"].values()),
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}
    except Exception:  # noqa: BLE001 (an internal module: absent or different in some versions)
        return {}


def torch_worker(args):
    """One length and one compile mode in this (fresh) process: prints a JSON line with the
    timing."""
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench_copy_task_torch: --device cuda, but this PyTorch sees no GPU")
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    mode = args.compile[0]
    if mode != "none" and not hasattr(torch, "compile"):
        sys.exit(f"bench_copy_task_torch: --compile {mode}, but PyTorch {torch.__version__} "
                 "has no torch.compile")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    cfg = MODELS[args.model]
    length, s = args.worker, TASK["symbols"]
    n, v = 2 * length + 2, s + 2
    d = cfg["heads"] * cfg["head_dim"]

    class CopyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(v, d)
            pos = torch.arange(n, dtype=torch.float32)[:, None]
            freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(1e4) / d))
            pe = torch.zeros(n, d)
            pe[:, 0::2] = torch.sin(pos * freq)
            pe[:, 1::2] = torch.cos(pos * freq)
            self.register_buffer("pe", pe)
            layer = nn.TransformerEncoderLayer(d, cfg["heads"], cfg["feedforward"],
                                               dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, cfg["layers"],
                                                 enable_nested_tensor=False)
            self.out = nn.Linear(d, v)

        def forward(self, x):
            return self.out(self.encoder(self.embed(x) + self.pe))

    model = CopyModel().to(dev)
    opt = torch.optim.RAdam(model.parameters(), lr=TRAIN["lr"])
    b, r = cfg["batch"], TASK["mask_ratio"]

    def batch():
        # 0 w 0 w, each word position masked in copy 1 (u < r), copy 2 (r <= u < 2r) or neither.
        # Drawn where the model is: on the GPU the host feeds no step (on the CPU the same draws
        # as ever).
        w = torch.randint(1, s + 1, (b, length), device=dev)
        zero = torch.zeros(b, 1, dtype=torch.long, device=dev)
        seq = torch.cat([zero, w, zero, w], dim=1)
        u = torch.rand(b, length, device=dev)
        mask = torch.zeros(b, n, dtype=torch.bool, device=dev)
        mask[:, 1:1 + length] = u < r
        mask[:, length + 2:] = (u >= r) & (u < 2 * r)
        x = seq.masked_fill(mask, s + 1)
        target = seq.masked_fill(~mask, -100)
        return x, target

    def forward_backward(x, target):
        with torch.autocast(args.device, dtype=torch.bfloat16,
                            enabled=args.precision == "bf16"):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, v), target.reshape(-1),
                                               ignore_index=-100)
        loss.backward()

    def update():
        nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()

    def train_step(x, target):
        opt.zero_grad(set_to_none=True)
        forward_backward(x, target)
        update()

    # What one step calls: the eager step, or the compiled one (the whole step, or forward +
    # loss + backward with clipping and the optimizer eager around it).
    compiled, step_error = "", ""
    options = {"mode": "reduce-overhead"} if mode == "reduce-overhead" else {}
    step_fn = train_step
    if mode != "none":
        compiled = "step"
        step_fn = torch.compile(train_step, **options)
    mark = lambda: None  # noqa: E731
    if mode == "reduce-overhead" and hasattr(getattr(torch, "compiler", None),
                                             "cudagraph_mark_step_begin"):
        mark = torch.compiler.cudagraph_mark_step_begin  # each step a new CUDA-graph iteration

    def run(steps):
        for _ in range(steps):
            mark()
            x, target = batch()
            step_fn(x, target)

    def warm_up(steps):
        """The untimed steps, the first alone: (first step's seconds, all of them)."""
        t0 = time.perf_counter()
        run(1)
        sync()
        first = time.perf_counter() - t0
        run(steps - 1)
        sync()
        return first, time.perf_counter() - t0

    warm = args.warmup if mode == "none" else max(args.warmup, args.compile_warmup, 1)
    if mode == "none":
        first_s, warm_s = warm_up(warm) if warm else (0.0, 0.0)
    else:
        try:
            first_s, warm_s = warm_up(warm)
        except Exception as e:  # noqa: BLE001 (whatever the compiler raises)
            # Fallback: the model's forward + loss + backward compiled, clipping and the
            # optimizer step eager (a version whose compiler cannot take the optimizer).
            message = str(e).strip().splitlines()
            step_error = f"{type(e).__name__}: {message[0] if message else ''}"[:300]
            print(f"bench_copy_task_torch: compiling the whole step failed ({step_error}); "
                  "compiling forward + loss + backward, clipping and the optimizer step eager",
                  file=sys.stderr, flush=True)
            torch._dynamo.reset()
            compiled = "forward+loss+backward"
            forward_backward_compiled = torch.compile(forward_backward, **options)

            def step_fn_fallback(x, target):
                opt.zero_grad(set_to_none=True)
                forward_backward_compiled(x, target)
                update()

            step_fn = step_fn_fallback
            first_s, warm_s = warm_up(warm)

    if args.device == "cuda":
        # One loop of K steps, synchronized once before and once after it.
        sync()
        t0 = time.perf_counter()
        run(args.steps)
        sync()
        loop_s = time.perf_counter() - t0
        ms = loop_s / args.steps * 1e3
        timing = "loop"
    else:
        # Each step timed on its own, the median (as ours).
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            run(1)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        timing = "median step"
    compile_s = max(warm_s - warm * ms * 1e-3, 0.0) if mode != "none" else 0.0
    print(json.dumps({"ms_per_step": ms, "tokens_per_s": b * n / ms * 1e3, "timing": timing,
                      "compile": mode, "compiled": compiled, "compile_s": compile_s,
                      "first_step_s": first_s if mode != "none" else 0.0,
                      "step_compile_error": step_error,
                      **(dynamo_counts() if mode != "none" else {}),
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "sdpa": hasattr(nn.functional, "scaled_dot_product_attention"),
                      "gpu": torch.cuda.get_device_name() if args.device == "cuda" else ""}))


def run_ours(args, length, attention):
    """Runs the app for warmup + steps steps, logging every step; returns its tokens/s from the
    steps after the warm-up, read from its metrics CSV: (B N / the median step time, K B N / the
    sum of the K step times)."""
    cfg = MODELS[args.model]
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [args.binary, "--out", tmp, "--attention", attention, "--length", str(length),
               "--symbols", str(TASK["symbols"]), "--mask-ratio", str(TASK["mask_ratio"]),
               "--layers", str(cfg["layers"]), "--heads", str(cfg["heads"]),
               "--head-dim", str(cfg["head_dim"]), "--feedforward", str(cfg["feedforward"]),
               "--dropout", "0", "--batch", str(cfg["batch"]), "--lr", str(TRAIN["lr"]),
               "--optimizer", "radam", "--clip", str(TRAIN["clip"]), "--steps", str(total),
               "--threads", str(args.threads), "--precision", args.precision,
               "--device", args.device]
        if args.tf32:
            cmd.append("--tf32")
        interval = 1
        if args.device == "cuda" and args.warmup > 0 and args.steps % args.warmup == 0:
            interval = args.warmup
        cmd += ["--log-interval", str(interval)] + args.ours_flags.split()
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "metrics.csv")) as f:
            rows = [r for r in csv.DictReader(f) if r.get("ms_per_step")]
    times = [float(r["ms_per_step"]) for r in rows if int(r["step"]) > args.warmup]
    if not times:
        sys.exit(f"no timed steps in the metrics of {args.binary}")
    tokens = cfg["batch"] * (2 * length + 2)
    return tokens / statistics.median(times) * 1e3, tokens * len(times) / sum(times) * 1e3


def run_peer(args, length, mode):
    """PyTorch for one length and compile mode in a fresh process: its JSON object, or
    {"error": ...} when it failed (its stderr went to ours)."""
    worker = ["--worker", length, "--model", args.model, "--compile", mode,
              "--steps", args.steps, "--warmup", args.warmup,
              "--compile-warmup", args.compile_warmup, "--threads", args.threads,
              "--precision", args.precision, "--device", args.device]
    try:
        return run_worker(__file__, worker + (["--tf32"] if args.tf32 else []),
                          show_stderr=True)
    except subprocess.CalledProcessError as e:
        return {"error": f"PyTorch worker ({mode}) exit status {e.returncode}"}
    except (ValueError, IndexError) as e:  # no JSON line came back
        return {"error": f"PyTorch worker ({mode}): no result ({e})"}


def median_of(values):
    return statistics.median(values) if values else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/copy_task")
    p.add_argument("--model", default="copy", choices=list(MODELS),
                   help="copy: the paper's copy-task model (D 192, 4 layers, batch 32); bert: "
                   "BERT-base width (D 768, 12 heads, feed-forward 3072, 4 layers, batch 16, "
                   "N = 512 by default), the same task and loss")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="word lengths L (N = 2L + 2); default 31 63 (copy), 255 (bert)")
    p.add_argument("--steps", type=int, default=20,
                   help="timed steps per side K (CPU: median; CUDA: PyTorch's one loop)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--compile", nargs="+", default=["none"], choices=COMPILE_MODES,
                   help="PyTorch's sides, each in its own process: eager (none), "
                   "torch.compile(step) (default), torch.compile(step, mode='reduce-overhead') "
                   "(CUDA graphs; needs --device cuda)")
    p.add_argument("--compile-warmup", type=int, default=10,
                   help="untimed steps at least for a compiled side (the first compiles, the "
                   "next ones record CUDA graphs)")
    p.add_argument("--rounds", type=int, default=1, help="alternations ours/PyTorch per length")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ours-flags", default="--eval-interval 100000 "
                   "--checkpoint-interval 100000 --target-accuracy 0 --eval-batches 1 "
                   "--final-eval-batches 1",
                   help="extra flags for our app (evaluation only after the last step, outside "
                   "the timed steps; the log interval is set as the docstring says)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: ours with --precision bf16, PyTorch under autocast (bfloat16)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: both sides on the GPU")
    p.add_argument("--tf32", action="store_true",
                   help="with --device cuda: TF32 tensor cores for float32 products, both sides")
    add_output_args(p, "bench_copy_task_torch.csv")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return torch_worker(args)
    if args.tf32 and args.device != "cuda":
        p.error("--tf32 needs --device cuda")
    modes = list(dict.fromkeys(args.compile))  # each mode once, in the order given
    if args.device != "cuda" and "reduce-overhead" in modes:
        p.error("--compile reduce-overhead (CUDA graphs) needs --device cuda")
    if args.steps < 1 or args.warmup < 0 or args.compile_warmup < 0 or args.rounds < 1:
        p.error("--steps and --rounds must be at least 1, --warmup and --compile-warmup at "
                "least 0")
    check_output(args)
    cfg = MODELS[args.model]
    lengths = args.lengths or cfg["lengths"]

    model = {k: cfg[k] for k in ("layers", "heads", "head_dim", "feedforward")}
    timing = (f"median of {args.steps} steps" if args.device == "cpu" else
              f"PyTorch: one loop of {args.steps} steps; ours: median of {args.steps} steps")
    warmup = f"after {args.warmup}" + (f" ({max(args.warmup, args.compile_warmup, 1)} compiled)"
                                       if modes != ["none"] else "")
    print(f"copy-task training step, --model {args.model} {model}, batch {cfg['batch']}, "
          f"{args.device}, {args.threads} threads, "
          f"{args.precision}{', TF32' if args.tf32 else ''}, {timing} {warmup}, "
          f"{args.rounds} round(s)")
    print(f"{'N':>5} {'compile':>15} | {'ours full tok/s':>15} {'torch tok/s':>11} "
          f"{'speedup':>7} {'compile s':>9} | {'ours improved tok/s':>19} | {'load':>5}")
    failed = 0
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        f.flush()
        for length in lengths:
            ours, ours_mean, improved = [], [], []
            peers = {mode: [] for mode in modes}
            for _ in range(args.rounds):
                o, o_mean = run_ours(args, length, "full")
                ours.append(o)
                ours_mean.append(o_mean)
                for mode in modes:
                    peers[mode].append(run_peer(args, length, mode))
                improved.append(run_ours(args, length, "improved-clustered")[0])
            o, o_mean, i = (median_of(v) for v in (ours, ours_mean, improved))
            load = os.getloadavg()[0]
            n = 2 * length + 2
            for mode in modes:
                good = [r for r in peers[mode] if "error" not in r]
                errors = list(dict.fromkeys(r["error"] for r in peers[mode] if "error" in r))
                failed += bool(errors)
                last = good[-1] if good else {}
                t = median_of([r["tokens_per_s"] for r in good])
                compile_s = median_of([r["compile_s"] for r in good])
                print(f"{n:>5} {mode:>15} | {o:15.0f} {t:11.0f} {o / t:7.2f} {compile_s:9.1f} | "
                      f"{i:19.0f} | {load:5.2f}" + (f"  FAILED: {errors[0]}" if errors else ""),
                      flush=True)
                w.writerow({"N": n, "device": args.device, "precision": args.precision,
                            "tf32": int(args.tf32), "torch": last.get("torch", ""),
                            "torch_sdpa": int(last.get("sdpa", False)),
                            "gpu": last.get("gpu", ""), "ours_full_tokens_per_s": o,
                            "torch_tokens_per_s": t, "speedup": o / t,
                            "ours_improved_tokens_per_s": i, "load": load,
                            "model": args.model, "batch": cfg["batch"], "compile": mode,
                            "compiled": last.get("compiled", ""), "compile_s": compile_s,
                            "first_step_s": median_of([r["first_step_s"] for r in good]),
                            "torch_timing": last.get("timing", ""),
                            "ours_full_tokens_per_s_mean": o_mean,
                            "graph_breaks": last.get("graph_breaks", ""),
                            "cudagraph_skips": last.get("cudagraph_skips", ""),
                            "error": "; ".join(errors)})
                f.flush()
    print(f"wrote {args.csv}")
    if failed:
        sys.exit(f"{failed} PyTorch side(s) failed: their rows have no tokens/s")


if __name__ == "__main__":
    main()
