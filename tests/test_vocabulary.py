"""resultstore/vocabulary.py: the one place the metrics table's names are spelled. A tiny real
training run writes exactly the vocabulary, every name analysis reads is in it, the stored
strings never change, and no module of study or analysis spells one of them itself."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from resultstore import vocabulary as v

ROOT = Path(__file__).resolve().parents[1]

STORED = {
    "sites": ["resid", "attn_in", "mlp_in", "mlp_act", "attn", "model"],
    "bases": ["stored", "random", "computation", "neuron", "heads", "uniform", "w8a8", "w4a4"],
    "metrics": ["kurtosis", "neuron_kurtosis", "outlier_dims_abs", "outlier_dims_rel", "max_abs", "max_median_ratio",
                "top1_share", "top4_share", "kurtosis_sd", "kurtosis_median", "kurtosis_rank_p", "top1_share_rank_p",
                "dettmers_outliers", "quant_loss_delta", "quant_loss_delta_se"],
    "sinks": ["first_mass", "delimiter_mass", "null_mass", "sink_heads"],
}
"""The strings kept stores hold (docs/stores): a rename here breaks every store written before."""

ALLOW = {
    ("study/train.py", "model"): "the checkpoint's key for the model's state dict",
    ("study/rotation.py", "attn"): "a rotation generator's stream name",
    ("study/attribution.py", "max_abs"): "a dims table column",
    ("analysis/report/render.py", "max_abs"): "the checks summary's column",
    ("analysis/report/kurtosis.py", "kurtosis"): "the report section's name",
    ("analysis/identity.py", "model"): "the config's model section",
    ("analysis/labels.py", "model"): "the model site's readable name",
    ("analysis/charts/sinks.py", "uniform"): "the chart frame's column of the reference level",
}
"""(module, name) -> why a vocabulary spelling stays quoted there ("*": every name)."""


def _classes() -> dict[str, type]:
    return {"sites": v.Site, "bases": v.Basis, "metrics": v.Metric, "sinks": v.Sink}


def _constants(cls: type) -> list[str]:
    return [value for key, value in vars(cls).items() if key.isupper()]


def test_every_name_is_spelled_as_stored_and_has_a_one_line_meaning():
    meanings = {"sites": v.SITES, "bases": v.BASES, "metrics": v.METRICS, "sinks": v.SINK_METRICS}
    for kind, cls in _classes().items():
        assert _constants(cls) == STORED[kind], kind
        assert list(meanings[kind]) == STORED[kind], kind
        assert all(type(name) is str for name in meanings[kind])  # plain strings: frames hold them as String
        for name, meaning in meanings[kind].items():
            assert meaning and "\n" not in meaning and len(meaning) < 100, name
    assert v.NAMES == {n for names in STORED.values() for n in names}
    assert len(v.NAMES) == sum(map(len, STORED.values()))  # no name in two kinds
    assert set(v.PROBE_METRICS) | set(v.RANK_P) | set(v.RANK_P.values()) <= set(v.METRICS)
    assert set(v.QUANT_SCHEMES) <= set(v.BASES)


def test_a_tiny_training_run_writes_exactly_the_vocabulary():
    from study.config import TrialConfig
    from study.train import MemorySink, train

    cfg = TrialConfig(model={"d_model": 32, "n_layers": 2, "n_heads": 2}, data={"seq_len": 16},
                      optimizer={"name": "adam", "lr": 3e-3},
                      train={"steps": 2, "batch_size": 4, "eval_every": 2, "eval_batch": {"sequences": 2},
                             "checkpoint_every": 0, "invariance_check": False})
    sink = MemorySink()
    assert train(cfg, sink).status == "done"
    rows = sink.tables["metrics"]
    sites, bases = {r["site"] for r in rows}, {r["basis"] for r in rows}
    metrics = {r["metric"] for r in rows}
    assert sites == set(v.SITES) and bases == set(v.BASES)
    assert metrics == set(v.METRICS) | set(v.SINK_METRICS)
    dims = sink.tables["dims"]
    assert dims and {(r["site"], r["basis"]) for r in dims} <= {(s, b) for s in v.SITES for b in v.BASES}


def _read_names() -> set[str]:
    """Every site, basis and metric name analysis declares it reads: section metrics, fit specs,
    the report's site and measure tables, the charts' titles of measures, and the defaults of
    every ``site``, ``basis``, ``metric`` and ``measure`` parameter."""
    import analysis.attribution
    import analysis.charts.optimum
    import analysis.charts.size
    import analysis.charts.training
    import analysis.charts.versus
    import analysis.queries
    from analysis import labels, optimum, optimum_exact, query_base, selection, width_trend
    from analysis.charts import sinks as sink_charts
    from analysis.charts.style import REFERENCES
    from analysis.report import content, fits, privilege, sinks

    names: set[str] = set()
    for section in content.SECTIONS:
        names |= set(section.metrics)
    for spec in fits.DEFAULT_FITS:
        if spec.site is not None:
            names |= {spec.metric, spec.site, spec.basis}
    for pairs in (selection.COMPUTATION_SITES, [query_base.CONTROL], labels.SITE_NAMES, labels.BASIS_SERIES,
                  [(s, b) for s, b, _ in privilege.SHARE_SITES], [(s, b) for s, (b, _) in privilege.SITES.items()]):
        names |= {n for pair in pairs for n in pair}
    names |= {*privilege.MEASURES, *privilege.MEASURES.values(), *optimum.MEASURES, *width_trend.WORDS, *REFERENCES,
              *sinks.MEASURES, sinks.SITE, sinks.BASIS, sinks.UNIFORM, *sink_charts.MEASURE_TITLES}
    modules = (analysis.queries, selection, optimum, width_trend, optimum_exact, analysis.attribution, analysis.charts.training,
               analysis.charts.size, analysis.charts.optimum, analysis.charts.versus)
    for module in modules:
        for _, fn in inspect.getmembers(module, inspect.isfunction):
            for p in inspect.signature(fn).parameters.values():
                if p.name in ("site", "basis", "metric", "measure") and isinstance(p.default, str):
                    names.add(p.default)
    return names


def test_every_name_analysis_reads_is_in_the_vocabulary():
    names = _read_names()
    assert not names - v.NAMES, sorted(names - v.NAMES)
    assert len(names & v.NAMES) >= 25  # the scan above found the report's names (not an empty pass)


def _quoted(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant spelling a vocabulary name, ``__all__`` left out."""
    tree = ast.parse(path.read_text())
    exported = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                for n in ast.walk(node.value)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in v.NAMES
            and id(node) not in exported]


@pytest.mark.parametrize("package", ["study", "analysis"])
def test_no_module_spells_a_vocabulary_name_itself(package):
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {name!r}" for line, name in _quoted(path)
                  if (rel, name) not in ALLOW and (rel, "*") not in ALLOW]
    assert not found, "use resultstore.vocabulary's names (Site, Basis, Metric, Sink):\n" + "\n".join(found)


def test_the_allow_list_is_still_needed():
    """Every allowed spelling is still there: a module moved onto the vocabulary leaves the list."""
    for (rel, name), why in ALLOW.items():
        quoted = {n for _, n in _quoted(ROOT / rel)}
        assert (quoted if name == "*" else name in quoted), f"{rel}: {name!r} ({why}) is gone: drop it from ALLOW"
