"""run_sweep: the trials not yet complete -> Ray Tune -> the results store."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from resultstore import uri
from resultstore.ids import science_hash
from resultstore.schema import UNSUCCESSFUL, Status
from resultstore.writer import ResultsStore
from study.config import TrialConfig
from sweep.spec import SpecError, SweepSpec


__all__ = ["SweepOutcome", "LOOPBACK", "address_problem", "check_resources", "ladder_divergences", "run_sweep", "record_errors"]


@dataclass(frozen=True)
class SweepOutcome:
    """What a run did: trials already complete, launched, and the final status of each."""

    total: int
    skipped: int
    launched: int
    statuses: dict[str, Status | Literal["missing"]]
    """Each launched trial's runs-table status, or "missing": no runs row at all."""
    wall_s: float
    notes: tuple[str, ...] = ()  # warnings for the user: lock taken over, files quarantined, rows written by the driver
    ladder: frozenset[str] = frozenset()
    """Launched trials that diverged inside an lr ladder (see ladder_divergences): expected."""
    not_started: frozenset[str] = frozenset()
    """Trials whose turn came after the launch deadline: they returned without training (no row)."""

    @property
    def failed(self) -> list[str]:
        """Launched trials that failed or diverged, ladder divergences included."""
        return [t for t, s in self.statuses.items() if s in UNSUCCESSFUL]

    @property
    def missing(self) -> list[str]:
        """Launched trials with no runs row at all (killed before they could write one), less those
        the launch deadline kept from starting."""
        return [t for t, s in self.statuses.items() if s == "missing" and t not in self.not_started]

    @property
    def unexpected(self) -> list[str]:
        """What makes `sweep run` exit 1: failed, diverged outside an lr ladder, or no runs row."""
        return [t for t in self.failed if t not in self.ladder] + self.missing


def ladder_divergences(runs) -> set[str]:
    """The diverged trials inside an lr ladder: each diverged runs row whose config differs from a
    done row's only in `optimizer.lr` (same seed, same everything else). Such a point bounds the
    lr from above; it is an expected outcome of an lr search, not a failure of the sweep.
    `runs`: runs rows (trial_id, status, config_json); configs are compared by the science hash
    of their `config_json` without `optimizer.lr` (resultstore.ids, the hash config_id uses),
    plus the seed. A row without a readable config_json is never a ladder point."""

    def key(text: str | None) -> tuple[str, object, object] | None:
        try:
            config = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(config, dict) or not isinstance(config.get("optimizer"), dict):
            return None
        return science_hash(config, ("optimizer.lr",)), config.get("seed"), config["optimizer"].get("lr")

    rows = [(t, s, key(c)) for t, s, c in zip(runs["trial_id"].to_list(), runs["status"].to_list(),
                                              runs["config_json"].to_list())]
    done: dict[tuple, set] = {}
    for _, status, k in rows:
        if status == "done" and k is not None:
            done.setdefault(k[:2], set()).add(k[2])
    return {t for t, status, k in rows
            if status == "diverged" and k is not None and done.get(k[:2], set()) - {k[2]}}


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _loopback_only() -> None:
    """Make this process's Ray use 127.0.0.1 as its node address. Ray 2.60 on Linux rewrites a
    loopback node address to the machine's outward IP (and then listens on every interface); its
    macOS/Windows setting (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: single-node Ray on loopback) keeps
    it, and Ray's servers then bind 127.0.0.1 only. Set for the processes Ray starts from here too."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; ray may be imported already


ADDRESS_TIMEOUT_S = 5.0
"""How long `--address` gets to answer a connection before the run is refused."""


def address_problem(address: str | None) -> str | None:
    """Why the Ray cluster at `address` (or RAY_ADDRESS) cannot be joined, found in at most
    ADDRESS_TIMEOUT_S (nothing listening, a host that does not resolve, a malformed address);
    None when it answers, or when there is none to check ("auto", "local", none given). Ray's
    own connect retries for minutes and prints nothing meanwhile."""
    import socket

    given = address or os.environ.get("RAY_ADDRESS")
    if not given or given in ("auto", "local"):
        return None
    option = "--address" if address else "RAY_ADDRESS"
    client = given.startswith("ray://")
    text = given.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        return f"{option} {given}: expected HOST:PORT (e.g. 10.0.0.5:6379, or ray://HOST:10001 for Ray Client)"
    what = "a Ray Client server" if client else "a Ray cluster's head (its GCS port, 6379 by default)"
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_TIMEOUT_S)
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return f"{option} {given}: cannot connect within {ADDRESS_TIMEOUT_S:g} s ({why}); expected {what} there"
    with conn:
        # Ray's GCS and Ray Client are gRPC servers: they answer HTTP/2's preface with SETTINGS.
        # Accepted, then closed or reset before that answer: something listens, not gRPC.
        try:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            reply = conn.recv(9)
        except OSError:
            reply = b""
    if len(reply) < 9 or reply[3] != 4:
        return f"{option} {given}: something answers there, but not {what} (it does not speak gRPC)"
    return None


def _init_ray(address: str | None, num_cpus: int | None):
    import ray

    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our progress bar replaces Tune's tables
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    # The job (not the cluster) forwards a custom S3 endpoint to its workers; never credentials.
    env = uri.env_for_workers()
    runtime_env = {"env_vars": env} if env else None
    if address:  # joining: the cluster's own settings stay as they are
        host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
        if host in LOOPBACK:  # a cluster on loopback is reached over loopback, as itself
            _loopback_only()
        ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
    else:  # a private local Ray: every service on loopback, no dashboard
        _loopback_only()
        _start_watchdog()  # before Ray starts: it records Ray's processes from their first moment
        # address="local": a new private instance, never a cluster someone else started here.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, dashboard_host="127.0.0.1",
                 _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False,
                 runtime_env=runtime_env)
    return ray


# The driver's local Ray goes with the driver, whatever kills it (SIGKILL included). Ray binds
# its own children (raylet, gcs_server) to the driver with PR_SET_PDEATHSIG, but the raylet's
# children (ray::DashboardAgent, ray::RuntimeEnvAgent, idle workers) notice the raylet's death
# only after a ~60 s health check. This watchdog, a child of the driver in a session of its own
# (a Ctrl-C to the terminal's group does not take it first), records the driver's descendants
# every 0.2 s; when the driver is gone (its parent pid changes) it SIGKILLs each recorded process
# still alive (checked by its start time: never a reused pid), and their descendants, then exits.
_WATCHDOG = r"""
import os, signal, sys, time
driver, me = int(sys.argv[1]), os.getpid()

