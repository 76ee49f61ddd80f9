#!/usr/bin/python3
"""Copy-task training throughput: clustr's copy_task app against the same model in PyTorch.

The paper's copy-task model (supplementary C.2): token embedding, sinusoidal positions, 4
post-norm encoder layers (6 heads x 32, feed-forward 768, ReLU, dropout 0), a linear read-out
to the vocabulary; cross-entropy on the masked positions, R-Adam (lr 2e-4), gradient clipping
at norm 10, batch 32, sequence length N = 2L + 2. Full softmax attention on both sides (PyTorch
has no clustered attention); ours is also run with improved-clustered attention for reference.

For each length, in turn: our app (`copy_task`, that configuration only, its own process), then
PyTorch in a fresh process, so both see the same host load. A training step is everything the
loop does per step: drawing the batch, forward, loss, backward, clipping, the optimizer update.
Prints tokens per second (B N / step time, median over the timed steps) and the ratio
ours / torch (> 1: ours is faster); writes a CSV.

--precision bf16: our app with --precision bf16, PyTorch's step under
torch.autocast(device, dtype=torch.bfloat16) (the forward and the loss inside it, backward and
the optimizer outside, as the autocast recipe does).

--device cuda: both sides on the GPU (ours with --device cuda, PyTorch's model, batches and
optimizer on "cuda", each timed step ended by torch.cuda.synchronize()). PyTorch 2.x's
nn.TransformerEncoderLayer computes its attention with scaled_dot_product_attention when
trained (the worker reports whether this PyTorch has it); --tf32 turns TF32 on for both (ours
--tf32, PyTorch's torch.backends.cuda.matmul.allow_tf32), off by default on both.

Run with Debian's python3-torch (1.13) on the CPU:
  /usr/bin/python3 apps/bench_copy_task_torch.py --binary build/apps/copy_task
and on a GPU with the PyTorch 2.x installed there:
  python3 apps/bench_copy_task_torch.py --binary build/apps/copy_task --device cuda
Both processes get OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive (bench_torch_common);
PyTorch uses torch.set_num_threads(--threads).
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

MODEL = {"layers": 4, "heads": 6, "head_dim": 32, "feedforward": 768}
TASK = {"symbols": 10, "mask_ratio": 0.2}
TRAIN = {"batch": 32, "lr": 2e-4, "clip": 10.0}


def torch_worker(args):
    """One length in this (fresh) process: prints a JSON line with the step times."""
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
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    length, s = args.worker, TASK["symbols"]
    n, v = 2 * length + 2, s + 2
    d = MODEL["heads"] * MODEL["head_dim"]

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
            layer = nn.TransformerEncoderLayer(d, MODEL["heads"], MODEL["feedforward"],
                                               dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, MODEL["layers"],
                                                 enable_nested_tensor=False)
            self.out = nn.Linear(d, v)

        def forward(self, x):
            return self.out(self.encoder(self.embed(x) + self.pe))

    model = CopyModel().to(dev)
    opt = torch.optim.RAdam(model.parameters(), lr=TRAIN["lr"])
    b, r = TRAIN["batch"], TASK["mask_ratio"]

    def batch():
        # 0 w 0 w, each word position masked in copy 1 (u < r), copy 2 (r <= u < 2r) or neither.
        w = torch.randint(1, s + 1, (b, length))
        zero = torch.zeros(b, 1, dtype=torch.long)
        seq = torch.cat([zero, w, zero, w], dim=1)
        u = torch.rand(b, length)
        mask = torch.zeros(b, n, dtype=torch.bool)
        mask[:, 1:1 + length] = u < r
        mask[:, length + 2:] = (u >= r) & (u < 2 * r)
        x = seq.masked_fill(mask, s + 1)
        target = seq.masked_fill(~mask, -100)
        return x.to(dev), target.to(dev)

    def step():
        x, target = batch()
        with torch.autocast(args.device, dtype=torch.bfloat16,
                            enabled=args.precision == "bf16"):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, v), target.reshape(-1),
                                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()

    for _ in range(args.warmup):
        step()
    sync()
    ms = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    print(json.dumps({"ms_per_step": med, "tokens_per_s": b * n / med * 1e3,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "sdpa": hasattr(nn.functional, "scaled_dot_product_attention"),
                      "gpu": torch.cuda.get_device_name() if args.device == "cuda" else ""}))


def run_ours(args, length, attention):
    """Runs the app for warmup + steps steps, logging every step; returns the median ms/step of
    the steps after the warm-up, read from its metrics CSV."""
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [args.binary, "--out", tmp, "--attention", attention, "--length", str(length),
               "--symbols", str(TASK["symbols"]), "--mask-ratio", str(TASK["mask_ratio"]),
               "--layers", str(MODEL["layers"]), "--heads", str(MODEL["heads"]),
               "--head-dim", str(MODEL["head_dim"]), "--feedforward", str(MODEL["feedforward"]),
               "--dropout", "0", "--batch", str(TRAIN["batch"]), "--lr", str(TRAIN["lr"]),
               "--optimizer", "radam", "--clip", str(TRAIN["clip"]), "--steps", str(total),
               "--threads", str(args.threads), "--precision", args.precision,
               "--device", args.device]
        if args.tf32:
            cmd.append("--tf32")
        cmd += args.ours_flags.split()
        subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "metrics.csv")) as f:
            rows = [r for r in csv.DictReader(f) if r.get("ms_per_step")]
    times = [float(r["ms_per_step"]) for r in rows if int(r["step"]) > args.warmup]
    if not times:
        sys.exit(f"no timed steps in the metrics of {args.binary}")
    med = statistics.median(times)
    return TRAIN["batch"] * (2 * length + 2) / med * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default="build/apps/copy_task")
    p.add_argument("--lengths", type=int, nargs="+", default=[31, 63],
                   help="word lengths L (N = 2L + 2)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per side (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=1, help="alternations ours/PyTorch per length")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ours-flags", default="--log-interval 1 --eval-interval 100000 "
                   "--checkpoint-interval 100000 --target-accuracy 0 --eval-batches 1 "
                   "--final-eval-batches 1",
                   help="extra flags for our app (logging every step, evaluation only after "
                   "the last step, outside the timed steps)")
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
    check_output(args)
    if args.tf32 and args.device != "cuda":
        p.error("--tf32 needs --device cuda")

    print(f"copy-task training step, {MODEL}, batch {TRAIN['batch']}, {args.device}, "
          f"{args.threads} threads, {args.precision}{', TF32' if args.tf32 else ''}, median of {args.steps} steps after {args.warmup}, "
          f"{args.rounds} round(s)")
    print(f"{'N':>5} | {'ours full tok/s':>15} {'torch tok/s':>11} {'speedup':>7} | "
          f"{'ours improved tok/s':>19} | {'load':>5}")
    rows = []
    for length in args.lengths:
        ours, theirs, improved = [], [], []
        for _ in range(args.rounds):
            ours.append(run_ours(args, length, "full"))
            peer = run_worker(__file__, ["--worker", length, "--steps", args.steps,
                                         "--warmup", args.warmup, "--threads", args.threads,
                                         "--precision", args.precision, "--device",
                                         args.device] + (["--tf32"] if args.tf32 else []))
            theirs.append(peer["tokens_per_s"])
            improved.append(run_ours(args, length, "improved-clustered"))
        o, t, i = (statistics.median(v) for v in (ours, theirs, improved))
        load = os.getloadavg()[0]
        n = 2 * length + 2
        print(f"{n:>5} | {o:15.0f} {t:11.0f} {o / t:7.2f} | {i:19.0f} | {load:5.2f}", flush=True)
        rows.append({"N": n, "device": args.device, "precision": args.precision,
                     "tf32": int(args.tf32), "torch": peer["torch"], "torch_sdpa": int(peer["sdpa"]),
                     "gpu": peer["gpu"], "ours_full_tokens_per_s": o,
                     "torch_tokens_per_s": t,
                     "speedup": o / t, "ours_improved_tokens_per_s": i, "load": load})
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
