from pathlib import Path

import pytest

from corpus_fixtures import stand_in_corpus
from sweep.spec import SpecError, load_spec

SPECS = sorted((Path(__file__).parent.parent / "specs").glob("*.yaml"))

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
    assert spec.name == path.stem


def test_good_spec(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert [o.name for o in spec.grid.optimizer] == ["adam", "sgd", "rotated_adam"]
    assert spec.grid.seed == [0]


@pytest.mark.parametrize("old,new,expected", [
    ("{name: rotated_adam, lr: 1.0e-3}", "{name: rotated_adam, lr: -1}", "grid.optimizer[2].lr: Input should be greater than 0 (line 8)"),
    ("{name: sgd, lr: 0.1}", "{name: sgdd, lr: 0.1}", "grid.optimizer[1].name:"),
    ("train: {steps: 5}", "train: {steps: 0}", "train.steps: Input should be greater than 0 (line 2)"),
    ("train: {steps: 5}", "train: {steps: 5, stepz: 3}", "train.stepz: unknown key"),
    ("n_heads: 2}", "n_heads: 3}", "grid.model[0]: d_model (32) must be divisible by n_heads (3)"),
    ("group_size: 2}", "group_size: 3}", "grid.rotation[1]: rotation.group_size (3) must be in 1..n_layers (2) (with grid.model[0]) (line 9)"),
    ("rotation: [none,", "rotation: [nonee,", "grid.rotation[0]"),
    ("name: t", "name: t\ndata: {text: /no/such/file.txt}", "data.text: /no/such/file.txt does not exist"),
    ("name: t", "name: t\nresources: {cpu: 0}", "resources.cpu"),
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
