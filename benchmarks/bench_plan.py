"""`sweep plan` on a 10,000-trial grid (budget: under 1 s).

    python benchmarks/bench_plan.py

Writes a spec with 10 sizes x 5 optimisers x 2 norms x 4 rotations x 25 seeds = 10,000 trials
to a temporary folder and times the whole CLI command in a fresh process, median of 3.
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
name: big
train: {tokens_per_param: 20, batch_size: 64}
grid:
  model: [%s]
  optimizer: [{name: adam, lr: 3.0e-3}, {name: adam, lr: 1.0e-3}, {name: sgd, lr: 0.3},
              {name: rotated_adam, lr: 3.0e-3}, {name: rotated_adam, lr: 1.0e-3}]
  norm: [layernorm, rmsnorm_scalar]
  rotation: [none, shared, {mode: partial, group_size: 1}, independent]
  seed: [%s]
""" % (", ".join(f"{{depth: {d}}}" for d in range(1, 11)), ", ".join(str(s) for s in range(25)))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "big.yaml"
        spec.write_text(SPEC)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "sweep.cli", "plan", str(spec), "--results", tmp],
                                  capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            assert done.returncode == 0, done.stderr
        print(done.stdout.strip().splitlines()[-1])
        print(f"sweep plan, 10,000 trials: median {statistics.median(times):.2f} s of {['%.2f' % t for t in times]}")


if __name__ == "__main__":
    main()
