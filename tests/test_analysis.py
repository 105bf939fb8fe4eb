"""analysis/__init__.py: the public names are exactly those before the explicit ``__all__``
(issue 19), ``analysis.load`` is the function, and the heavy modules stay lazy."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# sorted(analysis.__all__) dumped from main before the star imports were removed, plus n_label and
# untuned_choices (issue 33: a fit's n, and the best-lr choices a fit label names); label_axes and
# label_columns for LABEL_AXES and LABEL_COLUMNS (issue 47: a frozen list went stale once a store read stamps another column)
PUBLIC = [
    "ARROW", "BASIS_SERIES", "CHECKS_SCHEMA", "CONFIG_ID", "CONTROL", "CURVES_SCHEMA", "DIMS_SCHEMA",
    "ExponentComparison", "FINISHED", "FamilyComparison", "ID_COLUMNS", "METRICS_SCHEMA",
    "NoSweepError", "PowerLawFit", "QueryError", "RUNS_SCHEMA", "Results", "SAE_SCHEMA", "SCHEMAS",
    "SITE_NAMES", "SIZE_COLUMNS", "STATUSES", "Status", "TABLES", "UNSUCCESSFUL", "axis_labels", "basis_comparison",
    "best_lr", "best_lr_results", "between_seed_halfwidth", "carried", "charts", "compare_exponents", "compare_families",
    "compare_family_values", "config_keys", "config_label", "find_sweep", "fit_curves", "fit_each", "fit_groups", "fit_power_law",
    "fits_table", "group_size_table", "label_axes", "label_columns", "layer_profile", "line_labels", "load", "loss_table",
    "metric_over_training", "n_label", "onset", "per_trial", "quant_penalty", "report", "rotation_label", "runs_table",
    "scale_table", "science_hash", "seed_exponents", "sql", "summarise", "t_critical", "trial_label",
    "trial_labels", "unrotated_table", "untuned_choices", "varying_axes", "versus", "with_ids",
]  # fmt: skip
# the non-module, non-underscore names of dir(analysis) from the same dump, beyond PUBLIC
# (the lazy "charts" and "report" are not attributes until first use)
DIR_EXTRA = ["Any", "TYPE_CHECKING", "annotations"]
EAGER_MODULES = ["fits", "identity", "labels", "load", "power_law", "queries", "selection"]
SCHEMA_NAMES = ["ARROW", "CHECKS_SCHEMA", "CURVES_SCHEMA", "DIMS_SCHEMA", "FINISHED", "METRICS_SCHEMA", "RUNS_SCHEMA",
                "SAE_SCHEMA", "SCHEMAS", "STATUSES", "TABLES", "UNSUCCESSFUL", "Status"]
"""The store contract's names analysis re-exports: resultstore.schema's own objects (no copy)."""
FROM_REPORT = ["DEFAULT_FITS", "FitSpec", "ReportResult", "write_report"]


def _fresh(code: str) -> dict:
    """Run ``code`` after ``import analysis`` in a new interpreter; it prints one JSON value."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", "import analysis, json, sys, types\n" + code], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_public_names_are_those_of_before() -> None:
    got = _fresh(
        "print(json.dumps({'all': analysis.__all__, 'dir': [n for n in dir(analysis) if not n.startswith('_')"
        " and not isinstance(getattr(analysis, n), types.ModuleType)],"
        " 'modules': [n for n in dir(analysis) if isinstance(getattr(analysis, n), types.ModuleType)]}))"
    )
    assert sorted(got["all"]) == PUBLIC
    assert len(got["all"]) == len(set(got["all"]))
    assert sorted(got["dir"]) == sorted({*PUBLIC, *DIR_EXTRA} - {"charts", "report"})
    assert set(EAGER_MODULES) - {"load"} <= set(got["modules"])


def test_each_name_is_its_defining_module_s_object() -> None:
    import importlib

    import analysis

    for module_name in EAGER_MODULES:
        module = importlib.import_module(f"analysis.{module_name}")
        for name in module.__all__:  # a name added to a light module must be listed in analysis.__all__
            assert name in analysis.__all__, (module_name, name)
            assert getattr(analysis, name) is getattr(module, name), (module_name, name)
    from resultstore import schema

    for name in SCHEMA_NAMES:
        assert name in analysis.__all__ and getattr(analysis, name) is getattr(schema, name), name


def test_load_is_the_function_and_the_module_stays_reachable() -> None:
    got = _fresh(
        "from analysis.load import Results, load\n"
        "module = sys.modules['analysis.load']\n"
        "print(json.dumps([callable(analysis.load), isinstance(analysis.load, types.ModuleType),\n"
        "                  analysis.load is module.load is load, Results is analysis.Results]))"
    )
    assert got == [True, False, True, True]


def test_the_report_names_resolve_on_first_use_and_nothing_else_does() -> None:
    got = _fresh(
        "heavy = lambda: sorted(m for m in ('altair', 'vl_convert', 'analysis.charts', 'analysis.report')"
        " if m in sys.modules)\n"
        "out = {'light': heavy(), 'nope': hasattr(analysis, 'nope')}\n"
        "out['after_nope'] = heavy()\n"
        "import analysis.report as report\n"
        "out['same'] = [getattr(analysis, n) is getattr(report, n) for n in report.__all__]\n"
        "out['names'] = sorted(report.__all__)\n"
        "out['charts'] = analysis.charts.__name__\n"
        "print(json.dumps(out))"
    )
    assert got["light"] == [] and got["nope"] is False and got["after_nope"] == []
    assert got["names"] == FROM_REPORT and all(got["same"])
    assert got["charts"] == "analysis.charts"


def _modules() -> dict[str, ast.Module]:
    return {".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): ast.parse(f.read_text())
            for f in sorted((REPO / "analysis").rglob("*.py"))}  # fmt: skip


def test_every_module_that_defines_names_lists_them_in_all() -> None:
    import importlib

    for name, tree in _modules().items():
        defines = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))]
        if not defines:
            continue
        module = importlib.import_module(name)
        assert "__all__" in vars(module), f"{name}: no __all__"
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, (name, missing)
