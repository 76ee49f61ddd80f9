#!/usr/bin/env python3
"""Soak: runs a training command for many steps and watches its memory.

The command (after --) is an app's training run, e.g. build/apps/copy_task ... --steps 10000.
At each of its progress lines ("step S/..." of the copy task, "epoch E  step S" of the speech
app) this samples the process's resident memory (VmRSS, /proc/PID/status) and, on the device,
the device memory its tensors hold (the line's "device MiB M"). After the warm-up (the first
--warmup fraction of the samples: caches, the allocators' pools and the host's page cache
fill up there) it reports each measure's growth: the least-squares slope in MiB per 1000
steps, and the relative growth from the mean of the first tenth of the samples to the mean of
the last tenth. The exit status is 1 when a growth passes --bound (percent), or when the
command fails; the report also goes to --out as JSON when given.

  python3 scripts/soak.py --bound 2 -- build/apps/copy_task --steps 10000 --out runs/soak
"""
import argparse
import json
import re
import subprocess
import sys
import time

STEP = re.compile(r"(?:^|\s)step (\d+)")
DEVICE = re.compile(r"device MiB ([0-9.]+)")


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def growth(points):
    """(slope in MiB per 1000 steps, relative growth in percent) of (step, MiB) points."""
    n = len(points)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    tenth = max(1, n // 10)
    first = sum(ys[:tenth]) / tenth
    last = sum(ys[-tenth:]) / tenth
    return 1000.0 * slope, 100.0 * (last - first) / first if first > 0 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=float, default=0.2,
                        help="fraction of the samples left out at the start (default 0.2)")
    parser.add_argument("--bound", type=float, default=2.0,
                        help="most growth allowed after the warm-up, percent (default 2)")
    parser.add_argument("--min-samples", type=int, default=10,
                        help="fewest samples after the warm-up for a verdict (default 10)")
    parser.add_argument("--measures", default="resident,device",
                        help="which to judge: resident, device or both (default both; under "
                        "AddressSanitizer, whose quarantine of freed memory fills for a long "
                        "while, judge device memory only)")
    parser.add_argument("--out", help="write the report here as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the training command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give it after --")
    if not 0 <= args.warmup < 1:
        parser.error(f"--warmup must be in [0, 1), got {args.warmup}")

    start = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    host, device = [], []
    tail = []
    for line in proc.stdout:
        tail = (tail + [line])[-20:]
        m = STEP.search(line)
        if not m:
            continue
        step = int(m.group(1))
        mib = rss_mib(proc.pid)
        if mib is not None:
            host.append((step, mib))
        d = DEVICE.search(line)
        if d:
            device.append((step, float(d.group(1))))
    status = proc.wait()
    if status != 0:
        sys.stdout.write("".join(tail))
        sys.exit(f"soak: the command failed with status {status}: {' '.join(command)}")

    report = {"command": command, "seconds": round(time.time() - start, 1), "bound_percent":
              args.bound, "warmup": args.warmup, "measures": {}}
    failed = []
    judged = args.measures.split(",")
    for name, points in (("resident", host), ("device", device)):
        if not points or name not in judged:
            continue
        kept = points[int(len(points) * args.warmup):]
        if len(kept) < args.min_samples:
            sys.exit(f"soak: {len(kept)} {name} samples after the warm-up, fewer than "
                     f"--min-samples {args.min_samples}: log more often or run longer")
        slope, percent = growth(kept)
        report["measures"][name] = {
            "samples": len(kept), "from_step": kept[0][0], "to_step": kept[-1][0],
            "first_mib": round(kept[0][1], 1), "last_mib": round(kept[-1][1], 1),
            "peak_mib": round(max(p[1] for p in kept), 1),
            "mib_per_1000_steps": round(slope, 3), "growth_percent": round(percent, 3)}
        verdict = "ok" if percent <= args.bound else "GROWS"
        if percent > args.bound:
            failed.append(name)
        print(f"soak: {name} memory, steps {kept[0][0]}-{kept[-1][0]} ({len(kept)} samples): "
              f"{kept[0][1]:.1f} -> {kept[-1][1]:.1f} MiB, {slope:+.3f} MiB per 1000 steps, "
              f"{percent:+.2f}% (bound {args.bound}%): {verdict}")
    if not report["measures"]:
        sys.exit("soak: no progress lines with a step number in the command's output")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if failed:
        sys.exit(f"soak: {' and '.join(failed)} memory grew past {args.bound}% after the warm-up")


if __name__ == "__main__":
    main()
