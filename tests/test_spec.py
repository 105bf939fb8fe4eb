from pathlib import Path
import re

import numpy as np
import pytest

from corpus_fixtures import stand_in_corpus
from sweep.spec import SpecError, load_spec

SPECS = sorted((Path(__file__).parent.parent / "specs").rglob("*.yaml"))

GOOD = """\
name: t
train: {steps: 5}
grid:
  model: [{d_model: 32, n_layers: 2, n_heads: 2}]
  optimizer:
    - {name: adam, lr: 1.0e-3}
    - {name: sgd, lr: 0.1}
    - {name: rotated_adam, lr: 1.0e-3}
  rotation: [none, {mode: partial, group_size: 2}]
"""


def write(tmp_path, text):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_validates(path, tmp_path, monkeypatch):
    stand_in_corpus(path, tmp_path, monkeypatch)  # specs on a prepared corpus: a tiny one of its vocabulary
    spec = load_spec(path)
    # a spec's sweep is its file's name; a spec that adds trials to another sweep's store (an lr
    # ladder, more seeds) is named <sweep>_<part>.yaml
    assert spec.name == path.stem or path.stem.startswith(spec.name + "_")


def test_good_spec(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert [o.name for o in spec.grid.optimizer] == ["adam", "sgd", "rotated_adam"]
    assert spec.grid.seed == [0]


@pytest.mark.parametrize("old,new,expected", [
    ("{name: rotated_adam, lr: 1.0e-3}", "{name: rotated_adam, lr: -1}", "grid.optimizer[2].lr: Input should be greater than 0, got -1 (line 8)"),
    ("{name: sgd, lr: 0.1}", "{name: sgdd, lr: 0.1}", "grid.optimizer[1].name:"),
    ("train: {steps: 5}", "train: {steps: 0}", "train.steps: Input should be greater than 0, got 0 (line 2)"),
    ("train: {steps: 5}", "train: {steps: 5, stepz: 3}", "train.stepz: unknown key (expected one of: steps, tokens,"),
    ("n_heads: 2}", "n_heads: 3}", "grid.model[0].n_heads: d_model (32) must be divisible by n_heads (3) (line 4)"),
    ("group_size: 2}", "group_size: 3}", "grid.rotation[1].group_size: rotation.group_size (3) must be in 1..n_layers (2) (with grid.model[0]) (line 9)"),
    ("rotation: [none,", "rotation: [nonee,", "grid.rotation[0]"),
    ("name: t", "name: t\ndata: {text: /no/such/file.txt}", "data.text: no such file or folder: /no/such/file.txt (line 2)"),
    ("name: t", "name: t\nresources: {cpu: 0}", "resources.cpu"),
    ("{name: sgd, lr: 0.1}", "{name: sgd, lr: 0.1, lr_scaling: {reference_params: 0, exponent: 1}}",
     "grid.optimizer[1].lr_scaling.reference_params: Input should be greater than 0, got 0 (line 7)"),
    ("{name: sgd, lr: 0.1}", "{name: sgd, lr: 0.1, lr_scaling: {reference_params: 1.0e+6, exponent: 1/0}}",
     "grid.optimizer[1].lr_scaling.exponent: a fraction with denominator 0: 1/0 (line 7)"),
    ("{name: sgd, lr: 0.1}", "{name: sgd, lr: 0.1, lr_scaling: {reference_params: 1.0e+6, exponent: -1/3, n0: 2}}",
     "grid.optimizer[1].lr_scaling.n0: unknown key (expected one of: reference_params, exponent), got 2 (line 7)"),
    ("{name: sgd, lr: 0.1}", "{name: sgd, lr: 0.1, lr_scaling: {reference_params: 1.0e-300, exponent: 400}}",
     "grid.optimizer[1].lr_scaling: gives lr inf at 24,896 non-embedding parameters (must be finite and > 0) "
     "(with grid.model[0]), got {reference_params: 1.0e-300, exponent: 400} (line 7)"),
    ("train: {steps: 5}", "train: {steps: 5, batch_scaling: {reference_params: 1, exponent: 2/3, multiple: 0}}",
     "train.batch_scaling.multiple: Input should be greater than 0, got 0 (line 2)"),
    ("train: {steps: 5}", "train: {steps: 5, batch_scaling: {reference_params: 1, exponent: 20}}",
     "train.batch_scaling: gives a batch of"),
    ("train: {steps: 5}", "train: {steps: 5, warmup_tokens_per_param: -1}",
     "train.warmup_tokens_per_param: Input should be greater than 0, got -1 (line 2)"),
])
def test_bad_specs_name_the_place(tmp_path, old, new, expected):
    assert old in GOOD
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, GOOD.replace(old, new)))
    assert expected in str(info.value)
    assert "spec.yaml" in str(info.value)


