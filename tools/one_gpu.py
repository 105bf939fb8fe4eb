"""Run specs' trials as processes sharing one GPU (or one CPU box), without Ray, and follow each
lr ladder to the end: after a spec's trials finish, `sweep next`'s plan (sweep.ladder.plan_next)
gives one more lr beyond an edge or seeds 1-2 at a best strictly inside, and those run too.

For a machine lent for minutes that has torch but not Ray: many small trials at once on one GPU,
each its own process with one CPU thread, written into ResultsStores exactly as `sweep run` writes
them (the same trial ids: runtime is not hashed), so `sweep keep` merges them into a kept store.

    python tools/one_gpu.py SPEC [SPEC ...] --results ROOT [--procs 14] [--device cuda]
        [--launch-for 400] [--stop-after 540] [--follow] [--stdlib-corpus DIR]

- Every trial runs with runtime device DEVICE, precision fp32 (full fp32: no autocast, no TF32, so
  a GPU trial differs from a CPU one of the same config only in the order of its sums), compile
  off, one CPU thread.
- Specs are served in the order given; a spec whose round is still running leaves its free slots
  to the next spec. No trial starts after --launch-for seconds; at --stop-after every process is
  ended (a trial cut off leaves no runs row: it is not finished, and the next run starts it again).
- `--stdlib-corpus DIR`: a stdlib corpus cache folder (train.npy, val.npy, meta.json) written by
  another machine's Python: `corpus: stdlib` is the running Python's standard library, so a
  machine with another Python would train on other bytes. The runs rows record its fingerprint.
Each store's run.lock is held throughout, as `sweep run` holds it (and incomplete trials a cut-off
left are moved to quarantine/ first). One line per trial as it ends; a summary per spec at the end.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import multiprocessing as mp
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _use_stdlib_cache(folder: str) -> None:
    """Make `corpus: stdlib` read the given cache folder instead of this Python's sources."""
    import numpy as np

    import study.data as data

    meta = json.loads((Path(folder) / "meta.json").read_text())
    corpus = data.Corpus(train=np.load(Path(folder) / "train.npy", mmap_mode="r"),
                         val=np.load(Path(folder) / "val.npy", mmap_mode="r"), vocab_size=int(meta["vocab_size"]),
                         fingerprint=meta["fingerprint"], description=meta["description"] + " (carried)")
    default = data.DataConfig().val_fraction

    def load(val_fraction: float) -> data.Corpus:
        if val_fraction != default:
            raise ValueError(f"--stdlib-corpus holds the split at val_fraction {default}, not {val_fraction}")
        return corpus

    data._load_stdlib = load


def _train(cfg_json: str, root: str, sweep: str, stdlib: str | None) -> tuple[str, str, float, float]:
    """One trial in this process: (trial_id, status, final val loss, wall seconds)."""
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    if stdlib:
        _use_stdlib_cache(stdlib)
    from resultstore.writer import ResultsStore, StoreSink
    from study.config import TrialConfig
    from sweep.trainable import train_trial  # as `sweep train`: a failed trial gets its failed row

    cfg = TrialConfig.model_validate_json(cfg_json)
    store = ResultsStore(root, sweep)
    summary = train_trial(cfg, store, StoreSink(store, cfg.trial_id))
    return cfg.trial_id, summary.status, summary.final_val_loss, time.perf_counter() - t0


