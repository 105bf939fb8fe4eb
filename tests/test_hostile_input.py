"""Bad input, third pass (issue 34): what a hostile user tried after issue 18. Every kind runs
the real CLI and must exit 2 with a message naming the place, no traceback, nothing written
and no Ray started (tests/test_bad_input.py's rules; its count includes these kinds)."""

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from conftest import invoke
from test_bad_input import BASE, DATA, _tree, a_sweep, assert_refused, case, data_dir, ray_started, spec_file  # noqa: F401

SMOKE = Path(__file__).parent.parent / "specs" / "smoke.yaml"


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A folder of things that are not files: a FIFO, a symlink loop, a link to nothing."""
    d = tmp_path_factory.mktemp("odd")
    os.mkfifo(d / "fifo")
    (d / "loop_a").symlink_to(d / "loop_b")
    (d / "loop_b").symlink_to(d / "loop_a")
    (d / "dangling").symlink_to(d / "nowhere")
    (d / "src.txt").write_text("hello world, the quick brown fox\n" * 300)
    return d


def _with_char(char: bytes) -> bytes:
    return BASE.encode().replace(b"name: bad\n", b"name: bad\n# a comment " + char + b"\n", 1)


# ---- the spec's text: control characters, tags, sizes, names ----------------------------------

SPEC_CASES = [
    *(case(f"control-{name}", _with_char(byte), f"line 2, column 13: control character U+{ord(byte.decode()):04X}",
           "printable text")
      for name, byte in (("bell", b"\x07"), ("nul", b"\x00"), ("escape", b"\x1b"), ("delete", b"\x7f"),
                         ("backspace", b"\x08"), ("vertical-tab", b"\x0b"), ("c1-csi", "\x9b".encode()))),
    case("name-256-characters", {"name: bad": "name: " + "n" * 256}, "name: String should have at most 255 characters"),
    case("name-1000-characters", {"name: bad": "name: " + "n" * 1000}, "name: String should have at most 255 characters"),
    *(case(f"tag-{tag.strip('!').replace('/', '-').replace(':', '-')}", {"name: bad": f"name: {tag} {value}"},
           "line 1, column 7", f"the tag {tag} is not allowed")
      for tag, value in (("!!binary", "aGVsbG8="), ("!!set", "{a, b}"), ("!!timestamp", "2024-01-01"),
                         ("!!omap", "[a: 1]"), ("!custom", "x"), ("!!python/name:os.system", "''"))),
    case("tag-on-a-grid-value", {"lr: 0.1": "lr: !!binary MC4x"}, "line 6", "the tag !!binary is not allowed"),
    case("spec-over-256-kib", {"name: bad\n": "name: bad\n# " + "x" * (300 << 10) + "\n"}, "spec.yaml",
         "is over the 256 KiB a spec file may hold"),
    case("literal-values-over-100k", {"seed: [0]": "seed: [" + "0," * 100_001 + "0]"}, "grid.seed",
         "holds more than 100,000 values"),
    case("data-text-dev-zero", {DATA: "data: {text: /dev/zero, seq_len: 32}"}, "data.text",
         "/dev/zero is a character device, not a file or folder"),
    case("data-tokens-dev-zero", {DATA: "data: {tokens: /dev/zero, vocab_size: 256, seq_len: 32}"}, "data.tokens",
         "/dev/zero is a character device"),
    case("data-text-fifo", {DATA: "data: {text: '{odd}/fifo', seq_len: 32}"}, "data.text", "is a FIFO (named pipe)"),
    case("data-text-symlink-loop", {DATA: "data: {text: '{odd}/loop_a', seq_len: 32}"}, "data.text", "is a symlink loop"),
    case("data-tokens-symlink-loop", {DATA: "data: {tokens: '{odd}/loop_a', vocab_size: 256, seq_len: 32}"},
         "data.tokens", "is a symlink loop"),
]


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize("edits,place,value", SPEC_CASES)
def test_bad_spec_text_is_refused(tmp_path, data_dir, odd, command, edits, place, value):  # noqa: F811
    if isinstance(edits, dict):
        edits = {k: v.replace("{odd}", str(odd)) for k, v in edits.items()}
    spec = spec_file(tmp_path, data_dir, edits)
    results = tmp_path / "results"
    result = invoke(command, spec, "--results", results)
    assert isinstance(result.exception, SystemExit), result.exception
    assert_refused(result.output, result.exit_code, results, place, value)
    assert not ray_started()


def test_a_merge_key_with_an_override_is_honoured(tmp_path, data_dir):  # noqa: F811
    """`- {<<: *o, lr: 1.0e-3}`: the key written beside the merge wins (was 'duplicate key lr')."""
    spec = spec_file(tmp_path, data_dir, {"optimizer: [{name: adam, lr: 1.0e-3}, {name: sgd, lr: 0.1, momentum: 0.9}]":
                                          "optimizer: [&o {name: sgd, lr: 0.1, momentum: 0.9}, {<<: *o, lr: 0.3}]"})
    result = invoke("plan", spec, "--results", tmp_path / "r")
    assert result.exit_code == 0, result.output
    from sweep.spec import load_spec

    assert [o.lr for o in load_spec(spec).grid.optimizer] == [0.1, 0.3]


# ---- the spec path itself ----------------------------------------------------------------------

SPEC_PATHS = {  # id -> (path under the odd folder, or an absolute one; what the message says)
    "fifo": ("fifo", "is a FIFO (named pipe), not a spec file"),
    "dev-zero": ("/dev/zero", "is a character device, not a spec file"),
    "symlink-loop": ("loop_a", "is a symlink loop, not a spec file"),
    "dangling-link": ("dangling", "is a link to nothing"),
    "dev-null-child": ("/dev/null/spec.yaml", "no such spec file"),
}


@pytest.mark.parametrize("kind", list(SPEC_PATHS))
@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_spec_path_that_is_no_file_is_named_as_what_it_is(tmp_path, odd, command, kind):
    where, says = SPEC_PATHS[kind]
    path = where if where.startswith("/") else odd / where
    result = invoke(command, path, "--results", tmp_path / "results")
    assert_refused(result.output, result.exit_code, tmp_path / "results", says, str(path))
    assert not ray_started()


# ---- --results: empty, unwritable, or resolving into a sweep's tables --------------------------

RESULTS = {  # id -> (the --results value, given the sweep folder; what the message says)
    "empty": (lambda s: "", "names no folder or URI"),
    "blank": (lambda s: "  ", "names no folder or URI"),
    "proc": (lambda s: "/proc/x", "cannot create folders in /proc"),
    "under-a-device": (lambda s: "/dev/null/x", "/dev/null is a character device, not a folder"),
    "link-to-metrics": (lambda s: s.parent / "link-metrics", "only `sweep run` writes"),
    "link-to-trials": (lambda s: s.parent / "link-trials", "only `sweep run` writes"),
    "dotdot-into-runs": (lambda s: f"{s}/../{s.name}/runs", "only `sweep run` writes"),
}


@pytest.fixture(scope="module")
def linked(a_sweep):  # noqa: F811
    for name, target in (("link-metrics", "metrics"), ("link-trials", "trials"), ("link-runs", "runs")):
        link = a_sweep.parent / name
        if not link.exists():
            link.symlink_to(a_sweep / target)
    (a_sweep.parent / "spec.yaml").write_text(BASE)
    (a_sweep.parent / "src.txt").write_text("hello world\n" * 500)
    return a_sweep


@pytest.mark.parametrize("verb", ["run", "plan", "train"])
@pytest.mark.parametrize("kind", list(RESULTS))
def test_results_that_names_nothing_or_resolves_into_a_sweep_is_refused(linked, verb, kind):
    target, says = RESULTS[kind]
    before = _tree(linked)
    args = [verb, linked.parent / "spec.yaml", *(["--trial", "0"] if verb == "train" else []), "--results", target(linked)]
    result = invoke(*args)
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert _tree(linked) == before and not ray_started()


LINKED_OUT = {  # id -> the output path through a link or `..`, given the sweep folder
    "link-to-metrics": lambda s: f"{s.parent}/link-metrics/evil.parquet",
    "link-to-runs": lambda s: f"{s.parent}/link-runs/new/x.csv",
    "link-to-trials": lambda s: f"{s.parent}/link-trials/t0/x.csv",
    "dotdot-into-curves": lambda s: f"{s}/../{s.name}/curves/x.csv",
}
OUT_VERBS = {
    "query": lambda s, out: ["query", s, "SELECT * FROM runs", "--out", out],
    "report": lambda s, out: ["report", s, "--out", out.rsplit(".", 1)[0], "--format", "svg"],
    "data-prepare": lambda s, out: ["data", "prepare", s.parent / "src.txt", "--out", out.rsplit(".", 1)[0]],
    "run": lambda s, out: ["run", s.parent / "spec.yaml", "--results", out.rsplit(".", 1)[0]],
    "train": lambda s, out: ["train", s.parent / "spec.yaml", "--trial", "0", "--results", out.rsplit(".", 1)[0]],
    "plan": lambda s, out: ["plan", s.parent / "spec.yaml", "--results", out.rsplit(".", 1)[0]],
}


@pytest.mark.parametrize("verb", list(OUT_VERBS))
@pytest.mark.parametrize("kind", list(LINKED_OUT))
def test_a_link_into_a_sweeps_tables_is_judged_by_where_it_leads(linked, verb, kind):
    """Paths are resolved before they are judged (was: `--results <link to S/metrics>` wrote a
    whole sweep inside S/metrics)."""
    before = _tree(linked)
    result = invoke(*OUT_VERBS[verb](linked, LINKED_OUT[kind](linked)))
    assert result.exit_code == 2, result.output
    assert "only `sweep run` writes" in result.output and "Traceback" not in result.output, result.output
    assert _tree(linked) == before and not ray_started()


@pytest.mark.parametrize("verb", ["report", "data-prepare"])
def test_an_empty_out_is_refused(linked, verb):
    args = {"report": ["report", linked, "--out", ""],
            "data-prepare": ["data", "prepare", linked.parent / "src.txt", "--out", ""]}[verb]
    before = _tree(linked)
    result = invoke(*args)
    assert result.exit_code == 2 and "names no folder or URI" in result.output, result.output
    assert _tree(linked) == before


# ---- run.lock that cannot be parsed ------------------------------------------------------------

LOCKS = {  # id -> what run.lock holds (None: a folder named run.lock); what status says
    "json-list": ("[1, 2]", "a JSON list, not an object"),
    "pid-a-word": (json.dumps({"host": "h", "pid": "abc", "start": 1, "expires": 2}), 'its pid is "abc"'),
    "pid-a-bool": (json.dumps({"host": "h", "pid": True, "start": 1, "expires": 2}), "its pid is true"),
    "pid-huge": (json.dumps({"host": "h", "pid": 10 ** 20, "start": 1, "expires": 2}), "is no process id"),
    "no-host": (json.dumps({"pid": 5, "start": 1, "expires": 2}), "it has no host"),
    "expires-a-word": (json.dumps({"host": "h", "pid": 5, "start": 1, "expires": "soon"}), 'its expires is "soon"'),
    "not-json": ("host=h pid=5", "not JSON"),
    "empty": ("", "it is empty"),
    "not-utf8": ("\udcff", "not JSON"),
    "a-folder": (None, "it is a folder, not a lock file"),
    "over-64-kib": ("[" + "1," * 40_000 + "1]", "it holds over 65536 bytes"),
}


def _write_lock(sweep: Path, content) -> None:
    lock = sweep / "run.lock"
    if lock.is_dir():
        import shutil

        shutil.rmtree(lock)
    elif lock.exists():
        lock.unlink()
    if content is None:
        (lock / "inside").mkdir(parents=True)
    else:
        lock.write_bytes(content.encode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("kind", list(LOCKS))
def test_status_names_a_lock_that_cannot_be_parsed(tmp_path, kind):
    """Was: AttributeError ([1,2]), ValueError (pid 'abc'), IsADirectoryError (a folder)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_store import Synthetic

    (Synthetic("s").trials(sizes=(32,), seeds=(0,), optimizers=("adam",))
     .rows(steps=(0, 10))
     .write(tmp_path))
    content, says = LOCKS[kind]
    _write_lock(tmp_path / "s", content)
    result = invoke("status", tmp_path / "s")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    said = " ".join(result.output.split())
    assert "run.lock: stale" in said and says in said, result.output