def test_yaml_syntax_error_has_a_line(tmp_path):
    with pytest.raises(SpecError, match=r"line 3.*invalid YAML"):
        load_spec(write(tmp_path, "name: t\ntrain: {steps: 5}\ngrid: a: b\n"))


def test_missing_file():
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec("/no/such/spec.yaml")


def test_ladder_errors_name_the_list_element_and_its_line(tmp_path):
    text = GOOD.replace("- {name: sgd, lr: 0.1}", "- name: sgd\n      momentum: 0.9\n      lr: [0.1, 0.3, -1]")
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert "grid.optimizer[1].lr[2]: Input should be greater than 0, got -1 (line 9)" in str(info.value)
    text = GOOD.replace("{name: adam, lr: 1.0e-3}", "{name: adam, lr: 1.0e-3, betas: [[0.9, 0.95], [0.9, 1.5]]}")
    with pytest.raises(SpecError, match=r"grid.optimizer\[0\].betas\[1\]: betas must lie in \[0, 1\), got \[0.9, 1.5\] \(line 6\)"):
        load_spec(write(tmp_path, text))


def test_duplicate_points_give_the_lines_of_both_entries(tmp_path):
    text = GOOD.replace("- {name: sgd, lr: 0.1}", "- {name: sgd, lr: [0.1, 0.3]}\n    - {name: sgd, lr: 0.3}")
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert ("grid.optimizer[2]: the same grid point as grid.optimizer[1].lr[1] (line 7), "
            "got {name: sgd, lr: 0.3} (line 8)") in str(info.value)


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    with pytest.raises(SpecError, match=r"line 3, column 1: invalid YAML: duplicate key 'train' \(first given at line 2\)"):
        load_spec(write(tmp_path, GOOD.replace("train: {steps: 5}", "train: {steps: 5}\ntrain: {steps: 6}")))


def test_exponents_without_a_dot_are_numbers(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("lr: 1.0e-3}\n    - {name: sgd", "lr: 1e-3}\n    - {name: sgd")
                                         .replace("train: {steps: 5}", "train: {tokens_per_param: 2e1}")))
    assert spec.grid.optimizer[0].lr == 1e-3 and spec.train.tokens_per_param == 20.0


def test_cross_field_errors_are_reported_at_their_own_line(tmp_path):
    text = GOOD.replace("train: {steps: 5}", "train:\n  steps: 5\n  eval_batch:\n    seq_len: 999")
    with pytest.raises(SpecError, match=r"train.eval_batch.seq_len: .* exceeds data.seq_len \(128\) \(line 5\)"):
        load_spec(write(tmp_path, text))


def test_rotate_all_is_checked_for_every_optimizer(tmp_path):
    tokens = tmp_path / "t.bin"
    np.random.default_rng(0).integers(0, 10_000, 50_000).astype(np.uint16).tofile(tokens)
    text = (GOOD.replace("name: t", f"name: t\ndata: {{tokens: {tokens}, vocab_size: 10000, seq_len: 16}}")
            .replace("{name: rotated_adam, lr: 1.0e-3}", "{name: rotated_adam, lr: 1.0e-3, rotate: all}"))
    with pytest.raises(SpecError, match=r"grid.optimizer\[2\].rotate: .*10000 x 10000 basis.*\(line 9\)"):
        load_spec(write(tmp_path, text))