def _serve(specs: list[dict], args: argparse.Namespace, plan_more, t_start: float) -> None:
    """Keep args.procs trials running, specs served in order, until nothing is left to launch or
    the clock says stop; a spec whose round ends asks plan_more for its next trials."""
    ctx = mp.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=args.procs, mp_context=ctx)
    futures: dict[cf.Future, tuple[dict, str]] = {}
    try:
        while True:
            now = time.monotonic() - t_start
            if now < args.launch_for:
                for s in specs:  # fill free slots in spec order
                    while s["queue"] and len(futures) < args.procs:
                        t = s["queue"].pop(0)
                        fut = pool.submit(_train, t.model_dump_json(), args.results, s["spec"].name, args.stdlib_corpus)
                        futures[fut] = (s, t.trial_id)
                        s["running"].add(t.trial_id)
            if not futures:
                break
            left = args.stop_after - (time.monotonic() - t_start)
            if left <= 0:
                print(f"stop: {len(futures)} trials cut off at {args.stop_after:.0f} s", flush=True)
                break
            finished, _ = cf.wait(list(futures), timeout=min(left, 5.0), return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                s, tid = futures.pop(fut)
                s["running"].discard(tid)
                try:
                    tid, status, loss, wall = fut.result()
                    s["ended"].append((tid, status))
                    print(f"{time.monotonic() - t_start:6.0f}s {s['spec'].name} {tid} {status} val {loss:.4f} in {wall:.0f}s", flush=True)
                except Exception:
                    s["ended"].append((tid, "error"))
                    print(f"{time.monotonic() - t_start:6.0f}s {s['spec'].name} {tid} error:\n{traceback.format_exc()}", flush=True)
                if not s["running"] and not s["queue"] and time.monotonic() - t_start < args.launch_for:
                    plan_more(s)
    finally:
        for p in list(getattr(pool, "_processes", {}).values()):
            p.kill()
        pool.shutdown(wait=False, cancel_futures=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--results", required=True)
    ap.add_argument("--procs", type=int, default=14)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--launch-for", type=float, default=400.0, help="seconds after which no trial starts")
    ap.add_argument("--stop-after", type=float, default=540.0, help="seconds after which every process is ended")
    ap.add_argument("--follow", action="store_true", help="run each ladder's next trials (sweep next) as well")
    ap.add_argument("--stdlib-corpus", default=None)
    args = ap.parse_args()
    t_start = time.monotonic()
    if args.stdlib_corpus:
        _use_stdlib_cache(args.stdlib_corpus)  # the driver expands specs with the same corpus
    from resultstore.uri import StorageError
    from resultstore.writer import ResultsStore
    from study.config import RuntimeConfig
    from sweep.grid import expand
    from sweep.ladder import plan_next
    from sweep.spec import load_spec

    runtime = RuntimeConfig(device=args.device, num_threads=1, compile=False, precision="fp32")
    specs = []
    for path in args.specs:
        spec = load_spec(path)
        trials = [t.model_copy(update={"runtime": runtime}) for t in expand(spec)]
        store = ResultsStore(args.results, spec.name)
        done = store.completed_ids() if store.exists() else set()
        specs.append({"path": path, "spec": spec, "trials": trials, "store": store, "queue": [t for t in trials if t.trial_id not in done],
                      "running": set(), "ended": [], "rounds": 1})
        print(f"{path}: {len(trials)} trials, {len(specs[-1]['queue'])} to run -> {store.uri}", flush=True)

    def plan_more(s: dict) -> None:
        if not args.follow:
            return
        runs = s["store"].read("runs")
        ladders = plan_next(s["trials"], runs, s["spec"].grid.seed, 3)
        new = [t.model_copy(update={"runtime": runtime}) for lad in ladders for t in lad.new]
        verdicts = {v: sum(lad.verdict == v for lad in ladders) for v in ("waiting", "extend", "seeds", "complete")}
        print(f"  {s['path']} round {s['rounds']}: {verdicts}; {len(new)} trials next", flush=True)
        if new:
            s["trials"] = [*s["trials"], *new]
            s["queue"] = new
            s["rounds"] += 1

    with contextlib.ExitStack() as held:  # each store's run.lock, as `sweep run` holds it
        for store in {str(s["store"].uri): s["store"] for s in specs}.values():
            try:
                notes = held.enter_context(store.writing("one_gpu.py"))
            except StorageError as exc:  # another writer holds it: nothing started
                print(f"{store.uri}: {exc}", file=sys.stderr)
                sys.exit(2)
            for note in notes:
                print(f"warning: {note}", flush=True)
        for s in specs:
            if not s["queue"]:
                plan_more(s)
        _serve(specs, args, plan_more, t_start)
    for s in specs:
        statuses = [st for _, st in s["ended"]]
        print(f"{s['path']}: {len(statuses)} ended ({statuses.count('done')} done), {len(s['queue'])} never started, "
              f"{s['rounds']} round(s)", flush=True)


if __name__ == "__main__":
    main()
