"""The console every `sweep` verb prints to, and its one way to refuse bad input: a message,
exit code 2, no traceback (sweep.cli and its command modules share it)."""

from __future__ import annotations

import datetime as dt
import re
import sys
import time

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["bad_input", "duration", "err", "human", "launch_deadline", "out", "q", "reason", "refuse"]

# emoji off: a message quotes what the user wrote (`bpe:abc`, `my:fire:spec.yaml`) exactly as written;
# markup in quoted text is escaped (q) where a message has markup of its own
out = Console(width=None if sys.stdout.isatty() else 160, emoji=False)  # piped output keeps whole tables
err = Console(stderr=True, emoji=False)
q = escape

def bad_input(message: str) -> typer.Exit:
    # escape: a message quotes what the user wrote ("[data]", "lr: [0.1, 0.3]"), never markup
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def reason(exc: BaseException) -> str:
    """An error's first line, whole; when it ends in ':' (polars: "statement type is not
    supported:") the start of the next line says what."""
    lines = [l.strip() for l in str(exc).strip().splitlines() if l.strip()] or [type(exc).__name__]
    if lines[0].endswith(":") and len(lines) > 1:
        detail = re.split(r"[\s({]", lines[1], maxsplit=1)[0]
        return f"{lines[0]} {detail}"
    return lines[0]


def human(n: float, unit: str = "") -> str:
    for suffix, scale in (("Z", 1e21), ("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}{unit}"
    return f"{n:.3g}{unit}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:,.0f}d"


def refuse(problem: str | None) -> None:
    """Exit 2 with `problem` when there is one."""
    if problem is not None:
        raise bad_input(problem)


def launch_deadline(text: str, now: float | None = None) -> float:
    """`--stop-launching-at`'s time as epoch seconds: HH:MM (today, local), an ISO date and time,
    or +DURATION (+90m, +2h30m, +45s) from `now`. Exit 2 on anything else or a time already past."""
    now = time.time() if now is None else now
    where = f"--stop-launching-at {text!r}"
    relative = re.fullmatch(r"\+(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if relative and any(relative.groups()):
        hours, minutes, seconds = (int(g or 0) for g in relative.groups())
        if hours * 3600 + minutes * 60 + seconds == 0:
            raise bad_input(f"{where}: must be after now (+30m, +2h)")
        return now + hours * 3600 + minutes * 60 + seconds
    today = dt.datetime.fromtimestamp(now)
    try:
        clock = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
        when = (today.replace(hour=int(clock[1]), minute=int(clock[2]), second=0, microsecond=0) if clock
                else dt.datetime.fromisoformat(text.strip()))
    except ValueError:
        raise bad_input(f"{where}: not a time; give HH:MM (today), a date and time (2026-12-05T09:30) "
                        "or +DURATION (+2h30m)") from None
    at = when.timestamp()  # a naive time is this machine's local time; an offset is honoured
    if at <= now:
        raise bad_input(f"{where}: that time has passed (it is {today:%Y-%m-%d %H:%M} here); "
                        "give a later one, with its date if it is tomorrow")
    return at
