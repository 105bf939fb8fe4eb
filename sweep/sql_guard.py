"""What `sweep query` (and `probe sae --where`) lets through to Polars SQL: one SELECT (or
WITH ... SELECT) that reads the sweep's tables and nothing else. The text is tokenised the way
SQL is (comments, strings and quoted names are not read as words), then checked:

    one statement, starting with SELECT or WITH (`/* c */ CREATE ...` is a CREATE)
    no word that writes or reaches outside (INSERT, COPY, INTO, ATTACH, ...), wherever it is
    every FROM / JOIN item is one of the sweep's tables, a WITH name or a subquery: never a
    table function (`read_csv('/etc/hostname')` would read any file on the host)
    at most MAX_TOKENS tokens, MAX_DEPTH nested brackets and MAX_NESTING operators chained in
    one expression (brackets around it counted): Polars recurses once per operator of a chain
    and crashes the process (exit 139, no message) on about 950 `'a' || 'a' || ...` terms, 1900
    `%` and a few thousand `+` (tests/test_sql_guard.py finds the limits by bisection)

SqlRefused's message names what was refused and where (the word, its line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MAX_DEPTH", "MAX_NESTING", "MAX_TOKENS", "SqlRefused", "check_select", "nesting"]

MAX_TOKENS = 4000
"""Words, numbers, strings and symbols in one query (a hand-written one has a few hundred;
Polars crashed at about 10,000 here)."""
MAX_DEPTH = 64
"""Brackets inside brackets."""
MAX_NESTING = 200
"""Operators chained in one expression plus the brackets and the operators around it (an
expression's depth, counted from above): Polars crashed (exit 139) at about 950 `||` here, so
200 leaves a margin of over 4x; a hand-written query chains a few dozen."""
OPERATORS = frozenset("|| + - * / % ^ & | = == < > <= >= <> != :: ~".split()) | frozenset(
    "AND OR NOT IS LIKE ILIKE IN BETWEEN WHEN".split())
"""What extends an expression by one level of Polars' recursion (unary or binary; WHEN: each
branch of a CASE nests the next)."""

CHANGES = frozenset("""INSERT UPDATE DELETE MERGE UPSERT REPLACE CREATE DROP ALTER TRUNCATE RENAME COPY
    ATTACH DETACH INTO PRAGMA SET RESET GRANT REVOKE EXPORT IMPORT INSTALL LOAD CALL EXECUTE EXEC
    PREPARE DEALLOCATE VACUUM ANALYZE COMMIT ROLLBACK BEGIN SAVEPOINT LOCK UNLOCK SHOW DESCRIBE
    EXPLAIN USE""".split())
"""Words that change a table, read outside the sweep or run something else: refused anywhere."""
ENDS_FROM = frozenset("WHERE GROUP HAVING ORDER LIMIT OFFSET UNION EXCEPT INTERSECT WINDOW QUALIFY ON USING "
                      "SELECT FETCH".split())
JOINS = frozenset({"FROM", "JOIN"})
_NEW_EXPRESSION = ENDS_FROM | JOINS | {"BY"}
"""Words after which an expression starts afresh at its bracket level (as after a comma)."""
FROM_AS_SYNTAX = frozenset({"EXTRACT", "TRIM", "SUBSTRING", "SUBSTR", "POSITION", "OVERLAY"})
"""Functions whose arguments say FROM (`EXTRACT(year FROM t)`): no table follows it there."""

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*'|\$\$.*?\$\$)
  | (?P<quoted>"(?:[^"]|"")*"|`[^`]*`)
  | (?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<symbol>::|<=|>=|<>|!=|\|\||[-+*/%(),;.<>=!~^&|\[\]:{}?@#])
""", re.VERBOSE | re.DOTALL)


class SqlRefused(ValueError):
    """A query `sweep query` does not run (one line, naming the word and its line)."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    line: int

    @property
    def word(self) -> str:
        """The upper-case keyword (empty for anything but a bare word)."""
        return self.text.upper() if self.kind == "word" else ""

    @property
    def name(self) -> str:
        """A table or column name as written, unquoted (bare words fold to lower case)."""
        if self.kind == "quoted":
            return self.text[1:-1].replace('""', '"')
        return self.text.lower()


def tokens(sql: str) -> list[Token]:
    """The query's tokens, comments and white space dropped; SqlRefused at what is not SQL."""
    out, at, line = [], 0, 1
    while at < len(sql):
        m = _TOKEN.match(sql, at)
        if m is None or (m.group() == "/" and sql.startswith("/*", at)):
            shown = sql[at:at + 20]
            if sql.startswith(("/*", "'", '"', "`", "$$"), at):
                raise SqlRefused(f"line {line}: {shown!r}... is not closed")
            raise SqlRefused(f"line {line}: unexpected {sql[at]!r}")
        if m.lastgroup not in ("space", "comment"):
            out.append(Token(m.lastgroup, m.group(), line))
            if len(out) > MAX_TOKENS:
                raise SqlRefused(f"over {MAX_TOKENS:,} terms (words, numbers and symbols); a query this long is "
                                 "refused (Polars' parser would crash on it); write it shorter, e.g. in steps")
        line += m.group().count("\n")
        at = m.end()
    return out


