"""Corpora (stdlib, text, tokens), the by-file split, caching, and the batch samplers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from study import data
from study.config import DataConfig
from study.data import Corpus, check_corpus, eval_batch, load_corpus, sample_batch

# ---- stdlib -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stdlib(tmp_path_factory):
    """(fresh, from-disk-cache, files) with the disk cache in a temp folder."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRIVILEGED_BASES_CACHE", str(cache))
        data._load_stdlib.cache_clear()
        fresh = load_corpus(DataConfig())
        data._load_stdlib.cache_clear()
        cached = load_corpus(DataConfig())
        again = load_corpus(DataConfig())
        assert again is cached  # in-process cache
        yield fresh, cached, cache
    data._load_stdlib.cache_clear()


def test_stdlib_loads_bytes(stdlib):
    fresh, _, _ = stdlib
    assert fresh.vocab_size == 256 and fresh.train.dtype == np.uint8 and fresh.train.ndim == 1
    assert len(fresh.train) > 1_000_000 and len(fresh.val) > 10_000
    assert "stdlib" in fresh.description and len(fresh.fingerprint) == 16


def test_stdlib_disk_cache_is_identical(stdlib):
    fresh, cached, cache = stdlib
    assert isinstance(cached.train, np.memmap)  # read back from the .npy cache
    assert [p.name.startswith("stdlib-") for p in cache.iterdir()] == [True]  # no temp folder left
    assert cached.fingerprint == fresh.fingerprint and cached.description == fresh.description
    np.testing.assert_array_equal(cached.train, fresh.train)
    np.testing.assert_array_equal(cached.val, fresh.val)


def test_stdlib_split_is_by_file_and_deterministic(stdlib):
    fresh, _, _ = stdlib
    root, relpaths = data._stdlib_files()
    assert relpaths == sorted(relpaths) and not any("site-packages" in r for r in relpaths)
    flags = data._split_files(relpaths, 0.05)
    assert 0.02 < sum(flags) / len(flags) < 0.1  # roughly val_fraction of the files
    sizes = [(root / r).stat().st_size for r in relpaths]
    n_val = sum(flags)
    assert len(fresh.val) == sum(s for s, f in zip(sizes, flags) if f) + n_val - 1  # + separators
    assert len(fresh.train) == sum(s for s, f in zip(sizes, flags) if not f) + len(flags) - n_val - 1
    big_val = max((s, r) for s, r, f in zip(sizes, relpaths, flags) if f)[1]
    content = (root / big_val).read_bytes()
    assert content in fresh.val.tobytes() and content not in fresh.train.tobytes()
    assert data._split_files(relpaths, 0.05) == flags  # a pure function of the paths


def test_stdlib_fingerprint_depends_on_split(monkeypatch):
    monkeypatch.setenv("PRIVILEGED_BASES_CACHE", "off")
    a = load_corpus(DataConfig(val_fraction=0.05))
    b = load_corpus(DataConfig(val_fraction=0.2))
    assert a.fingerprint != b.fingerprint and len(b.val) > len(a.val)
    data._load_stdlib.cache_clear()


# ---- text -------------------------------------------------------------------------------------


def test_text_file_tail_split(tmp_path):
    body = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "a.txt").write_bytes(body)
    c = load_corpus(DataConfig(text=str(tmp_path / "a.txt"), seq_len=32, val_fraction=0.1))
    assert c.vocab_size == 256 and c.train.dtype == np.uint8
    assert len(c.val) == 1024 and bytes(c.train) + bytes(c.val) == body
    assert "text file" in c.description


def write_folder(root, n: int) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        rel = f"sub{i % 3}/deeper/f{i:02d}.txt" if i % 2 else f"f{i:02d}.md"
        files[rel] = (f"file {i} " * (20 + i)).encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(files[rel])
    return files


