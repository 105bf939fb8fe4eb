"""Chart rendering in worker processes: the same files as in-process, nothing lost when a
worker dies, a bad chart named, and every worker stopped."""

import os
import signal

import pytest

from analysis.vega_workers import ChartError, VegaWorkers, render_spec


def spec(n: int) -> dict:
    return {
        "data": {"values": [{"x": i, "y": (i * n) % 7} for i in range(30)]},
        "mark": "line",
        "encoding": {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"}},
    }


SPECS = {f"chart{n}": spec(n) for n in range(5)}


def test_workers_render_what_this_process_renders_in_submit_order():
    with VegaWorkers(["svg", "png", "pdf"], 2.0, None, workers=2) as w:
        assert len(w.procs) == 2
        for name, s in SPECS.items():
            w.submit(name, s)
        files = w.collect()
    assert list(files) == list(SPECS)
    for name, s in SPECS.items():
        here = render_spec(s, ["svg", "png", "pdf"], 2.0, None)
        assert set(files[name]) == {"svg", "png", "pdf"}
        assert files[name]["svg"] == here["svg"]
        assert files[name]["png"] == here["png"]


def test_a_dead_worker_loses_no_chart():
    with VegaWorkers(["svg"], 1.0, None, workers=2) as w:
        os.kill(w.procs[0].pid, signal.SIGKILL)
        w.procs[0].wait()
        for name, s in SPECS.items():
            w.submit(name, s)
        files = w.collect()
    assert list(files) == list(SPECS)
    assert all(f["svg"].startswith(b"<svg") for f in files.values())


def test_no_workers_renders_here():
    with VegaWorkers(["svg"], 1.0, None, workers=0) as w:
        w.submit("only", spec(1))
        assert w.collect()["only"]["svg"] == render_spec(spec(1), ["svg"], 1.0, None)["svg"]


def test_a_bad_chart_is_named_and_workers_stop():
    w = VegaWorkers(["svg"], 1.0, None, workers=1)
    w.submit("broken", {"mark": "no-such-mark", "data": {"values": [{"a": 1}]}})
    with pytest.raises(ChartError, match="broken"):
        w.collect()
    w.close()
    assert all(p.poll() is not None for p in w.procs)
    assert not os.path.exists(w.folder)
