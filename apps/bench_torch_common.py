"""What the side-by-side PyTorch benchmark scripts share: the peer's environment and running one
measurement in a fresh process."""
import json
import os
import subprocess
import sys


def child_env():
    """The environment of both sides: OpenBLAS 0.3.21 misdetects this CPU unless told its core,
    and PyTorch's threads busy-wait against OpenBLAS's unless OpenMP waits passively."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return env


def run_worker(script, worker_args):
    """Runs `script --worker ...` with this Python in a fresh process; returns the JSON object
    its last output line holds."""
    cmd = [sys.executable, os.path.abspath(script)] + [str(a) for a in worker_args]
    out = subprocess.run(cmd, check=True, env=child_env(), capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