def table():
    kids, start = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(d))
        start[int(d)] = fields[19]
    return kids, start

def below(roots, kids):
    out, stack = set(), list(roots)
    while stack:
        for pid in kids.get(stack.pop(), ()):
            if pid not in out and pid != me:
                out.add(pid)
                stack.append(pid)
    return out

seen = {}
while os.getppid() == driver:
    kids, start = table()
    seen.update({pid: start[pid] for pid in below([driver], kids) if pid in start})
    time.sleep(0.2)
for _ in range(3):  # what the dying processes started meanwhile goes too
    kids, start = table()
    alive = {pid for pid, t in seen.items() if start.get(pid) == t}
    seen.update({pid: start[pid] for pid in below(alive, kids) if pid in start})
    for pid in alive | below(alive, kids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.2)
"""
_watchdog = None


def _start_watchdog() -> None:
    """Start the watchdog above (once per driver process; Linux only: it reads /proc)."""
    global _watchdog
    import subprocess

    if _watchdog is not None or not sys.platform.startswith("linux"):
        return
    _watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid())], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _ray_initialized() -> bool:
    import ray

    return ray.is_initialized()


def check_resources(ray, demands: dict[str, dict[str, float]], *, autoscaling: bool = False) -> None:
    """Fail before starting when a trial asks for more than any node has. On a cluster that may
    autoscale (one we joined) GPU nodes can start at zero: say so on stderr and let them come."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    best = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in ("CPU", "GPU")}
    _check_against(best, demands, "the largest node has", autoscaling)
    # a multi-worker trial's workers may spread over nodes, but all of them must fit at once
    everything = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    _check_against(everything, {t: _all_workers(w) for t, w in demands.items() if w.get("workers", 1) > 1},
                   "the whole cluster has", autoscaling)


def _all_workers(want: dict[str, float]) -> dict[str, float]:
    """A multi-worker trial's resources all together (workers x the per-worker cpu and gpu)."""
    n = want.get("workers", 1)
    return {"cpu": want["cpu"] * n, "gpu": want["gpu"] * n, "all_workers": n > 1}


def _check_against(best: dict[str, float], demands: dict[str, dict[str, float]], where: str,
                   autoscaling: bool = False) -> None:
    for trial_id, want in demands.items():
        if want["cpu"] > best["CPU"] or want["gpu"] > best["GPU"]:
            loc = "workers" if want.get("all_workers") else None
            message = (f"resources: trial {trial_id} needs cpu={want['cpu']:g} gpu={want['gpu']:g}"
                       f"{' (all its workers)' if loc else ''}, but {where} cpu={best['CPU']:g} gpu={best['GPU']:g}")
            if not autoscaling:
                error = SpecError(message)
                error.loc = ("resources", loc or ("gpu" if want["gpu"] > best["GPU"] else "cpu"))  # the spec's line
                raise error
            print(f"note: {message} now; waiting for the cluster's autoscaler to add one", file=sys.stderr)
            return


