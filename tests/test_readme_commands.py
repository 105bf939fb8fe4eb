"""The README's commands are ones the CLI offers, and the times it quotes carry their measurement
(issue 37), as tests/test_cluster_configs.py holds clusters/README.md to the cluster files."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main

from sweep.cli import app

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _commands(block: str) -> list[list[str]]:
    """Each command of a bash block as its words: lines joined while a quote is open, comments
    dropped, `a && b` split."""
    out, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        pending = ""
        command: list[str] = []
        for w in [*words, "&&"]:
            if w == "&&":
                if command:
                    out.append(command)
                command = []
            else:
                command.append(w)
    assert not pending, f"unclosed quote in: {pending}"
    return out


def _sweep_commands(text: str) -> list[list[str]]:
    """Every `sweep ...` command: in bash blocks, and inline in the prose (`sweep run SPEC`)."""
    found = [c for b in _bash_blocks(text) for c in _commands(b) if c[0] == "sweep"]
    inline = re.findall(r"`(sweep [^`]+)`", text)
    return found + [shlex.split(c) for c in inline]


def _resolve(words: list[str]) -> tuple[object, list[str]]:
    """The (click) command a `sweep ...` line names, groups followed, and its remaining words."""
    cmd = typer.main.get_command(app)
    rest = words[1:]
    while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
        assert rest[0] in cmd.commands, f"`{' '.join(words)}`: no command {rest[0]!r} (has {sorted(cmd.commands)})"
        cmd, rest = cmd.commands[rest[0]], rest[1:]
    return cmd, rest


def test_the_readme_names_commands_the_cli_has() -> None:
    commands = _sweep_commands(README)
    assert ["sweep", "run", "specs/laptop.yaml"] in commands  # the first command
    verbs = set()
    for words in commands:
        cmd, rest = _resolve(words)
        verbs.add(cmd.name)
        options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        for w in rest:
            if w.startswith("-") and not re.fullmatch(r"-?\d[\d.e+-]*", w):
                assert w.split("=")[0] in options, f"`{' '.join(words)}`: {cmd.name} has no option {w} ({sorted(options)})"
        for spec in (w for w in rest if re.fullmatch(r"specs/[\w.-]+\.yaml", w)):
            assert (ROOT / spec).is_file(), f"`{' '.join(words)}`: {spec} does not exist"
    assert {"run", "status", "report", "query", "plan", "train"} <= verbs  # the README's tour


def test_the_readme_installs_extras_the_package_declares() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = set(re.findall(r"pip install -e \"?\.\[([\w,]+)\]", README))
    assert named and {e for n in named for e in n.split(",")} <= extras


def _setup_section() -> str:
    return README.split("## Set up and run", 1)[1].split("\n## ", 1)[0]


def test_the_times_the_set_up_section_quotes_carry_their_measurement() -> None:
    """Each duration in the set-up section (the laptop study, the tests) is a measurement: the
    sentence that gives it names its date and the machine. ("10 min on 2 idle CPU cores" was a
    time nobody had measured.)"""
    text = re.sub(r"\s+", " ", _setup_section())
    durations = list(re.finditer(r"\b\d[\d.,]*\s*(?:min|minutes|h|hours|s)\b", text))
    assert durations, "the set-up section quotes no time"
    for m in durations:
        start = max(text.rfind(". ", 0, m.start()), text.rfind("# ", 0, m.start()), 0)
        end = text.find(". ", m.end())
        sentence = text[start:end if end > 0 else len(text)]
        assert re.search(r"20\d\d-\d\d-\d\d", sentence), f"no date beside {m.group()!r}: {sentence!r}"
        assert re.search(r"\d-core|\bGPU\b|\bH200\b|cores?\b", sentence), f"no machine beside {m.group()!r}: {sentence!r}"


@pytest.mark.parametrize("bad", ["sweep rerun specs/laptop.yaml", "sweep run specs/laptop.yaml --resume",
                                 "sweep run specs/nope.yaml"])
def test_a_command_the_cli_lacks_is_caught(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above would see a wrong verb, a wrong option and a missing spec."""
    monkeypatch.setattr(sys.modules[__name__], "README", README + f"\n```bash\n{bad}\n```\n")
    with pytest.raises(AssertionError):
        test_the_readme_names_commands_the_cli_has()