def test_non_utf8_is_one_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(GOOD.encode().replace(b"name: t", b"name: t\xe9"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).endswith("line 1: not UTF-8 text (byte 0xe9); save the spec as UTF-8")


def test_a_gpu_share_below_one_caps_each_trials_memory(tmp_path):
    from sweep.grid import expand

    spec = load_spec(write(tmp_path, GOOD + "resources: {cpu: 1, gpu: 0.25, by_size: [{min_params: 1, cpu: 2, gpu: 1}]}\n"))
    assert {t.runtime.gpu_fraction for t in expand(spec)} == {None}  # every trial has >= 1 param: a whole GPU
    spec = load_spec(write(tmp_path, GOOD + "resources: {cpu: 1, gpu: 0.25}\n"))
    assert {t.runtime.gpu_fraction for t in expand(spec)} == {0.25}
    assert {t.runtime.compile for t in expand(spec)} == {"auto"}


def test_plan_may_size_a_corpus_not_prepared_yet_but_run_may_not(tmp_path):
    text = GOOD.replace("name: t", "name: t\ndata: {tokens: not-yet, vocab_size: 50304, seq_len: 64}")
    with pytest.raises(SpecError, match="data.tokens: no such file or folder: not-yet"):
        load_spec(write(tmp_path, text))
    spec = load_spec(write(tmp_path, text), unprepared_ok=True)
    assert spec.data.vocab_size == 50304
    bad = text.replace(", vocab_size: 50304", "")  # nothing to size the models with: still refused
    with pytest.raises(SpecError, match="no such folder"):
        load_spec(write(tmp_path, bad), unprepared_ok=True)


def test_checking_a_spec_and_its_corpus_does_not_import_torch():
    # `sweep plan` and every check before a run stay fast: torch (~0.5 s to import) loads only to train
    import subprocess
    import sys

    spec = Path(__file__).parent.parent / "specs" / "laptop.yaml"
    code = ("import sys; from sweep.grid import expand; from sweep.spec import load_spec; "
            f"expand(load_spec({str(spec)!r})); print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_corpus_must_hold_the_largest_batch_the_size_rule_gives(tmp_path):
    text = tmp_path / "small.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)  # ~18k bytes
    spec = GOOD.replace("name: t", f"name: t\ndata: {{text: {text}, seq_len: 64}}")
    load_spec(write(tmp_path, spec.replace("train: {steps: 5}", "train: {steps: 5, batch_size: 8}")))
    scaled = spec.replace("train: {steps: 5}", "train: {steps: 5, batch_size: 8, "
                          "batch_scaling: {reference_params: 10, exponent: 1, max_batch_size: 4096}}")
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, scaled))
    assert "data.text:" in str(info.value) and "fewer than one batch (train.batch_size 4096 x data.seq_len 64" in str(info.value)


def test_a_corpus_problem_stands_in_the_data_fields_place(tmp_path):
    """The corpus is checked once the spec's values are (study.data.check_corpus), yet reported as
    when the config checked it: beside other fields' problems in field order (name, data, train,
    grid), alone when only spec-wide rules (device, workers) failed, since those are not reached."""
    from sweep.prepare import write_corpus

    folder = tmp_path / "c"
    write_corpus(folder, {"train": np.arange(4000) % 300, "val": np.arange(1000) % 300}, 300)
    raw = bytearray((folder / "val_000000.bin").read_bytes())
    raw[10] ^= 1
    (folder / "val_000000.bin").write_bytes(bytes(raw))
    damaged = GOOD.replace("name: t", f"name: t\ndata: {{tokens: {folder}, seq_len: 16}}")
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, damaged.replace("name: t", "name: 'bad name'").replace("lr: 0.1", "lr: -1")))
    lines = [l.strip() for l in str(info.value).splitlines()[1:]]
    assert [l.split(":")[0] for l in lines] == ["name", "data.tokens", "grid.optimizer[1].lr"], lines
    assert "val_000000.bin does not match its sha256" in lines[1]
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, damaged + "device: cuda\n"))
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].strip().startswith("data.tokens:"), lines


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_plans_on_a_fresh_clone(path, tmp_path, monkeypatch):
    """Issue 48: `sweep plan` of every spec in a copy with no data/ folder exits 0; one that trains
    on a corpus still to prepare says so and names the one command that prepares it."""
    import shutil

    import yaml
    from typer.testing import CliRunner

    from sweep.cli import app
    from sweep.prepare.corpora import corpus_for_folder

    shutil.copytree(path.parent, tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["plan", f"specs/{path.name}", "--results", "results"])
    assert r.exit_code == 0, r.output
    tokens = (yaml.safe_load(path.read_text()).get("data") or {}).get("tokens")
    if tokens is None:
        assert "not prepared yet" not in r.output
    else:
        corpus = corpus_for_folder(tokens)
        assert corpus is not None, f"{path.name}: data.tokens {tokens} is no named corpus's folder"
        assert f"data.tokens {tokens} is not prepared yet" in r.output
        assert f"Prepare it with\n  sweep data prepare {corpus.name}\n" in r.output
    assert not (tmp_path / "data").exists()  # planning prepares nothing


def test_specs_are_laid_out_as_their_readme_says():
    """Issue 47: the examples a user starts from at the top of specs/, one folder per study; the
    README lists exactly those (a new spec or folder is listed, or this fails)."""
    root = Path(__file__).parent.parent / "specs"
    readme = (root / "README.md").read_text()
    top = sorted(p.name for p in root.glob("*.yaml"))
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.rglob("*.yaml")))
    listed_top = sorted(re.findall(r"^\| `([\w.]+\.yaml)` \|", readme, re.M))
    listed_folders = sorted(re.findall(r"^\| `(\w+)/` \|", readme, re.M))
    assert top == listed_top, (top, listed_top)
    assert folders == listed_folders, (folders, listed_folders)
    assert len(top) <= 5, f"specs/ top level is for the examples a user starts from: {top}"