def check_select(sql: str, tables: Iterable[str]) -> None:
    """SqlRefused unless `sql` is one SELECT (or WITH ... SELECT) over `tables` only."""
    allowed = {t.lower() for t in tables}
    toks = tokens(sql)
    while toks and toks[-1].text == ";":
        toks.pop()
    if not toks:
        raise SqlRefused("names no statement; write a SELECT over the tables " + ", ".join(sorted(allowed)))
    first = next((t for t in toks if t.text != "("), toks[0])
    if first.word not in ("SELECT", "WITH"):
        verb = first.word or first.text
        if verb in CHANGES:
            raise SqlRefused(f"{verb} changes nothing here: the tables are read-only views of the store; "
                             "read them with SELECT (or WITH ... SELECT)")
        raise SqlRefused(f"line {first.line}: starts with {first.text!r}; only SELECT (or WITH ... SELECT) is run")
    deepest, at = nesting(toks)
    if deepest > MAX_NESTING:
        raise SqlRefused(f"line {at.line}: an expression nested over {MAX_NESTING} deep (operators chained and "
                         "brackets around them); Polars would crash on it: split it, e.g. into a WITH step or "
                         "concat(a, b, ...) for a long ||")
    ctes = {toks[i].name for i in range(1, len(toks) - 2)
            if toks[i].kind in ("word", "quoted") and (toks[i - 1].word in ("WITH", "RECURSIVE") or toks[i - 1].text == ",")
            and toks[i + 1].word == "AS" and toks[i + 2].text == "("}
    depth, from_at, syntax_at = 0, set(), set()
    for i, tok in enumerate(toks):
        after = toks[i + 1] if i + 1 < len(toks) else None
        if tok.text == ";":
            raise SqlRefused(f"line {tok.line}: one statement only (a ';' before more)")
        if tok.word in CHANGES:
            raise SqlRefused(f"line {tok.line}: {tok.word} is refused: the tables are read-only views of the store")
        if tok.kind == "word" and after is not None and after.text == "(" and tok.name.startswith(("read_", "scan_")):
            raise SqlRefused(f"line {tok.line}: {tok.text}(...) would read a file outside the sweep; "
                             "query the tables " + ", ".join(sorted(allowed)))
        if tok.text == "(":
            depth += 1
            if depth > MAX_DEPTH:
                raise SqlRefused(f"line {tok.line}: brackets nested over {MAX_DEPTH} deep")
            if i and toks[i - 1].word in FROM_AS_SYNTAX:
                syntax_at.add(depth)
        elif tok.text == ")":
            from_at.discard(depth)
            syntax_at.discard(depth)
            depth -= 1
        elif tok.word in JOINS and depth not in syntax_at:
            from_at.add(depth)
            _check_source(after, tok, allowed, ctes, toks[i + 2] if i + 2 < len(toks) else None)
        elif tok.word in ENDS_FROM:
            from_at.discard(depth)
        elif tok.text == "," and depth in from_at:
            _check_source(after, tok, allowed, ctes, toks[i + 2] if i + 2 < len(toks) else None)


def nesting(toks: list[Token]) -> tuple[int, Token | None]:
    """(the deepest expression, counted from above: at each open bracket level, the operators
    chained since that level's last comma or clause word, plus the brackets; the token there)."""
    chains, deepest, at = [0], 0, None
    for tok in toks:
        if tok.text == "(":
            chains.append(0)
        elif tok.text == ")":
            if len(chains) > 1:
                chains.pop()
        elif tok.text == "," or tok.word in _NEW_EXPRESSION:
            chains[-1] = 0
        elif tok.text in OPERATORS or tok.word in OPERATORS:
            chains[-1] += 1
        depth = sum(chains) + len(chains) - 1
        if depth > deepest:
            deepest, at = depth, tok
    return deepest, at


def _check_source(item: Token | None, before: Token, allowed: set[str], ctes: set[str], then: Token | None) -> None:
    """A FROM / JOIN item: a table of the sweep, a WITH name, or a bracketed subquery."""
    if item is None:
        raise SqlRefused(f"line {before.line}: {before.text} names no table")
    if item.text == "(":
        return
    if item.kind in ("word", "quoted") and then is not None and then.text == "(":
        raise SqlRefused(f"line {item.line}: {item.text}(...) is a table function; only the sweep's tables "
                         f"({', '.join(sorted(allowed))}) are read")
    if item.kind in ("word", "quoted") and then is not None and then.text == ".":
        raise SqlRefused(f"line {item.line}: {item.text}.<name> names a table outside the sweep; query "
                         + ", ".join(sorted(allowed)))
    if item.kind not in ("word", "quoted") or item.name not in allowed | ctes:
        raise SqlRefused(f"line {item.line}: no table {item.text}; the sweep's tables are " + ", ".join(sorted(allowed)))
