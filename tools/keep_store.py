"""Keep a sweep's finished trials in a second store, so a study that outlives its machine loses
nothing: each trial's row files byte for byte and its runs row (ResultsStore.copy_finished, what
`sweep run --reuse` uses), never a trial still running or one with a gap. The final weights are
copied too; git ignores them (*.pt), so a store kept in the repository holds the rows only.

    python tools/keep_store.py results/attention docs/stores/attention
    python tools/keep_store.py docs/stores/attention docs/stores/families specs/families/families_ladders.yaml

Run it as often as you like while the sweep runs: it copies only trials the destination lacks.
With a spec, only that spec's trials are copied, renamed to the destination's sweep: how trials
another study ran (the attention study's softmax arm is d_model 128 ladder points) join a store.
On a fresh machine, `sweep run SPEC --reuse docs/stores/<sweep>` copies them back into the
results folder and trains only what is missing; `sweep report docs/stores/<sweep>` reads the
kept store directly.
"""
import sys

from resultstore import ResultsStore


def refuse(message: str) -> None:
    """Bad input: the message, exit 2, nothing written."""
    print(message, file=sys.stderr)
    sys.exit(2)


if len(sys.argv) not in (3, 4):
    refuse(__doc__)
source, dest = ResultsStore.at(sys.argv[1]), ResultsStore.at(sys.argv[2])
if not source.exists():
    refuse(f"{sys.argv[1]}: no sweep there")
wanted = source.completed_ids()
if len(sys.argv) == 4:
    from sweep.grid import expand
    from sweep.spec import load_spec

    spec = load_spec(sys.argv[3])
    if spec.name != dest.sweep:
        refuse(f"{sys.argv[3]}: its sweep is {spec.name}, the destination's {dest.sweep}")
    wanted &= {t.trial_id for t in expand(spec)}
elif dest.sweep != source.sweep:
    refuse(f"{sys.argv[2]}: name the destination after the sweep ({source.sweep}), or give the spec whose trials to take")
with dest.writing("keep_store", repair=False) as notes:
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    have = dest.completed_ids() if dest.exists() else set()
    copied = dest.copy_finished(source, sorted(wanted - have))
print(f"{len(copied)} trial(s) copied to {dest.uri}; {len(have) + len(copied)} kept there in all")