def _bounded_concurrency(ray, demands: dict[str, dict[str, float]], max_concurrent: int | None) -> int | None:
    """Multi-worker trials hold no resources of their own (their Ray Train workers do), so Tune
    would start every trial at once and leave most waiting for workers: start only as many as
    the cluster can give all their workers, the largest trial counted for each."""
    multi = [_all_workers(w) for w in demands.values() if w.get("workers", 1) > 1]
    if not multi:
        return max_concurrent
    total = ray.cluster_resources()
    fits = min(math.floor(total.get(k.upper(), 0.0) / max(w[k] for w in multi))
               for k in ("cpu", "gpu") if max(w[k] for w in multi) > 0)
    return max(1, min(fits, max_concurrent or fits))


def run_sweep(
    spec: SweepSpec,
    trials: list[TrialConfig],
    store: ResultsStore,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    on_start: Callable[[list[TrialConfig]], list | None] | None = None,
    reuse: ResultsStore | None = None,
    launch_deadline: float | None = None,
) -> SweepOutcome:
    """Run every trial of `trials` not yet complete in `store`, on a local or remote Ray.
    `store`: the sweep's ResultsStore, opened and checked writable by the caller (`sweep run`
    does it once, at the CLI: sweep.cli_store.open_store). `on_start(todo)` sees the trials
    about to run and may return Ray Tune callbacks. `reuse`: another sweep's store whose finished
    trials of `trials` are copied into `store` first (ResultsStore.copy_finished), not run.
    `launch_deadline` (epoch seconds): a trial whose turn comes later returns without training
    (SweepOutcome.not_started); those running then finish."""
    t0 = time.perf_counter()
    from sweep.store_health import load_error

    with store.writing("sweep run", load_check=load_error) as notes:  # LockHeld (exit 2) when another writer holds this sweep
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        if reuse is not None:
            here = store.completed_ids()
            copied = store.copy_finished(reuse, [t.trial_id for t in trials if t.trial_id not in here])
            print(f"copied {len(copied)} finished trial(s) from {reuse.uri} (the same trial ids: not trained again)")
        return _run_locked(spec, trials, store, address, max_concurrent, num_cpus, on_start, t0, notes, launch_deadline)


