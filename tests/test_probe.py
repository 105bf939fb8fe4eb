"""sweep/probe.py and `sweep probe sae`: SAEs over finished trials on a real local Ray, locally and
on s3:// (moto's server on loopback); a re-run is a no-op; bad input is refused up front."""

import shutil
import sys

import polars as pl
import pyarrow.fs as pafs
import pytest
import torch

from conftest import invoke
from analysis.load import load
from resultstore import uri as storage
from resultstore.writer import ResultsStore
from study.config import TrialConfig
from study.train import train
from study.sae import SAEConfig
from sweep.probe import file_variant, plan_probe

TRIAL = {"model": {"d_model": 16, "n_layers": 2, "n_heads": 2}, "norm": "rmsnorm_scalar",
         "data": {"seq_len": 16}, "train": {"steps": 8, "batch_size": 4, "eval_every": 4, "eval_batch": {"sequences": 2}},
         "sweep": "tiny"}
FAST = ["--tokens", "256", "--steps", "30", "--k", "2", "--expansion", "2", "--cpus", "1"]


def ray_running() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A sweep folder with two done trials (adam, sgd), each with final weights; never modified."""
    root = tmp_path_factory.mktemp("results")
    store = ResultsStore(root, "tiny")
    for opt in ({"name": "adam", "lr": 3e-3}, {"name": "sgd", "lr": 0.1}):
        cfg = TrialConfig.model_validate({**TRIAL, "optimizer": opt})
        train(cfg, store.sink(cfg.trial_id))
    return root / "tiny"


@pytest.fixture
def sweep_dir(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "tiny")
    return tmp_path / "tiny"


def test_a_done_trial_stores_its_final_weights(trained):
    store = ResultsStore(trained.parent, "tiny")
    ids = set(store.read("runs")["trial_id"].to_list())
    assert len(ids) == 2 and store.has_final_weights() == ids
    import io

    state = torch.load(io.BytesIO(store.read_final_weights(sorted(ids)[0])), weights_only=False)
    assert state["trial_id"] == sorted(ids)[0] and "unembed.weight" in state["model"]
    from analysis.load import SAE_SCHEMA

    empty = load(trained).sae.collect()  # a store the probe never saw: an empty frame, the contract's columns
    assert empty.height == 0 and dict(empty.schema) == SAE_SCHEMA


def test_probe_writes_every_unit_once_and_a_rerun_is_a_noop(sweep_dir):
    r = invoke("probe", "sae", sweep_dir, "--layers", "1,2", *FAST)
    assert r.exit_code == 0, r.output
    assert not ray_running()  # the local Ray it started is shut down
    sae = load(sweep_dir).sae.collect()
    key = ["trial_id", "layer", "basis", "sae_optimizer"]
    assert sae.height == 2 * 2 * 2 * 2 == sae.unique(key).height  # trials x layers x bases x optimisers
    assert sae["fve"].is_finite().all() and sae["loss_recovered"].is_finite().all()
    assert (sae["decoder_kurtosis_null"] == 3 * 15 / 17).all() and (sae["l0"] <= 2).all()
    # SGD is rotation-equivariant and the random-basis SAE starts from the stored one's start,
    # rotated: the two SAEs are the same up to float32 rounding, so their latents agree.
    sgd = sae.filter(pl.col("sae_optimizer") == "sgd")
    assert sgd["agreement"].min() > 0.99, sgd
    files = {p: p.stat().st_mtime_ns for p in (sweep_dir / "sae").iterdir()}
    assert len(files) == 2 * 2 * 2

    again = invoke("probe", "sae", sweep_dir, "--layers", "1,2", *FAST)
    assert again.exit_code == 0, again.output
    assert "0 (trial, layer, SAE optimiser) to train, 8 already done" in again.output
    assert {p: p.stat().st_mtime_ns for p in (sweep_dir / "sae").iterdir()} == files
    assert not ray_running()


def test_an_interrupted_probe_redoes_only_what_has_no_file(sweep_dir):
    store = ResultsStore(sweep_dir.parent, "tiny")
    tid = store.read("runs")["trial_id"].sort()[0]
    def rows(layer, opt, bases):
        return [{"trial_id": tid, "layer": layer, "basis": b, "sae_optimizer": opt, "fve": 0.5,
                 "sae_config_json": SAEConfig(optimizer=opt).model_dump_json()} for b in bases]

    store.write_sae(tid, 2, "adam", rows(2, "adam", ("stored", "random")))
    store.write_sae(tid, 1, "sgd", rows(1, "sgd", ("stored",)))  # only one basis: not finished
    plan = plan_probe(store, layers=[1, 2])
    assert plan.done == 1
    assert sorted((t.trial_id == tid, t.layer, t.sae_optimizers) for t in plan.tasks) == [
        (False, 1, ("adam", "sgd")), (False, 2, ("adam", "sgd")), (True, 1, ("adam", "sgd")), (True, 2, ("sgd",))]
    # issue 50: a probe with another SAE config is another unit, not "done" by the default's rows,
    # and its file sits beside the default's instead of replacing it
    other = plan_probe(store, layers=[1, 2], sae_json=SAEConfig(k=4).model_dump_json())
    assert other.done == 0 and len(other.tasks) == 4
    assert file_variant(SAEConfig()) == "" and file_variant(SAEConfig(optimizer="sgd")) == ""
    assert file_variant(SAEConfig(k=4)) == file_variant(SAEConfig(k=4, optimizer="sgd")) != ""


@pytest.mark.parametrize("case, args, message", [
    ("no sweep", ["{missing}"], "no such folder"),
    ("bad where", ["{sweep}", "--where", "optimiser = 'adam'"], "--where:"),
    ("no match", ["{sweep}", "--where", "optimizer = 'lion'"], "no done trial matches --where"),
    ("layer", ["{sweep}", "--layers", "0,3"], "--layers: layer 3 is out of range for trial"),
    ("layers syntax", ["{sweep}", "--layers", "last"], "--layers: 'last' is not a comma-separated list"),
    ("k", ["{sweep}", "--k", "0"], "--k: Input should be greater than or equal to 1"),
    ("k over latents", ["{sweep}", "--k", "100000"], "--k: 100000 is more than the 128 latents of trial"),  # was accepted
    ("k over latents at expansion 1", ["{sweep}", "--k", "17", "--expansion", "1"],
     "--k: 17 is more than the 16 latents of trial"),
    ("optimiser", ["{sweep}", "--sae-optimizers", "adam,lion"], "--sae-optimizers: lion"),
    ("no weights", ["{sweep}"], "no final weights"),
])
def test_bad_input_is_refused_up_front(sweep_dir, tmp_path, case, args, message):
    if case == "no weights":
        victim = sorted((sweep_dir / "trials").iterdir())[0]
        (victim / "final.pt").unlink()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = invoke("probe", "sae", *[a.format(sweep=sweep_dir, missing=tmp_path / "nope") for a in args])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    assert not ray_running()


def test_probe_on_s3_results(trained, s3):
    fs, _ = storage.filesystem("s3://bars/probe")
    pafs.copy_files(str(trained), "bars/probe/tiny", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    r = invoke("probe", "sae", "s3://bars/probe/tiny", "--layers", "2", "--sae-optimizers", "sgd", *FAST)
    assert r.exit_code == 0, r.output
    sae = load("s3://bars/probe/tiny").sae.collect()
    assert sae.height == 2 * 2 and set(sae["basis"]) == {"stored", "random"}
    again = invoke("probe", "sae", "s3://bars/probe/tiny", "--layers", "2", "--sae-optimizers", "sgd", *FAST)
    assert again.exit_code == 0 and "0 (trial, layer, SAE optimiser) to train, 2 already done" in again.output


def test_report_draws_the_sae_section_or_notes_its_absence(sweep_dir):
    from analysis.report import build
    from analysis.sae import sae_summary

    before = build(load(sweep_dir), n_boot=10)
    assert "sae" not in before.charts
    assert sum("No SAE probe rows" in n for n in before.notes) == 1
    store = ResultsStore(sweep_dir.parent, "tiny")
    runs = store.read("runs")
    for i, tid in enumerate(runs["trial_id"].to_list()):
        for layer in (1, 2):
            for opt in ("adam", "sgd"):
                store.write_sae(tid, layer, opt, [
                    {"trial_id": tid, "layer": layer, "basis": b, "sae_optimizer": opt, "d_model": 16, "fve": 0.5 + i / 10,
                     "dead_fraction": 0.1, "loss_recovered": 0.9, "decoder_kurtosis": 4.0 + (b == "stored"),
                     "decoder_kurtosis_null": 3 * 15 / 17, "decoder_max_share": 0.5, "agreement": 0.8}
                    for b in ("stored", "random")])
    summary = sae_summary(load(sweep_dir))
    assert summary.height == 2 * 2 * 2 * 2 * 6  # trials x depths x bases x SAE optimisers x metrics
    assert set(summary["depth"]) == {"middle", "last"} and (summary["n"] == 1).all() and summary["ci_half"].is_null().all()
    excess = summary.filter((pl.col("metric") == "decoder_kurtosis_excess") & (pl.col("basis") == "stored"))
    assert excess["mean"].to_list() == pytest.approx([5.0 - 3 * 15 / 17] * excess.height)
    after = build(load(sweep_dir), n_boot=10)
    assert "sae" in after.charts and after.captions["sae"].endswith("one seed.")
    assert not any("No SAE probe rows" in n for n in after.notes)
    after.charts["sae"].to_dict()  # a valid Vega-Lite spec


def test_the_random_basis_is_one_haar_draw_per_seed_and_layer():
    """Not one basis for every trial: that is one draw whose offset every trial inherits."""
    from sweep.probe import random_basis

    q = random_basis(0, 2, 16)
    assert torch.allclose(q.double() @ q.double().T, torch.eye(16, dtype=torch.float64), atol=1e-5)
    assert torch.equal(q, random_basis(0, 2, 16))  # fixed: a re-run sees the same basis
    for other in (random_basis(1, 2, 16), random_basis(0, 4, 16)):
        assert (q - other).abs().max() > 0.1