@pytest.mark.parametrize("kind", list(LOCKS))
def test_a_lock_that_cannot_be_parsed_is_taken_over_with_a_warning(tmp_path, kind):
    from resultstore.lock import SweepLock
    from resultstore.writer import ResultsStore

    store = ResultsStore(tmp_path, "s")
    (tmp_path / "s").mkdir()
    content, says = LOCKS[kind]
    _write_lock(tmp_path / "s", content)
    with SweepLock(store, "sweep train") as lock:
        assert lock.warning and "cannot be parsed" in lock.warning and says in lock.warning, lock.warning
        assert SweepLock(store).holder()["pid"] == os.getpid()
    assert not (tmp_path / "s" / "run.lock").exists()
    if content is None:  # a folder is moved aside, never deleted
        assert list((tmp_path / "s" / "quarantine").glob("run.lock.*/inside"))
    assert not list((tmp_path / "s").glob("run.lock.*.tmp"))


# ---- SQL: parsed, one SELECT over the sweep's tables ------------------------------------------

SQL = {  # id -> (the query, what the message says)
    "commented-create": ("/* c */ CREATE TABLE x AS SELECT 1", "CREATE changes nothing here"),
    "line-commented-drop": (" -- hi\nDROP TABLE runs", "DROP changes nothing here"),
    "read-csv-host-file": ("SELECT * FROM read_csv('/etc/hostname')", "read_csv(...) is a table function"),
    "read-parquet-in-join": ("SELECT * FROM runs JOIN read_parquet('/x.parquet') USING (trial_id)", "read_parquet(...)"),
    "read-json-in-from-list": ("SELECT * FROM runs, read_json('/x')", "read_json(...) is a table function"),
    "read-call-in-select": ("SELECT read_csv('/etc/hostname')", "would read a file outside the sweep"),
    "six-thousand-terms": ("SELECT " + "+".join(["1"] * 6000), "over 4,000 terms"),
    "thousand-concat-terms": ("SELECT " + " || ".join(["'a'"] * 1000) + " FROM runs", "nested over 200 deep"),
    "thousand-modulo-terms": ("SELECT step FROM metrics WHERE " + " % ".join(["step"] * 1000) + " > 0",
                              "nested over 200 deep"),
    "concat-of-columns-in-brackets": ("SELECT (" + " || ".join(["trial_id"] * 300) + ") FROM runs", "nested over 200 deep"),
    "or-chain": ("SELECT * FROM runs WHERE " + " OR ".join(["seed = 1"] * 500), "nested over 200 deep"),
    "case-of-300-branches": ("SELECT CASE " + " ".join(f"WHEN seed = {i} THEN {i}" for i in range(300)) + " END FROM runs",
                             "nested over 200 deep"),
    "brackets-too-deep": ("SELECT " + "(" * 100 + "1" + ")" * 100 + " FROM runs", "brackets nested over 64 deep"),
    "two-statements": ("SELECT 1; SELECT 2", "one statement only"),
    "select-into": ("SELECT * INTO copy FROM runs", "INTO is refused"),
    "attach": ("ATTACH '/tmp/x.db' AS x", "ATTACH changes nothing here"),
    "delete-in-cte": ("WITH d AS (DELETE FROM runs) SELECT 1", "DELETE is refused"),
    "unknown-table": ("SELECT * FROM secrets", "no table secrets"),
    "qualified-table": ("SELECT * FROM main.runs", "names a table outside the sweep"),
    "unclosed-string": ("SELECT 'x FROM runs", "is not closed"),
    "unclosed-comment": ("SELECT 1 /* FROM runs", "is not closed"),
    "empty": ("  ;  ", "names no statement"),
    "not-a-select": ("SELEC 1", "starts with 'SELEC'"),
}