def _run_locked(spec, trials, store, address, max_concurrent, num_cpus, on_start, t0, notes,
                launch_deadline=None) -> SweepOutcome:
    done = store.completed_ids()
    # Largest first: the long trials start early and the small ones fill the gaps at the end.
    todo = sorted((t for t in trials if t.trial_id not in done), key=lambda t: -t.flops_per_token * t.total_tokens)
    demands = {t.trial_id: spec.resources.for_params(t.params) for t in todo}
    if todo and not (address or os.environ.get("RAY_ADDRESS")) and not _ray_initialized():
        # A local Ray gets this machine: refuse what it cannot hold before printing or starting anything.
        import torch

        local = {"CPU": float(num_cpus or os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
        _check_against(local, {t: _all_workers(w) for t, w in demands.items()}, "this machine has")
    callbacks = on_start(todo) if on_start is not None else None
    if not todo:
        return SweepOutcome(len(trials), len(trials), 0, {}, time.perf_counter() - t0, tuple(notes))
    ray = _init_ray(address, num_cpus)
    from ray import tune

    check_resources(ray, demands, autoscaling=bool(address or os.environ.get("RAY_ADDRESS")))

    def resources(config: dict):
        want = config["resources"]
        if want.get("workers", 1) > 1:  # a light driver; Ray Train reserves the workers itself
            return tune.PlacementGroupFactory([{"CPU": 0, "memory": 2**20}])  # a token: bundles cannot be empty
        return tune.PlacementGroupFactory([{"CPU": want["cpu"], "GPU": want["gpu"]}])

    max_concurrent = _bounded_concurrency(ray, demands, max_concurrent)

    param_space = {
        "results": store.root,  # each worker opens its own store from it
        "cwd": os.getcwd(),  # relative paths in the spec (data.text, data.tokens) mean what they meant here
        "launch_deadline": launch_deadline,
        "lock_token": store.holding,  # each write checks the driver still holds the sweep
        "point": tune.grid_search([
            {"trial": t.model_dump_json(), "trial_id": t.trial_id, "resources": demands[t.trial_id]}
            for t in todo
        ]),
    }

    tuner = tune.Tuner(
        tune.with_resources(run_holding, lambda config: resources(config["point"])),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent,
            trial_name_creator=lambda trial: trial.config["point"]["trial_id"],
            trial_dirname_creator=lambda trial: trial.config["point"]["trial_id"],
        ),
        run_config=tune.RunConfig(
            name=time.strftime("run-%Y%m%d-%H%M%S"),
            storage_path=f"{store.path}/ray",  # a bucket's path within store.fs (its endpoint)
            storage_filesystem=None if store.local else store.fs,
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[*(callbacks or []), warning_relay()],
            verbose=0,
        ),
    )
    grid, problem = _fit(tuner)
    full = store_full(store)
    if full:  # Tune's records truncated by the full disk (an UnpicklingError or EOFError): the disk is the reason
        problem = None
    fresh = [n for n in (problem, full) if n]
    for note in fresh:
        print(f"warning: {note}", file=sys.stderr)
    notes = list(notes) + fresh
    statuses = store.statuses()
    notes += record_errors(store, {t.trial_id: t for t in todo}, grid, statuses) if grid is not None else []
    runs = store.read("runs", ["trial_id", "status", "config_json"])
    statuses = dict(zip(runs["trial_id"].to_list(), runs["status"].to_list()))
    launched = {t.trial_id: statuses.get(t.trial_id, "missing") for t in todo}
    ladder = frozenset(ladder_divergences(runs) & set(launched))
    tune_points = [((r.config or {}).get("point", {}).get("trial_id"), r.metrics or {}) for r in (grid or [])]
    not_started = frozenset(t for t, last in tune_points if last.get("not_started") and launched.get(t) == "missing")
    return SweepOutcome(len(trials), len(trials) - len(todo), len(todo), launched, time.perf_counter() - t0,
                        tuple(notes), ladder, not_started)


def run_holding(config: dict) -> None:
    """sweep.trainable.run_trial under the driver's run.lock: every write of the trial's store first
    checks the lock is still the driver's (a driver paused past its lease and taken over stops)."""
    from resultstore.lock import HOLDING_ENV
    from sweep.trainable import run_trial

    if config.get("lock_token"):
        os.environ[HOLDING_ENV] = config["lock_token"]
    try:
        run_trial(config)
    finally:
        os.environ.pop(HOLDING_ENV, None)


def _fit(tuner):
    """(Tune's result grid, None), or (None, why) when Tune itself failed after the trials ran
    (e.g. reading back a truncated error.pkl on a full disk: an EOFError or UnpicklingError
    that names nothing). Tune's own tracebacks are kept off the console meanwhile: each trial's
    error is in its runs row and in `sweep status`."""
    import logging

    quiet = [logging.getLogger(name) for name in ("ray.tune", "ray.train")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.CRITICAL)
    try:
        return tuner.fit(), None
    except Exception as exc:  # noqa: BLE001 (KeyboardInterrupt still ends the run)
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"Ray Tune could not read back its trial records ({type(exc).__name__}: {reason or 'no message'})"
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)


def store_full(store: ResultsStore, below: int = 1 << 20) -> str | None:
    """'the disk is full' (with the space left) when a local store has under `below` bytes free."""
    if not store.local:
        return None
    import shutil

    try:
        free = shutil.disk_usage(store.path).free
    except OSError:
        return None
    if free >= below:
        return None
    return (f"the results store's disk is full ({free:,} bytes free at {store.path}): trials could not write their "
            "rows (No space left on device); free space and run again: finished trials are kept")


def warning_relay():
    """A Tune callback printing each trial's warnings (a result with a "warning", e.g. a checkpoint
    set aside) on the driver's stderr: a worker's own stderr stays in its node's log files."""
    from ray.tune import Callback

    class WarningRelay(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get("warning"):
                print(f"warning: {result['warning']}", file=sys.stderr, flush=True)

    return WarningRelay()


def record_errors(store: ResultsStore, todo: dict[str, TrialConfig], grid, statuses: dict[str, str]) -> list[str]:
    """A trial that errored without leaving a runs row (its error came before training, or the
    worker could not write the row): the driver writes the failed row from Tune's error; when
    even that fails, the row goes to a local fallback folder. Returns one line per row written."""
    from sweep.trainable import failed_row

    notes = []
    for result in grid:
        trial_id = (result.config or {}).get("point", {}).get("trial_id")
        if result.error is None or trial_id not in todo or statuses.get(trial_id) not in (None, "missing"):
            continue
        row = failed_row(todo[trial_id], f"{type(result.error).__name__}: {str(result.error).strip()[-2000:]}")
        try:
            store.write_run(row)
            notes.append(f"trial {trial_id} failed before it could record itself; the driver wrote its failed "
                         f"row to {store.uri}/runs/{trial_id}.parquet")
        except (OSError, ValueError) as exc:
            fallback = ResultsStore(Path.cwd() / "sweep-fallback", store.sweep)
            fallback.write_run(row)
            notes.append(f"trial {trial_id} failed and its row could not be written to {store.uri} "
                         f"({str(exc).splitlines()[0][:120]}); written to {fallback.uri}/runs/{trial_id}.parquet")
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return notes
