#!/usr/bin/python3
"""Sentence embedding with the pretrained all-MiniLM-L6-v2: clustr's `text embed` against
sentence-transformers on PyTorch (eager, and the encoder under torch.compile).

Both sides embed the same sentences (the first --sentences lines of --file) in batches of
--batch, longest first, tokenization included, in float32 (or bf16: ours --precision bf16,
PyTorch under torch.autocast("cpu", dtype=torch.bfloat16)), with --threads threads; each side
runs in its own fresh process, its passes repeated --repeat times and the fastest taken (the
first pass warms up: for torch.compile it compiles). The sides alternate, --rounds times, so
that both see the same host load. Prints sentences per second and the ratio ours / PyTorch's
(> 1: ours is faster), and writes a CSV; also checks that both sides' embeddings agree.

Needs, in a virtual environment outside the repository, torch and sentence-transformers, and
the prepared model folder (data/prepare_pretrained.py):
  <venv>/bin/python3 apps/bench_text_torch.py --binary build/apps/text [--file FILE]
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


def torch_worker(args):
    """One side in this (fresh) process: prints a JSON line with the fastest pass's time."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    model = SentenceTransformer(args.model, device="cpu")
    model.eval()
    if args.mode == "compile":
        model[0].auto_model = torch.compile(model[0].auto_model, dynamic=True)
    with open(args.sentences_file) as f:
        sentences = f.read().split("\n")[:-1]
    best, emb = None, None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                     enabled=args.precision == "bf16"):
            emb = model.encode(sentences, batch_size=args.batch, convert_to_numpy=True)
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    np.save(args.embeddings, emb.astype("float32"))
    print(json.dumps({"seconds": best, "torch": torch.__version__}))


def ours(args, sentences_file, out):
    cmd = [args.binary, "embed", "--file", sentences_file, "--model", args.model, "--batch",
           str(args.batch), "--repeat", str(args.repeat), "--threads", str(args.threads),
           "--precision", args.precision, "--out", out, "--overwrite"]
    text = subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.PIPE,
                          text=True).stdout
    match = re.search(r"embedded in ([0-9.]+) s", text)
    if not match:
        sys.exit(f"no time in the output of {' '.join(cmd)}:\n{text}")
    return float(match.group(1))


def read_ours(path):
    import numpy as np
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        entry = header["embeddings"]
        begin, end = entry["data_offsets"]
        f.seek(8 + n + begin)
        return np.frombuffer(f.read(end - begin), dtype="<f4").reshape(entry["shape"])


def wordnet_examples(count):
    """The first `count` usage examples of WordNet's noun glosses ("..." after the definition)."""
    out = []
    with open("/usr/share/wordnet/data.noun", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("  ") or "|" not in line:
                continue  # the licence header
            out += [m.strip() for m in re.findall(r'"([^"]+)"', line.split("|", 1)[1])]
            if len(out) >= count:
                break
    return out[:count]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "build", "apps", "text"))
    parser.add_argument("--model", default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--file", help="sentences, one per line (default: WordNet's usage "
                        "examples, the quoted parts of the glosses of /usr/share/wordnet/data.noun, "
                        "in file order; Debian's wordnet-base)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--sentences-file", help=argparse.SUPPRESS)
    parser.add_argument("--embeddings", help=argparse.SUPPRESS)
    add_output_args(parser, "bench_text.csv")
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args)
    check_output(args)
    import numpy as np

    if args.file:
        with open(args.file) as f:
            sentences = [line.rstrip("\n") for line in f if line.strip()][:args.sentences]
    else:
        sentences = wordnet_examples(args.sentences)
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        sentences_file = os.path.join(tmp, "sentences.txt")
        with open(sentences_file, "w") as f:
            f.write("".join(s + "\n" for s in sentences))
        times = {"ours": []}
        for mode in modes:
            times[mode] = []
        for _ in range(args.rounds):
            times["ours"].append(ours(args, sentences_file, os.path.join(tmp, "ours.safetensors")))
            for mode in modes:
                result = run_worker(__file__, [
                    "--worker", "--mode", mode, "--model", args.model, "--sentences-file",
                    sentences_file, "--batch", args.batch, "--threads", args.threads, "--repeat",
                    args.repeat, "--precision", args.precision, "--embeddings",
                    os.path.join(tmp, f"{mode}.npy")], show_stderr=True)
                times[mode].append(result["seconds"])
        a = read_ours(os.path.join(tmp, "ours.safetensors"))
        b = np.load(os.path.join(tmp, f"{modes[0]}.npy"))
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"{len(sentences)} sentences, batch {args.batch}, {args.threads} threads, "
          f"{args.precision}, torch {result['torch']}, "
          f"{cpu_model()}")
    print(f"embeddings agree: lowest cosine ours vs {modes[0]} {cos.min():.6f}")
    rows = []
    ours_median = statistics.median(times["ours"])
    print(f"{'side':<10} {'sentences/s':>12} {'ours / side':>12}")
    print(f"{'ours':<10} {len(sentences) / ours_median:12.1f} {'':>12}")
    for mode in modes:
        m = statistics.median(times[mode])
        print(f"{mode:<10} {len(sentences) / m:12.1f} {m / ours_median:12.2f}x")
        rows.append({"side": mode, "sentences_per_s": len(sentences) / m,
                     "ours_sentences_per_s": len(sentences) / ours_median,
                     "ratio": m / ours_median})
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
