import pytest
import torch

# CI machines have 2 cores; one torch thread per test process is faster than two fighting.
torch.set_num_threads(1)


@pytest.fixture
def readbacks(monkeypatch):
    """Counts of Tensor.tolist/item/cpu/numpy calls from here on: host readbacks."""
    counts = {"tolist": 0, "item": 0, "cpu": 0, "numpy": 0}
    for name in counts:
        original = getattr(torch.Tensor, name)

        def counting(self, *a, _name=name, _orig=original, **k):
            counts[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts
