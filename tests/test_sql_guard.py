"""sweep.sql_guard's bound on an expression's depth sits below what Polars survives: each nesting
form runs in a subprocess (a crash below Python is observed, not suffered), at the largest size
the guard admits and at twice it, and the real limit of the form that crashes first is found by
bisection (issue 50 item 7: 1000 `'a' || ...` terms ended `sweep query` with exit 139)."""

import subprocess
import sys

import pytest

from sweep.sql_guard import MAX_NESTING, MAX_TOKENS, SqlRefused, check_select, nesting, tokens

PROBE = """
import sys, polars as pl
ctx = pl.SQLContext({"runs": pl.LazyFrame({"step": [1, 2], "trial_id": ["a", "b"]})}, eager=False)
try:
    ctx.execute(sys.stdin.read()).collect()
except Exception:
    pass  # a message, not a crash
"""

FORMS = {  # id -> n -> a query whose expression is n deep
    "concat": lambda n: "SELECT " + " || ".join(["'a'"] * n) + " AS x FROM runs",
    "column-concat": lambda n: "SELECT " + " || ".join(["trial_id"] * n) + " AS x FROM runs",
    "plus": lambda n: "SELECT " + " + ".join(["1"] * n) + " AS x FROM runs",
    "modulo": lambda n: "SELECT step FROM runs WHERE " + " % ".join(["step"] * n) + " > 0",
    "or": lambda n: "SELECT step FROM runs WHERE " + " OR ".join(["step = 1"] * n),
    "case": lambda n: "SELECT CASE " + " ".join(f"WHEN step = {i} THEN {i}" for i in range(n)) + " ELSE 0 END AS x FROM runs",
    "brackets": lambda n: "SELECT " + "(" * n + "1" + ")" * n + " AS x FROM runs",
    "function-calls": lambda n: "SELECT " + "abs(" * n + "step" + ")" * n + " AS x FROM runs",
    "brackets-and-plus": lambda n: "SELECT " + "(1 + " * n + "1" + ")" * n + " AS x FROM runs",
    "unary-minus": lambda n: "SELECT " + "- " * n + "1 AS x FROM runs",
    "subqueries": lambda n: "SELECT * FROM " + "(SELECT * FROM " * n + "runs" + ") AS t" * n,
}


def crashes(sql: str) -> bool:
    proc = subprocess.run([sys.executable, "-c", PROBE], input=sql, text=True, capture_output=True, timeout=300)
    return proc.returncode != 0


def admitted(form) -> int:
    """The largest n whose query the guard lets through (bisection: the guard is monotone in n)."""
    def passes(n: int) -> bool:
        try:
            check_select(form(n), ["runs"])
            return True
        except SqlRefused:
            return False

    lo, hi = 1, MAX_TOKENS  # n terms are at least n tokens
    assert passes(lo) and not passes(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


@pytest.mark.parametrize("kind", list(FORMS))
def test_polars_survives_twice_the_deepest_expression_the_guard_admits(kind):
    form = FORMS[kind]
    n = admitted(form)
    assert n >= 20, n  # a hand-written query still passes
    assert not crashes(form(n)) and not crashes(form(2 * n)), (kind, n)


def test_the_real_limit_found_by_bisection_lies_over_twice_the_bound():
    """`||` crashes first (about 950 terms here; `%` at 1900, `+` at a few thousand)."""
    form = FORMS["concat"]
    lo, hi = admitted(form), MAX_TOKENS // 2  # 2000 terms: within the old token bound, and a crash
    assert not crashes(form(lo)) and crashes(form(hi))
    while hi - lo > 8:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if crashes(form(mid)) else (mid, hi)
    print(f"Polars survives {lo} `||` terms and crashes at {hi}; the guard admits {admitted(form)}")
    assert lo >= 2 * admitted(form) and admitted(form) == MAX_NESTING + 1


def test_nesting_counts_chains_per_bracket_level_and_starts_afresh_after_a_comma_or_clause():
    assert nesting(tokens("SELECT a + b + c, d + e FROM runs WHERE x = 1 AND y = 2 ORDER BY a"))[0] == 3
    assert nesting(tokens("SELECT f(a + b, (c * d)) FROM runs"))[0] == 3  # f(: 1, its second argument (: 2, c * d: 3
    assert nesting(tokens("SELECT a || b || c FROM runs"))[0] == 2