@pytest.mark.parametrize("kind", list(SQL))
def test_query_runs_one_select_over_the_sweeps_tables(a_sweep, kind):  # noqa: F811
    sql, says = SQL[kind]
    result = invoke("query", a_sweep, sql)
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output


WHERE = {  # id -> (--where of `probe sae`, what the message says)
    "statement-after": ("1 = 1; DROP TABLE runs", "one statement only"),
    "host-file-subquery": ("trial_id IN (SELECT * FROM read_csv('/etc/hostname'))", "read_csv(...) is a table function"),
    "another-table": ("trial_id IN (SELECT trial_id FROM metrics)", "no table metrics"),
}


@pytest.mark.parametrize("kind", list(WHERE))
def test_probe_where_is_checked_as_sql(a_sweep, kind):  # noqa: F811
    where, says = WHERE[kind]
    result = invoke("probe", "sae", a_sweep, "--where", where)
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert not ray_started() and not (a_sweep / "run.lock").exists()


# ---- places that answer slowly or not at all: bounded, exit 2 ----------------------------------


@pytest.fixture(scope="module")
def silent_server():
    """A loopback TCP port that accepts and says nothing (not a Ray GCS)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    server.close()


ADDRESSES = {  # id -> (--address given the silent server, what the message says)
    "port-1": (lambda s: "127.0.0.1:1", "cannot connect within 5 s (Connection refused)"),
    "no-port": (lambda s: "127.0.0.1", "expected HOST:PORT"),
    "not-ray": (lambda s: s, "but not a Ray cluster's head"),
    "ray-client-not-ray": (lambda s: f"ray://{s}", "but not a Ray Client server"),
}


@pytest.mark.parametrize("verb", ["run", "probe-sae"])
@pytest.mark.parametrize("kind", list(ADDRESSES))
def test_a_ray_address_that_is_not_a_cluster_is_refused_in_seconds(linked, silent_server, verb, kind):
    address, says = ADDRESSES[kind]
    before = _tree(linked)
    args = (["run", linked.parent / "spec.yaml", "--results", linked.parent / "fresh"] if verb == "run"
            else ["probe", "sae", linked])
    result = invoke(*args, "--address", address(silent_server))
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert _tree(linked) == before and not (linked.parent / "fresh").exists() and not ray_started()


def test_an_unreachable_gs_bucket_is_refused_in_bounded_time(linked):
    """Was: nothing printed for 240 s (pyarrow retries GCS for 15 minutes). No credentials and no
    GCS reachable from here (or from CI): exit 2 naming the store, well inside a minute."""
    import time

    t0 = time.monotonic()
    result = invoke("plan", linked.parent / "spec.yaml", "--results", "gs://no-such-bucket-issue-34/r")
    assert result.exit_code == 2 and "gs://no-such-bucket-issue-34/r/bad" in result.output, result.output
    assert "Traceback" not in result.output and time.monotonic() - t0 < 60


# ---- data prepare: sources and outputs that are not files or folders ---------------------------

PREPARE = {  # id -> (argv after `data prepare`, given the odd folder; what the message says)
    "source-fifo": (lambda d: [d / "fifo", "--out", d / "o"], "is a FIFO (named pipe), not a text file or folder"),
    "source-dev-zero": (lambda d: ["/dev/zero", "--out", d / "o"], "is a character device, not a text file or folder"),
    "source-symlink-loop": (lambda d: [d / "loop_a", "--out", d / "o"], "is a symlink loop"),
    "out-fifo": (lambda d: [d / "src.txt", "--out", d / "fifo"], "is a FIFO (named pipe), not a regular file or folder"),
    "out-symlink-loop": (lambda d: [d / "src.txt", "--out", d / "loop_a"], "is a symlink loop, not a regular file or folder"),
    "out-under-a-device": (lambda d: [d / "src.txt", "--out", "/dev/null/x"], "under /dev: not a place for output"),
    "out-in-proc": (lambda d: [d / "src.txt", "--out", "/proc/x"], "under /proc: not a place for output"),
}


@pytest.mark.parametrize("kind", list(PREPARE))
def test_data_prepare_names_what_is_no_file_or_folder(odd, kind):
    argv, says = PREPARE[kind]
    before = sorted(p.name for p in odd.iterdir())
    result = invoke("data", "prepare", *argv(odd))
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert sorted(p.name for p in odd.iterdir()) == before


KINDS = (len(SPEC_CASES) + len(SPEC_PATHS) + 3 * len(RESULTS) + len(LINKED_OUT) * len(OUT_VERBS) + 2
         + 2 * len(LOCKS) + len(SQL) + len(WHERE) + 2 * len(ADDRESSES) + 1 + len(PREPARE))
"""Kinds of bad input in this module, counted as test_bad_input counts its own (a spec case once
though run and plan both try it; a place under each verb that takes it; a lock by status and by
the takeover)."""


# ---- issue 50: one rule for locations (URIs) and for written paths, every verb -----------------

LOCATIONS = {  # id -> (a sweep location or results root, what the message says)
    "ftp": ("ftp://x/y", "scheme ftp:// is not supported"),
    "http": ("http://example.com/s", "scheme http:// is not supported"),
    "s3-no-bucket": ("s3://", "no bucket"),
    "s3-triple-slash": ("s3:///", "no bucket"),
    "gs-no-bucket": ("gs://", "no bucket"),
    "gcs-no-bucket": ("gcs:///x", "no bucket"),
    "s3-without-slashes": ("s3:bucket/x", "looks like a URI without its //"),
    "gs-one-slash": ("gs:/bucket", "looks like a URI without its //"),
    "empty": ("", "empty"),
    "blank": ("   ", "empty"),
}
LOCATION_VERBS = {
    "status": lambda loc, s: ["status", loc],
    "verify": lambda loc, s: ["verify", loc],
    "query": lambda loc, s: ["query", loc, "SELECT 1"],
    "report": lambda loc, s: ["report", loc],
    "reuse": lambda loc, s: ["run", s.parent / "spec.yaml", "--results", s.parent, "--reuse", loc, "--dry-run"],
    "run-results": lambda loc, s: ["run", s.parent / "spec.yaml", "--results", loc],
    "plan-results": lambda loc, s: ["plan", s.parent / "spec.yaml", "--results", loc],
}
_BLANK_RESULTS = "names no folder or URI"  # open_store's own word for an empty --results


@pytest.mark.parametrize("verb", list(LOCATION_VERBS))
@pytest.mark.parametrize("kind", list(LOCATIONS))
def test_a_location_that_names_no_store_is_refused_by_every_verb(linked, tmp_path, monkeypatch, verb, kind):
    """Was: `--reuse ftp://x/y` a traceback, `status s3:///` an ArrowInvalid, `--results s3://` a
    local folder named `s3:` written, `status ""` "no sweep found"."""
    monkeypatch.chdir(tmp_path)
    loc, says = LOCATIONS[kind]
    before = _tree(linked)
    result = invoke(*LOCATION_VERBS[verb](loc, linked))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert says in result.output or (verb.endswith("-results") and _BLANK_RESULTS in result.output), result.output
    assert _tree(linked) == before and not ray_started() and list(tmp_path.iterdir()) == []


WRITTEN = {  # id -> (the output path, given the odd folder and the sweep; what the message says)
    "fifo": (lambda o, s: f"{o}/fifo", "FIFO"),
    "proc": (lambda o, s: "/proc/x", "under /proc"),
    "sys": (lambda o, s: "/sys/x", "under /sys"),
    "under-dev-null": (lambda o, s: "/dev/null/x", "under /dev"),
    "dev-null": (lambda o, s: "/dev/null", "under /dev"),
    "sweep-metrics": (lambda o, s: f"{s}/metrics/x", "only `sweep run` writes"),
    "dotdot-into-trials": (lambda o, s: f"{s}/../{s.name}/trials/x", "only `sweep run` writes"),
}
WRITTEN_VERBS = {
    "query": lambda s, out: ["query", s, "SELECT * FROM runs", "--out", out + (".csv" if "fifo" not in out else "")],
    "report": lambda s, out: ["report", s, "--out", out],
    "next": lambda s, out: ["next", s.parent / "spec.yaml", "--results", s.parent, "--out", out],
}


@pytest.mark.parametrize("verb", list(WRITTEN_VERBS))
@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_written_path_is_a_new_path_or_a_regular_file_outside_every_sweep(linked, odd, verb, kind):
    """One rule for written paths: never a FIFO (the writer would block for ever), a device or
    /proc, never inside a sweep after realpath, `sweep next` included."""
    target, says = WRITTEN[kind]
    out = target(odd, linked)
    if verb == "query" and kind == "fifo":
        out = f"{odd}/fifo.csv"
        if not os.path.exists(out):
            os.mkfifo(out)
    before = _tree(linked)
    result = invoke(*WRITTEN_VERBS[verb](linked, out))
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert _tree(linked) == before


KINDS += len(LOCATIONS) * len(LOCATION_VERBS) + len(WRITTEN) * len(WRITTEN_VERBS)
