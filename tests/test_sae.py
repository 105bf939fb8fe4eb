"""study/sae.py: TopK SAEs recover sparse features, the alignment metric tells basis-aligned from
random features, and SGD (not Adam) trains the same SAE in any basis."""

import pytest
import torch

from study.rotation import generator_for, random_orthogonal
from study.sae import (
    SAEConfig,
    decoder_alignment,
    geometric_median,
    initial_sae,
    kurtosis_null,
    matched_cosine,
    reconstruction_metrics,
    sparse_features,
    train_sae,
)

D = 16


def _features(kind: str) -> torch.Tensor:
    if kind == "basis":
        return torch.eye(D, dtype=torch.float64)
    return random_orthogonal(D, generator_for(1, "features"))


@pytest.fixture(scope="module", params=["basis", "random"])
def trained(request):
    torch.manual_seed(0)
    directions = _features(request.param)
    x = sparse_features(2048, directions, 2, generator_for(0, "tokens")).float()
    cfg = SAEConfig(k=2, expansion=2, steps=400, batch_size=128, dead_tokens=512)
    return request.param, directions, x, train_sae(x, cfg)


def test_sae_recovers_sparse_features(trained):
    kind, directions, x, result = trained
    assert matched_cosine(directions.float(), result.sae.W_dec) > 0.9, kind
    m = reconstruction_metrics(result.sae, x)
    assert m["fve"] > 0.8 and m["l0"] <= 2.0 and 0.0 <= m["dead_fraction"] < 1.0


def test_alignment_separates_basis_from_random_features(trained):
    kind, directions, x, result = trained
    live = result.sae.W_dec[(result.sae(x)[1] > 0).any(0)]
    a = decoder_alignment(live)
    if kind == "basis":  # a basis vector's coordinates have kurtosis d - 2 + 1/(d - 1) = 14.07 at d 16
        assert a["decoder_kurtosis"] > 3 * kurtosis_null(D) and a["decoder_max_share"] > 0.75
    else:
        assert abs(a["decoder_kurtosis"] - kurtosis_null(D)) < 1.0 and a["decoder_max_share"] < 0.7


def test_random_directions_read_the_null():
    w = torch.randn(4000, 32, generator=generator_for(0, "dirs"), dtype=torch.float64)
    a = decoder_alignment(w)
    assert a["decoder_kurtosis"] == pytest.approx(kurtosis_null(32), abs=0.03)  # 2.818
    assert decoder_alignment(torch.eye(8))["decoder_max_share"] == 1.0


def test_matched_cosine_finds_the_permutation():
    w = torch.randn(20, 8, generator=generator_for(0, "w"), dtype=torch.float64)
    assert matched_cosine(w, w[torch.randperm(20, generator=generator_for(1, "p"))]) == pytest.approx(1.0)
    assert matched_cosine(w, -w) < 0.5


def test_geometric_median_is_robust_and_equivariant():
    x = torch.randn(200, 4, generator=generator_for(0, "gm"), dtype=torch.float64)
    x[:5] += 1000.0  # outliers move the mean, barely the median
    m = geometric_median(x)
    assert m.norm() < 1.0 < x.mean(0).norm()
    q = random_orthogonal(4, generator_for(2, "q"))
    torch.testing.assert_close(geometric_median(x @ q), m @ q, rtol=0, atol=1e-8)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_only_the_equivariant_optimizer_trains_the_rotated_sae(optimizer):
    """SGD on rotated data from the rotated start ends at the rotated SAE; Adam does not."""
    d = 8
    x = sparse_features(512, torch.eye(d, dtype=torch.float64), 2,
                        generator_for(0, "eq")) + 0.01 * torch.randn(512, d, generator=generator_for(3, "n"), dtype=torch.float64)
    q = random_orthogonal(d, generator_for(5, "q"))
    cfg = SAEConfig(k=2, expansion=2, optimizer=optimizer, steps=40, batch_size=64, dead_tokens=64)
    raw = train_sae(x, cfg).sae
    rotated = train_sae(x @ q, cfg, init=initial_sae(d, cfg, torch.float64).rotated(q)).sae
    with torch.no_grad():
        diff = max(float((rotated.W_dec - raw.W_dec @ q).abs().max()), float((rotated.W_enc - raw.W_enc @ q).abs().max()),
                   float((rotated.b_pre - raw.b_pre @ q).abs().max()), float((rotated.b_enc - raw.b_enc).abs().max()))
    if optimizer == "sgd":
        assert diff < 1e-10
    else:
        assert diff > 1e-3


def test_config_is_validated():
    with pytest.raises(ValueError, match="k"):
        SAEConfig(k=0)
    with pytest.raises(ValueError, match="optimizer"):
        SAEConfig(optimizer="lion")
    assert SAEConfig(optimizer="sgd").learning_rate == 0.1
