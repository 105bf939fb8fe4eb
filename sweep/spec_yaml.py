"""Reading a spec's YAML and locating errors in it: the loader (duplicate keys and alias bombs
refused, `1e15` a float), and messages that name the place, the value written there and its
line (`grid.optimizer[2].lr: Input should be greater than 0, got -1 (line 9)`)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from resultstore.inputs import SPEC_MAX_BYTES, InputError, read_text
from study.config import ModelConfig, _Frozen
from sweep.spec_schema import SweepSpec, expand_ladders

__all__ = [
    "ABSENT", "MAX_SPEC_VALUES", "SpecError", "SpecLoader", "Where", "dig", "error_message", "format_errors",
    "line_in", "read_yaml",
]


class SpecError(ValueError):
    """A spec that cannot run; the message lists every problem with its YAML location."""


# ---- reading YAML ---------------------------------------------------------------------------


class SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently) and tags other
    than the plain types (`!!binary aGVsbG8=` would become the name "hello"), honours merge keys
    with overrides (`{<<: *base, lr: 1.0e-3}`: the key written beside the merge wins), and reads
    `1e15`, `3e-3` as floats (YAML 1.2; YAML 1.1 needs a dot and would give a string)."""

    saw_alias = False
    """An alias (`*name`) was composed: a spec too big to expand says which it is."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.saw_alias = True
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in PLAIN_TAGS:
            shown = tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(
                None, None, f"the tag {shown} is not allowed: a spec holds plain strings, numbers, booleans, "
                "lists and mappings", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:  # the keys written here; merged ones may be overridden
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it below
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given at line {first}); give each key once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)  # flattens merges: keys written here come last and win


MERGE_TAG = "tag:yaml.org,2002:merge"
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map"))
"""Tags a spec may spell out (`!!str 1e-3`); anything else (`!!binary`, `!!set`, `!custom`) is refused."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))


MAX_SPEC_VALUES = 100_000
"""Values a spec may hold once its aliases are expanded (a hand-written grid has hundreds): an
alias bomb (`&a [..]` nested in `&b [*a, *a, ...]`) is refused before it is built."""


def _expansion(root: yaml.Node, aliases: bool = True) -> tuple[tuple, yaml.Node, str] | None:
    """(place, node, why) when the YAML refers to itself (`&r [*r]`) or its aliases expand to
    more than MAX_SPEC_VALUES values (`aliases`: the YAML has any); None otherwise. Sizes are counted on the composed graph,
    each shared node once, so this costs the size of the text, not of the expansion."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        kids = _children(node)
        if children_done:
            on_path.discard(id(node))
            size[id(node)] = min(1 + sum(size[id(k)] for k in kids), MAX_SPEC_VALUES + 1)
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            return _path_to(root, node), node, "an alias refers to the list or mapping that holds it (&x [*x])"
        on_path.add(id(node))
        stack.append((node, True))
        stack += [(k, False) for k in kids if id(k) not in size]
    if size[id(root)] <= MAX_SPEC_VALUES:
        return None
    place, node = (), root  # descend to the smallest place that is still too big
    while True:
        big = [(p, k) for p, k in _labelled_children(node) if size[id(k)] > MAX_SPEC_VALUES]
        if not big:
            break
        step, node = big[0]
        place += (step,)
    if not aliases:
        return place, node, f"holds more than {MAX_SPEC_VALUES:,} values; a spec's grid lists hundreds"
    return place, node, f"aliases expand to more than {MAX_SPEC_VALUES:,} values; write the values out"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _labelled_children(node: yaml.Node) -> list[tuple[Any, yaml.Node]]:
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    if isinstance(node, yaml.MappingNode):
        return [(k.value if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
    return []


def _path_to(root: yaml.Node, target: yaml.Node) -> tuple:
    """The place of `target`'s first occurrence, by a walk that enters each node once."""
    seen, stack = set(), [((), root)]
    while stack:
        place, node = stack.pop()
        if node is target and place:
            return place
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack += [(place + (p,), k) for p, k in reversed(_labelled_children(node))]
    return ()


# ---- located errors ---------------------------------------------------------------------------


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).startswith(("function-", "tagged-union", "union[")):
            continue
        else:
            out += ("." if out else "") + str(p)
    return out or "(top level)"