def test_text_folder_split_by_file(tmp_path):
    files = write_folder(tmp_path, 40)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "secret.txt").write_bytes(b"SECRET" * 100)
    (tmp_path / ".notes").write_bytes(b"SECRET" * 100)
    c = load_corpus(DataConfig(text=str(tmp_path), seq_len=8, val_fraction=0.25))
    train, val = bytes(c.train), bytes(c.val)
    assert b"SECRET" not in train + val  # hidden entries skipped
    sep = bytes([data.FILE_SEP])
    in_val = set(val.split(sep))
    assert set(train.split(sep)) | in_val == set(files.values())
    assert set(train.split(sep)).isdisjoint(in_val) and 3 <= len(in_val) <= 20
    flags = data._split_files(sorted(files), 0.25)
    assert in_val == {files[r] for r, f in zip(sorted(files), flags) if f}
    again = data._load_text.__wrapped__(tmp_path.resolve(), 0.25)  # bypass the in-process cache
    assert again.fingerprint == c.fingerprint


def test_tiny_folder_still_gets_both_splits(tmp_path):
    write_folder(tmp_path, 2)
    c = load_corpus(DataConfig(text=str(tmp_path), seq_len=8))
    assert len(c.train) and len(c.val)


# ---- tokens -----------------------------------------------------------------------------------


def test_tokens_bin_uint16(tmp_path):
    ids = (np.arange(5000) * 7 % 500).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    c = load_corpus(DataConfig(tokens=str(tmp_path / "train.bin"), vocab_size=500, seq_len=16))
    assert c.train.dtype == np.uint16 and isinstance(c.train, np.memmap)
    assert len(c.val) == 250
    np.testing.assert_array_equal(np.concatenate([c.train, c.val]), ids)
    with pytest.raises(ValueError, match="vocab_size 400"):
        load_corpus(DataConfig(tokens=str(tmp_path / "train.bin"), vocab_size=400, seq_len=16))


def test_tokens_bin_uint32_for_large_vocab(tmp_path):
    ids = np.arange(3000, dtype=np.uint32) * 31 + 65_000
    ids.tofile(tmp_path / "big.bin")
    c = load_corpus(DataConfig(tokens=str(tmp_path / "big.bin"), vocab_size=200_000, seq_len=16))
    assert c.train.dtype == np.uint32
    np.testing.assert_array_equal(np.concatenate([c.train, c.val]), ids)


def test_tokens_npy(tmp_path):
    ids = np.random.default_rng(0).integers(0, 1000, 4000).astype(np.int32)
    np.save(tmp_path / "t.npy", ids)
    c = load_corpus(DataConfig(tokens=str(tmp_path / "t.npy"), vocab_size=1000, seq_len=16))
    assert c.vocab_size == 1000 and c.train.dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([c.train, c.val]), ids)
    np.save(tmp_path / "neg.npy", np.array([1, -1, 2] * 100, dtype=np.int32))
    with pytest.raises(ValueError, match="negative"):
        load_corpus(DataConfig(tokens=str(tmp_path / "neg.npy"), vocab_size=1000, seq_len=16))
    np.save(tmp_path / "two_d.npy", ids.reshape(40, 100))
    with pytest.raises(ValueError, match="1-D"):
        load_corpus(DataConfig(tokens=str(tmp_path / "two_d.npy"), vocab_size=1000, seq_len=16))


def test_tokens_bin_wrong_size(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x01" * 1001)
    with pytest.raises(ValueError, match="multiple of 2"):
        load_corpus(DataConfig(tokens=str(tmp_path / "odd.bin"), vocab_size=300, seq_len=16))


def test_large_token_files_are_sampled(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "FULL_SCAN_BYTES", 1000)
    monkeypatch.setattr(data, "SCAN_BLOCK_BYTES", 64)
    ids = np.zeros(20_000, dtype=np.uint16)
    ids.tofile(tmp_path / "big.bin")
    c = load_corpus(DataConfig(tokens=str(tmp_path / "big.bin"), vocab_size=10, seq_len=16))
    assert "sampled" in c.description


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["text", "tokens"])
def test_missing_path_names_path_and_field(tmp_path, field):
    missing = str(tmp_path / "nope.bin")
    extra = {"vocab_size": 100} if field == "tokens" else {}
    with pytest.raises(FileNotFoundError, match=f"data.{field}.*nope.bin"):
        load_corpus(DataConfig(**{field: missing}, **extra))


