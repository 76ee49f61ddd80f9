#!/usr/bin/python3
"""Fine-tuning the pretrained all-MiniLM-L6-v2: clustr's `text finetune` against the same model
and head trained with PyTorch (transformers' BertModel; eager, and under torch.compile).

Both sides train on the first --examples examples of a task (word in context or spans, from
the folder `text tasks` writes), batch --batch, AdamW (lr 3e-5, weight decay 0.01), gradient
clipping at 1, dropout 0.1 as the model's config says, float32, --threads threads, full
attention. The task model is the same on both sides: the encoder, then a linear head on the
pooler output (wic: [CLS] lemma : sentence1 [SEP] sentence2 [SEP]) or on every token (span:
[CLS] question [SEP] context [SEP], start and end logits). Each side runs --steps steps in its
own fresh process; the first --warmup steps are left out of the timing (for torch.compile they
compile). The sides alternate, --rounds times. Prints training examples per second and the ratio
ours / PyTorch's (> 1: ours is faster), and writes a CSV.

Needs, in a virtual environment outside the repository, torch and transformers, the prepared
model folder (data/prepare_pretrained.py) and the tasks (`text tasks --out DIR`):
  <venv>/bin/python3 apps/bench_text_finetune_torch.py --binary build/apps/text --data DIR
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_common import (add_output_args, check_output, child_env, cpu_model,  # noqa: E402
                                run_worker, write_csv)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_task(args):
    with open(os.path.join(args.data, args.task, "train.jsonl")) as f:
        rows = [json.loads(line) for _, line in zip(range(args.examples), f)]
    if args.task == "wic":
        return [(r["lemma"] + " : " + r["sentence1"], r["sentence2"]) for r in rows]
    return [(r["question"], r["context"]) for r in rows]


def torch_worker(args):
    """One side in this (fresh) process: prints a JSON line with the timed steps' seconds."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(1)
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    bert = AutoModel.from_pretrained(args.model, attn_implementation="eager")
    head = torch.nn.Linear(bert.config.hidden_size, 2)

    class TaskModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert, self.head = bert, head

        def forward(self, ids, types, mask):
            out = self.bert(input_ids=ids, token_type_ids=types, attention_mask=mask)
            if args.task == "wic":
                return self.head(out.pooler_output)
            return self.head(out.last_hidden_state)

    model = TaskModel()
    model.train()
    step_fn = torch.compile(model, dynamic=True) if args.mode == "compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
    pairs = read_task(args)
    g = torch.Generator().manual_seed(1)
    order = torch.randperm(len(pairs), generator=g).tolist()
    # The batches tokenized beforehand, as ours encodes its examples before it trains.
    batches = []
    for step in range(args.steps):
        first = (step * args.batch) % len(order)
        rows = [pairs[i] for i in order[first:first + args.batch]]
        batches.append(tokenizer([a for a, _ in rows], [b for _, b in rows],
                                 truncation="longest_first", max_length=384, padding=True,
                                 return_tensors="pt"))
    start = None
    for step, enc in enumerate(batches):
        if step == args.warmup:
            start = time.perf_counter()
        rows = enc["input_ids"]
        out = step_fn(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
        if args.task == "wic":
            loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 2, (len(rows),)))
        else:
            n = out.shape[1]
            target = torch.randint(1, n - 1, (len(rows),))
            loss = 0.5 * (torch.nn.functional.cross_entropy(out[:, :, 0], target) +
                          torch.nn.functional.cross_entropy(out[:, :, 1], target))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    print(json.dumps({"seconds": time.perf_counter() - start, "torch": torch.__version__}))


def ours(args, tmp):
    """clustr's side: `text finetune`, its progress lines' cumulative examples/s turned into the
    rate of the steps after the warm-up."""
    out = os.path.join(tmp, "run")
    cmd = [args.binary, "finetune", "--task", args.task, "--data", args.data, "--model",
           args.model, "--max-train", str(args.examples), "--max-dev", "8", "--epochs", "1",
           "--batch", str(args.batch), "--max-steps", str(args.steps), "--log-interval",
           str(args.warmup), "--threads", str(args.threads), "--out", out, "--overwrite"]
    text = subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.PIPE,
                          text=True).stdout
    rates = {int(m.group(1)): float(m.group(2)) for m in
             re.finditer(r"step (\d+)/\d+ .*?([0-9.]+) examples/s", text)}
    if args.warmup not in rates or args.steps not in rates:
        sys.exit(f"no progress lines at steps {args.warmup} and {args.steps} in the output of "
                 f"{' '.join(cmd)}:\n{text}")
    # Cumulative rate r at step s: s * batch examples in s * batch / r seconds.
    seconds = lambda s: s * args.batch / rates[s]  # noqa: E731
    return seconds(args.steps) - seconds(args.warmup)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "build", "apps", "text"))
    parser.add_argument("--model", default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--data", required=True, help="the tasks' folder (`text tasks`)")
    parser.add_argument("--task", choices=["wic", "span"], default="wic")
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    add_output_args(parser, "bench_text_finetune.csv")
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args)
    check_output(args)
    if not 0 < args.warmup < args.steps or args.steps % args.warmup:
        sys.exit("--warmup must be in (0, --steps) and divide --steps (ours logs every --warmup)")
    modes = args.modes.split(",")
    timed = (args.steps - args.warmup) * args.batch
    times = {side: [] for side in ["ours"] + modes}
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            times["ours"].append(ours(args, tmp))
            for mode in modes:
                result = run_worker(__file__, [
                    "--worker", "--mode", mode, "--model", args.model, "--data", args.data,
                    "--task", args.task, "--examples", args.examples, "--batch", args.batch,
                    "--steps", args.steps, "--warmup", args.warmup, "--threads", args.threads],
                    show_stderr=True)
                times[mode].append(result["seconds"])
    print(f"fine-tuning on {args.task}: batch {args.batch}, steps {args.warmup + 1}-{args.steps} "
          f"timed, {args.threads} threads, fp32, torch {result.get('torch')}, "
          f"{cpu_model()}")
    ours_median = statistics.median(times["ours"])
    print(f"{'side':<10} {'examples/s':>12} {'ours / side':>12}")
    print(f"{'ours':<10} {timed / ours_median:12.1f} {'':>12}")
    rows = []
    for mode in modes:
        m = statistics.median(times[mode])
        print(f"{mode:<10} {timed / m:12.1f} {m / ours_median:12.2f}x")
        rows.append({"task": args.task, "side": mode, "examples_per_s": timed / m,
                     "ours_examples_per_s": timed / ours_median, "ratio": m / ours_median})
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
