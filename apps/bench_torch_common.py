"""What the side-by-side PyTorch benchmark scripts share: the peer's environment and running one
measurement in a fresh process."""
import csv
import json
import os
import re
import subprocess
import sys


def child_env():
    """The environment of both sides: OpenBLAS 0.3.21 misdetects this CPU unless told its core,
    and PyTorch's threads busy-wait against OpenBLAS's unless OpenMP waits passively."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return env


def run_worker(script, worker_args, show_stderr=False):
    """Runs `script --worker ...` with this Python in a fresh process; returns the JSON object
    its last output line holds. show_stderr: the worker's stderr goes to this process's (its
    warnings, and its traceback when it fails) instead of being dropped."""
    cmd = [sys.executable, os.path.abspath(script)] + [str(a) for a in worker_args]
    out = subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.PIPE,
                         stderr=None if show_stderr else subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def add_output_args(parser, default_csv):
    """--csv, the results file, and --overwrite: an existing file is replaced only when asked."""
    parser.add_argument("--csv", default=default_csv, help="CSV output file")
    parser.add_argument("--overwrite", action="store_true", help="replace --csv if it exists")


def check_output(args):
    """Before any work, that --csv may be written (the C++ programs' check_output_file): not a
    folder, not an existing file unless --overwrite, in a folder that exists."""
    path = args.csv
    if os.path.isdir(path):
        sys.exit(f"--csv {path}: is a folder; expected the file to write")
    if os.path.exists(path) and not args.overwrite:
        sys.exit(f"{path} exists: pass --overwrite to replace it")
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        sys.exit(f"--csv {path}: the folder {folder} does not exist")


def cpu_model():
    """lscpu's model name, for the figures' captions."""
    out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    match = re.search(r"Model name:\s*(.*)", out)
    return match.group(1) if match else "cpu"


def write_csv(path, rows):
    """Rows (dicts with the same keys) to a CSV file, the keys as its header."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

