#!/usr/bin/env python3
"""The training-time columns of the paper's Table 2 for `speech train` run folders.

For each run folder: the training time per epoch (the training clock of last.safetensors, over
the epochs its steps make), the best dev PER with its epoch, and the training time until that
checkpoint (the clock stored in best.safetensors). The training clock is what --time-limit
counts: steps and batching, not the dev evaluations.

    scripts/speech_times.py runs/speech_full_plain runs/speech_clustered ...
"""
import csv
import json
import struct
import sys
from pathlib import Path


def metadata(path):
    """The __metadata__ table of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (size,) = struct.unpack("<Q", raw)
        header = json.loads(f.read(size))
    return header.get("__metadata__", {})


def train_seconds(path):
    meta = metadata(path)
    key = "config.state.train-seconds"
    if key not in meta:
        raise ValueError(f"{path}: no {key} (a checkpoint of speech train is expected)")
    return float(meta[key]), int(meta["step"])


def dev_rows(run):
    """(step, epoch, dev_per) of each dev evaluation in the run's metrics.csv."""
    rows = []
    with open(run / "metrics.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["dev_per"]:
                rows.append((int(r["step"]), int(r["epoch"]), float(r["dev_per"])))
    if not rows:
        raise ValueError(f"{run}/metrics.csv: no dev evaluation")
    return rows


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    print("| run | epochs | s per epoch | best dev PER (epoch) | s to best dev |")
    print("|---|---|---|---|---|")
    for name in argv:
        run = Path(name)
        try:
            last_s, last_step = train_seconds(run / "last.safetensors")
            best_s, best_step = train_seconds(run / "best.safetensors")
            rows = dev_rows(run)
        except (OSError, ValueError, KeyError) as e:
            print(f"{run}: {e}", file=sys.stderr)
            return 1
        steps_per_epoch = rows[0][0]  # the first dev evaluation closes epoch 1
        epochs = last_step / steps_per_epoch
        best = min(rows, key=lambda r: r[2])
        if best[0] != best_step:
            print(f"{run}: best.safetensors is at step {best_step}, the best dev PER at step "
                  f"{best[0]}", file=sys.stderr)
            return 1
        print(f"| {run.name} | {epochs:.1f} | {last_s / epochs:.0f} | {best[2]:.4f} ({best[1]}) "
              f"| {best_s:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