def test_too_short_corpus(tmp_path):
    (tmp_path / "short.txt").write_bytes(b"x" * 1000)
    with pytest.raises(ValueError, match=r"val split has 50 tokens, shorter than data.seq_len \+ 1 = 129"):
        load_corpus(DataConfig(text=str(tmp_path / "short.txt"), seq_len=128))


# ---- batches ----------------------------------------------------------------------------------


TOKENS = np.arange(10_000, dtype=np.uint16) % 997


def test_sample_batch_shapes_shift_and_windows():
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    x, y = sample_batch(TOKENS, 8, 32, g, "cpu")
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    starts = torch.randint(0, len(TOKENS) - 32, (8,), generator=torch.Generator().set_state(state))
    for row, s in zip(x, starts.tolist()):
        np.testing.assert_array_equal(row.numpy(), TOKENS[s : s + 32])


def test_sample_batch_deterministic_from_generator():
    a = sample_batch(TOKENS, 4, 16, torch.Generator().manual_seed(7), "cpu")
    b = sample_batch(TOKENS, 4, 16, torch.Generator().manual_seed(7), "cpu")
    c = sample_batch(TOKENS, 4, 16, torch.Generator().manual_seed(8), "cpu")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])


def test_sample_batch_reaches_the_last_token():
    tokens = np.arange(10, dtype=np.uint8)
    seen = set()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, y = sample_batch(tokens, 8, 8, g, "cpu")  # only starts 0 and 1 fit
        seen |= set(x[:, 0].tolist())
        torch.testing.assert_close(y, x + 1)
    assert seen == {0, 1}  # start 1's window ends at the last token


class CountingArray(np.ndarray):
    gets = 0

    def __getitem__(self, item):
        CountingArray.gets += 1
        return super().__getitem__(item)


def test_sample_batch_is_one_vectorised_gather():
    tokens = TOKENS.view(CountingArray)
    CountingArray.gets = 0
    sample_batch(tokens, 256, 64, torch.Generator().manual_seed(0), "cpu")
    assert CountingArray.gets == 1


def test_sample_batch_too_short():
    with pytest.raises(ValueError, match="shorter than seq_len"):
        sample_batch(TOKENS[:16], 2, 16, torch.Generator(), "cpu")


