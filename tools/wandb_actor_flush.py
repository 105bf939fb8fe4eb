"""Does an offline W&B run survive its Ray actor being killed right after wandb.finish()? Ray's
WandbLoggerCallback kills each trial's logging actor as soon as the actor's run() returns, and
wandb.finish() can return before W&B's service has written the run; sweep/tracking.py's logging
actor therefore calls wandb.teardown() after finish. This starts N actors that each log one
short offline run, kills each as soon as it returns, and counts the run files left as a bare
7-byte header (nothing written).

Usage: python tools/wandb_actor_flush.py plain|teardown N FOLDER
(2026-12-04, one loaded CPU core: plain 2, 2 and 4 of 6 left as a bare header; teardown 0 of 6, twice)."""
import glob
import os
import sys
import time

import ray

mode, n, root = sys.argv[1], int(sys.argv[2]), os.path.abspath(sys.argv[3])
env = {"WANDB_MODE": "offline", "WANDB_DIR": root, "WANDB_SILENT": "true"}
os.makedirs(root, exist_ok=True)
ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env})


@ray.remote(num_cpus=0)
class Logger:
    def run(self, i: int) -> int:
        import wandb

        run = wandb.init(project="flush", id=f"r{i:03d}", config={"i": i})
        for step in range(5):
            run.log({"loss": 1.0 / (step + 1)})
        wandb.finish()
        if mode == "teardown":
            wandb.teardown()
        return i


actors = [Logger.remote() for _ in range(n)]
for actor, done in zip(actors, [a.run.remote(i) for i, a in enumerate(actors)]):
    ray.get(done)
    ray.kill(actor)  # what Ray's callback does once run() returns
time.sleep(3)
sizes = [os.path.getsize(p) for p in glob.glob(f"{root}/wandb/offline-run-*/run-*.wandb")]
print(f"{mode}: {len(sizes)} runs, {sum(s <= 7 for s in sizes)} left as a bare header")
ray.shutdown()