def _node_at(root: yaml.Node | None, parts: tuple[Any, ...]) -> tuple[yaml.Node | None, int | None]:
    """The YAML node at `parts` (None if absent) and the 1-based line of it, or of its deepest
    existing ancestor."""
    node, line = root, None
    for p in parts:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode) and isinstance(p, str):
            node = next((v for k, v in node.value if k.value == p), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            node = node.value[p]
        else:
            node = None
    return node, (node.start_mark.line + 1 if node is not None else line)


def _line_of(root: yaml.Node | None, parts: tuple[Any, ...]) -> int | None:
    return _node_at(root, parts)[1]


def _written(node: yaml.Node | None) -> str | None:
    """The text the user wrote for a node, when it is short and on one line."""
    if node is None or node.start_mark.buffer is None:
        return None
    text = node.start_mark.buffer[node.start_mark.index:node.end_mark.index].strip()
    if isinstance(node, yaml.ScalarNode) and node.style in ("'", '"'):
        text = repr(node.value)
    elif isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
        text = repr(node.value)
    return text if text and "\n" not in text and len(text) <= 80 else None


def _keys_at(loc: tuple) -> list[str]:
    """The keys the spec allows in the mapping that holds `loc`'s last key."""
    cls: Any = SweepSpec
    for p in loc[:-1]:
        if isinstance(p, int):
            continue
        field = cls.model_fields.get(p) if isinstance(cls, type) and issubclass(cls, _Frozen) else None
        if field is None:
            return []
        candidates, cls = [field.annotation], None
        while candidates:
            a = candidates.pop()
            if isinstance(a, type) and issubclass(a, _Frozen):
                cls = a
            else:
                candidates += list(typing.get_args(a))
    keys = list(cls.model_fields) if cls is not None else []
    return keys + (["depth"] if cls is ModelConfig else [])


def error_message(err: dict) -> str:
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        keys = _keys_at(tuple(err["loc"]))
        msg = "unknown key" + (f" (expected one of: {', '.join(keys)})" if keys else "")
    elif err["type"] == "finite_number":
        msg = "must be finite"
    elif err["type"] == "int_from_float":
        msg = "Input should be a whole number"
    elif err["type"] == "missing" and err["loc"] and isinstance(err["loc"][-1], int):
        msg = f"too few values: item {err['loc'][-1]} is missing"
    return msg


ABSENT = object()


class Where:
    """Maps error locations in the validated spec back to the YAML the user wrote: ladder
    points to their list element, and each place to its line and written value."""

    def __init__(self, root: yaml.Node | None, data: Any):
        self.root = root
        grid = data.get("grid") if isinstance(data, dict) else None
        self.sources = expand_ladders(grid.get("optimizer"))[1] if isinstance(grid, dict) else []

    def map(self, loc: tuple) -> tuple:
        if len(loc) >= 3 and loc[:2] == ("grid", "optimizer") and isinstance(loc[2], int) and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            rest = loc[3:]
            if rest and rest[0] in picks:
                return ("grid", "optimizer", entry, rest[0], picks[rest[0]], *rest[1:])
            return ("grid", "optimizer", entry, *rest)
        return loc

    def label(self, loc: tuple) -> str:
        """A grid entry's name; an expanded ladder point names its list element(s)."""
        if len(loc) == 3 and loc[:2] == ("grid", "optimizer") and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            if len(picks) == 1:
                (field, j), = picks.items()
                return _loc(("grid", "optimizer", entry, field, j))
            if picks:
                return _loc(("grid", "optimizer", entry)) + " (" + ", ".join(f"{f}[{j}]" for f, j in picks.items()) + ")"
        return _loc(self.map(loc))

    def line(self, loc: tuple) -> int | None:
        if len(loc) == 3 and loc[:2] == ("grid", "optimizer") and loc[2] < len(self.sources):
            entry, picks = self.sources[loc[2]]
            if picks:
                field, j = next(iter(picks.items()))
                return _line_of(self.root, ("grid", "optimizer", entry, field, j))
        return _line_of(self.root, self.map(loc))

    def format(self, loc: tuple, msg: str, value: Any = ABSENT, custom: bool = True) -> str:
        """`place: message, got <what the user wrote> (line N)`. A custom message (ours, not
        pydantic's) that already quotes the value is left as it is."""
        loc = tuple(loc)
        node, _ = _node_at(self.root, self.map(loc))
        shown = _written(node) if self.root is not None else None
        if shown is None and value is not ABSENT and not isinstance(value, dict):
            shown = repr(value) if len(repr(value)) <= 80 else None
        raw = node.value if isinstance(node, yaml.ScalarNode) else str(value) if value is not ABSENT else None
        quoted = "got " in msg or (custom and raw is not None and re.search(rf"(?<![\w.]){re.escape(raw)}(?![\w.])", msg))
        got = f", got {shown}" if shown is not None and not quoted else ""
        line = self.line(loc)
        return f"{self.label(loc)}: {msg}{got}" + (f" (line {line})" if line else "")

    def errors(self, exc: ValidationError, prefix: tuple = ()) -> list[str]:
        out = []
        for err in exc.errors():
            loc, value = prefix + tuple(err["loc"]), err.get("input", ABSENT)
            extra = getattr((err.get("ctx") or {}).get("error"), "loc", None)
            if extra:  # a cross-field check that names its field
                loc, value = loc + tuple(extra), dig(value, extra)
            if err["type"] == "missing" and loc and isinstance(loc[-1], int):  # a tuple too short: show it
                loc, value = loc[:-1], ABSENT
            elif err["type"] in ("extra_forbidden", "missing"):
                value = ABSENT
            out.append(self.format(loc, error_message(err), value, custom=err["type"] in ("value_error", "assertion_error")))
        return list(dict.fromkeys(out))


def dig(value: Any, parts: tuple) -> Any:
    for p in parts:
        if isinstance(value, dict) and p in value:
            value = value[p]
        elif isinstance(value, (list, tuple)) and isinstance(p, int) and p < len(value):
            value = value[p]
        else:
            return ABSENT
    return value


def format_errors(exc: ValidationError, root: yaml.Node | None = None, prefix: tuple = ()) -> str:
    return "\n".join(Where(root, None).errors(exc, prefix))


def read_yaml(path: str | Path) -> tuple[dict, yaml.Node]:
    """A spec file's top-level mapping and its YAML node, or SpecError naming the file (and the
    line) of what keeps it from being one."""
    path = Path(path)
    try:
        text = read_text(path, max_bytes=SPEC_MAX_BYTES, what="spec file")
    except InputError as exc:
        raise SpecError(str(exc)) from None
    loader = SpecLoader(text)
    try:
        root = loader.get_single_node()
        bomb = _expansion(root, loader.saw_alias) if root is not None else None
        if bomb is not None:
            place, node, why = bomb
            raise SpecError(f"{path}: {_loc(place)}: {why} (line {node.start_mark.line + 1})")
        data = loader.construct_document(root) if root is not None else None
    except RecursionError:
        raise SpecError(f"{path}: invalid YAML: nested too deeply; a spec needs a few levels") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: {_yaml_problem(exc, text)}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        shown = "an empty file" if data is None else f"a {type(data).__name__}: {_first_text(text)}"
        raise SpecError(f"{path}: expected a mapping (name:, train:, grid:, ...) at the top level, got {shown}")
    return data, root


def line_in(path: str | Path, loc: tuple) -> int | None:
    """The line of a place (`("resources", "gpu")`) in a spec file that already loaded."""
    loader = SpecLoader(read_text(path, max_bytes=SPEC_MAX_BYTES, what="spec file"))
    try:
        return _line_of(loader.get_single_node(), loc)
    finally:
        loader.dispose()


def _first_text(text: str) -> str:
    """The first line that holds something, quoted (a spec that is not a mapping shows what it is)."""
    line = next((l.strip() for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")), "")
    return repr(line if len(line) <= 60 else line[:57] + "...")


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """`line L, column C: invalid YAML: <problem>: '<the line as written>'`. An unclosed [ or {
    is reported where it opens, not on the line where the parser gave up."""
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    what = getattr(exc, "context", None) or ""
    if context is not None and mark is not None and "flow" in what and context.line != mark.line:
        opener = "[" if "sequence" in what else "{"
        problem = f"the {opener} here is not closed ({problem} on line {mark.line + 1})"
        mark = context
    if mark is None:
        return f"invalid YAML: {problem}"
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {problem}" + (f": {shown!r}" if shown else "")