def test_eval_batch_evenly_spaced_and_fixed():
    val = np.arange(1000, dtype=np.uint16)
    c = Corpus(train=val, val=val, vocab_size=1000, fingerprint="x", description="x")
    x, y = eval_batch(c, 5, 50, "cpu")
    assert x.shape == (5, 50) and x.dtype == torch.int64
    assert x[:, 0].tolist() == [0, 237, 474, 712, 949]  # round(linspace(0, 949, 5))
    assert int(y[-1, -1]) == 999  # the last window ends at the split's end
    x2, _ = eval_batch(c, 5, 50, "cpu")
    assert torch.equal(x, x2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_cuda():
    x, y = sample_batch(TOKENS, 4, 16, torch.Generator().manual_seed(0), "cuda")
    assert x.is_cuda and y.is_cuda
    torch.testing.assert_close(x[:, 1:], y[:, :-1])


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVILEGED_BASES_CACHE", str(tmp_path))
    assert data.cache_dir() == tmp_path
    monkeypatch.setenv("PRIVILEGED_BASES_CACHE", "off")
    assert data.cache_dir() is None
    monkeypatch.delenv("PRIVILEGED_BASES_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert data.cache_dir() == tmp_path / "privileged-bases"
    assert os.fspath(data.cache_dir()).endswith("privileged-bases")


# ---- prepared token folders (sweep data prepare) ----------------------------------------------


def test_sharded_tokens_index_like_one_array():
    rng = np.random.default_rng(1)
    whole = rng.integers(0, 1000, 1000).astype(np.uint16)
    parts = np.split(whole, [7, 300, 301, 650])
    s = data.ShardedTokens(list(parts))
    assert len(s) == 1000 and s.dtype == np.uint16
    idx = np.arange(0, 990, 13)[:, None] + np.arange(11)  # windows straddling every shard boundary
    np.testing.assert_array_equal(s[idx], whole[idx])
    np.testing.assert_array_equal(s[5:320], whole[5:320])
    gen = torch.Generator().manual_seed(0)
    x, y = sample_batch(s, 8, 16, gen, "cpu")
    gen = torch.Generator().manual_seed(0)
    x2, y2 = sample_batch(whole, 8, 16, gen, "cpu")
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_prepared_folder_loads_through_its_manifest(tmp_path):
    from sweep.prepare import write_corpus

    train = (np.arange(3000) % 700).astype(np.uint16)
    val = (np.arange(500) % 11).astype(np.uint16)
    m = write_corpus(tmp_path / "c", {"train": train, "val": val}, vocab_size=700, shard_tokens=1000)
    cfg = check_corpus(DataConfig(tokens=str(tmp_path / "c"), seq_len=16))
    assert cfg.vocab_size == 700  # from the manifest, not the spec
    c = load_corpus(cfg)
    assert isinstance(c.train, data.ShardedTokens) and len(c.train.shards) == 3
    assert isinstance(c.val, np.memmap)  # one shard: the memmap itself
    np.testing.assert_array_equal(c.train[0:3000], train)
    np.testing.assert_array_equal(np.asarray(c.val), val)
    assert c.fingerprint == m["fingerprint"] and "prepared" in c.description
    x, y = eval_batch(c, 4, 16, "cpu")
    assert x.shape == (4, 16) and int(x.max()) < 11


# ---- the config holds values; check_corpus checks the corpus ------------------------------------


def test_a_data_config_reads_nothing_and_check_corpus_locates_the_problem(tmp_path):
    from study.config import FieldError, TrialConfig

    missing = DataConfig(tokens=str(tmp_path / "not-yet"), seq_len=16)  # no I/O: builds, vocab unknown
    assert missing.vocab_size is None
    cfg = TrialConfig(model={"d_model": 16, "n_layers": 1, "n_heads": 2}, optimizer={"name": "adam", "lr": 1e-3},
                      data=missing, train={"steps": 1})
    with pytest.raises(ValueError, match="vocab_size unknown until the corpus is checked"):
        cfg.vocab_size  # never a silent 256
    with pytest.raises(FieldError, match="no such folder") as err:
        check_corpus(missing)
    assert err.value.loc == ("tokens",)
    stated = DataConfig(tokens=str(tmp_path / "not-yet"), vocab_size=50304)
    assert check_corpus(stated) is stated  # `sweep plan` may size a corpus not prepared yet


def test_a_prepared_folder_is_hashed_once_per_process(tmp_path):
    from study.corpus import format
    from sweep.prepare import write_corpus

    write_corpus(tmp_path / "c", {"train": np.arange(3000) % 300, "val": np.arange(500) % 300}, vocab_size=300)
    before = format._verify_shards.cache_info().misses
    for _ in range(3):
        assert check_corpus(DataConfig(tokens=str(tmp_path / "c"), seq_len=16)).vocab_size == 300
    assert format._verify_shards.cache_info().misses == before + 1


def test_the_config_does_not_import_the_reader():
    import subprocess
    import sys

    code = "import sys, study.config; print('study.data' in sys.modules, 'study.corpus.format' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_token_folder_not_prepared_yet_points_at_the_plan_a_missing_file_does_not(tmp_path):
    """A fresh clone's `sweep run specs/english/english.yaml`: the folder does not exist yet, and the
    refusal says where the one command that prepares it is named; a missing .bin is a wrong path."""
    from study.config import FieldError
    from study.data import check_data

    with pytest.raises(FieldError) as info:
        check_data(DataConfig(tokens=str(tmp_path / "shakespeare_bytes"), vocab_size=256, seq_len=16), 2, 16, 2)
    assert str(info.value).endswith(f"no such file or folder: {tmp_path / 'shakespeare_bytes'} (not prepared yet: "
                                    "`sweep plan` of the spec names the command that prepares it)")
    with pytest.raises(FieldError) as info:
        check_data(DataConfig(tokens=str(tmp_path / "ids.bin"), vocab_size=256, seq_len=16), 2, 16, 2)
    assert str(info.value).endswith(f"no such file or folder: {tmp_path / 'ids.bin'}")
