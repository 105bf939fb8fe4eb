"""Random orthogonal bases, seeded streams and the rotation plan's sharing structure."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from study.config import RotationConfig, TrialConfig
from study.model import Rotate, Transformer
from study.rotation import build_plan, generator_for, random_orthogonal
from variants import L, ROTATIONS


D = 16
MODES = ROTATIONS


def plan(mode, seed=0):
    return build_plan(RotationConfig.model_validate(MODES[mode]), L, D, seed)


def blocks(mode, seed=0):
    return list(plan(mode, seed).blocks)


def ident(r):
    return None if r is None else id(r)


# ---- random_orthogonal / generator_for -----------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 7, 64])
def test_random_orthogonal_is_orthogonal(d):
    q = random_orthogonal(d, generator_for(0, "t"))
    assert q.dtype == torch.float64 and q.shape == (d, d)
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(q @ q.T, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(q.T @ q, eye, atol=1e-12, rtol=0)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 48), seed=st.integers(0, 2**31), scale=st.floats(1e-3, 1e3))
def test_random_orthogonal_preserves_norms(d, seed, scale):
    x = torch.randn(32, d, generator=generator_for(seed, "data"), dtype=torch.float64) * scale
    q = random_orthogonal(d, generator_for(seed, "q"))
    torch.testing.assert_close((x @ q).norm(dim=1), x.norm(dim=1), rtol=1e-12, atol=0)
    torch.testing.assert_close(x @ q @ q.T, x, rtol=1e-12, atol=1e-12 * scale)


def test_random_orthogonal_dtype_and_sign_fix():
    q32 = random_orthogonal(8, generator_for(3, "q"), dtype=torch.float32)
    q64 = random_orthogonal(8, generator_for(3, "q"))
    assert q32.dtype == torch.float32
    torch.testing.assert_close(q32.double(), q64, atol=1e-7, rtol=0)
    # Haar sign fix: the diagonal of R in q = QR(a) has been made positive, so q is QR-unique
    a = torch.randn(8, 8, generator=generator_for(3, "q"), dtype=torch.float64)
    torch.testing.assert_close(q64.T @ a, torch.triu(q64.T @ a), atol=1e-12, rtol=0)
    assert (torch.diagonal(q64.T @ a) > 0).all()


def test_haar_mean_is_zero():
    # E[Q] = 0 for Haar measure; plain QR without the sign fix is biased (positive diagonal of R).
    qs = torch.stack([random_orthogonal(3, generator_for(0, "haar", i)) for i in range(2000)])
    assert qs.mean(0).abs().max() < 0.08


def test_generator_for_is_deterministic_and_separates_streams():
    draw = lambda *a: torch.randn(4, generator=generator_for(*a))
    assert torch.equal(draw(0, "init"), draw(0, "init"))
    assert not torch.equal(draw(0, "init"), draw(1, "init"))
    assert not torch.equal(draw(0, "init"), draw(0, "rotation"))
    assert not torch.equal(draw(0, "ab"), draw(0, "a", "b"))
    assert not torch.equal(draw(0, 1), draw(0, "1", "x"))


# ---- build_plan ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_plan_shape_orthogonal_and_deterministic(mode):
    p = blocks(mode)
    assert len(p) == L and all(len(e) == 2 for e in p)
    eye = torch.eye(D, dtype=torch.float64)
    for r in (r for e in p for r in e if r is not None):
        assert r.dtype == torch.float64 and r.shape == (D, D)
        torch.testing.assert_close(r @ r.T, eye, atol=1e-12, rtol=0)
    for a, b in zip(p, blocks(mode)):
        for ra, rb in zip(a, b):
            assert (ra is None and rb is None) or torch.equal(ra, rb)
    if mode != "none":
        r0 = next(r for e in p for r in e if r is not None)
        r1 = next(r for e in blocks(mode, seed=1) for r in e if r is not None)
        assert not torch.allclose(r0, r1)


def test_plan_none():
    assert blocks("none") == [(None, None)] * L


def test_plan_shared_is_one_tensor():
    p = blocks("shared")
    assert len({id(r) for e in p for r in e}) == 1


def test_plan_independent_all_distinct():
    rs = [r for e in blocks("independent") for r in e]
    assert len(rs) == 2 * L
    for i in range(len(rs)):
        for j in range(i):
            assert not torch.allclose(rs[i], rs[j])


@pytest.mark.parametrize("k", [1, 2, 3, L])
def test_plan_partial_groups_of_k(k):
    p = build_plan(RotationConfig(mode="partial", group_size=k), L, D, 0).blocks
    for l in range(L):
        assert p[l][0] is p[l][1]  # both reads of a block share the block's basis
        for m in range(L):
            same = l // k == m // k
            assert (p[l][0] is p[m][0]) == same
            if not same:
                assert not torch.allclose(p[l][0], p[m][0])


def test_plan_partial_extremes():
    per_block = blocks("partial1")
    assert len({id(e[0]) for e in per_block}) == L
    shared, full = blocks("shared"), blocks("partialL")
    assert len({id(r) for e in full for r in e}) == 1
    assert torch.equal(full[0][0], shared[0][0])  # group_size = n_layers: its blocks read as shared's


def test_plan_groups():
    p = blocks("groups")
    assert p[1] == (None, None)  # block in no list: identity
    assert p[0][0] is p[0][1] is p[2][0] is p[2][1]
    assert p[3][0] is p[3][1] and p[3][0] is not p[0][0]
    assert not torch.allclose(p[3][0], p[0][0])
    assert torch.equal(p[0][0], blocks("shared")[0][0])  # group g uses the same stream in every mode


def test_plan_rejects_bad_groups():
    with pytest.raises(ValueError):
        build_plan(RotationConfig(mode="groups", groups=[[0, 9]]), L, D, 0)
    with pytest.raises(ValueError):
        build_plan(RotationConfig(mode="partial", group_size=L + 1), L, D, 0)


# ---- the plan inside a model ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_model_holds_plan(mode):
    cfg = TrialConfig(model={"d_model": D, "n_layers": L, "n_heads": 2}, rotation=MODES[mode],
                      optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 1}, data={"seq_len": 8})
    model = Transformer.from_config(cfg, dtype=torch.float64)
    for block, (ra, rm) in zip(model.blocks, blocks(mode)):
        for read, write, r in ((block.read_attn, block.write_attn, ra), (block.read_mlp, block.write_mlp, rm)):
            if r is None:
                assert isinstance(read, torch.nn.Identity) and isinstance(write, torch.nn.Identity)
            else:
                assert isinstance(read, Rotate) and isinstance(write, Rotate)
                assert torch.equal(read.matrix, r) and torch.equal(write.matrix, r.T)
                x = torch.randn(2, 3, D, dtype=torch.float64)
                torch.testing.assert_close(write(read(x)), x, atol=1e-12, rtol=0)
    ends = plan(mode)
    for module, r, transposed in ((model.write_emb, ends.embed, True), (model.read_out, ends.unembed, False)):
        if r is None:
            assert isinstance(module, torch.nn.Identity)
        else:
            assert isinstance(module, Rotate) and torch.equal(module.matrix, r.T if transposed else r)


# ---- the ends: embeddings write, final norm + unembedding read --------------------------------


def test_block_bases_keep_their_stream_tags():
    """Block matrices are drawn from the same tags as before the ends were rotated (old trials'
    blocks are unchanged), and the ends never reuse a block's stream (except shared's one R)."""
    ind, sh = plan("independent", seed=2), plan("shared", seed=2)
    for l, (ra, rm) in enumerate(ind.blocks):
        assert torch.equal(ra, random_orthogonal(D, generator_for(2, "rotation", "block", l, "attn")))
        assert torch.equal(rm, random_orthogonal(D, generator_for(2, "rotation", "block", l, "mlp")))
    assert torch.equal(sh.blocks[0][0], random_orthogonal(D, generator_for(2, "rotation", "group", 0)))
    assert torch.equal(ind.embed, random_orthogonal(D, generator_for(2, "rotation", "embed")))
    assert torch.equal(ind.unembed, random_orthogonal(D, generator_for(2, "rotation", "unembed")))


@pytest.mark.parametrize("mode", MODES)
def test_plan_ends(mode):
    p = plan(mode)
    if mode == "none":
        assert p.embed is None and p.unembed is None
        return
    if mode == "shared":
        assert p.embed is p.unembed is p.blocks[0][0]
        return
    reads = [r for e in p.blocks for r in e if r is not None]
    assert p.embed is not None and p.unembed is not None and not torch.allclose(p.embed, p.unembed)
    for r in reads:  # a basis of their own in every other mode
        assert not torch.allclose(p.embed, r) and not torch.allclose(p.unembed, r)
    assert torch.equal(p.embed, plan("independent").embed)  # one stream per end in every mode


@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"])
def test_embeddings_false_leaves_the_ends_and_only_them(mode):
    spec = MODES[mode] if isinstance(MODES[mode], dict) else {"mode": MODES[mode]}
    off = build_plan(RotationConfig.model_validate({**spec, "embeddings": False}), L, D, 0)
    assert off.embed is None and off.unembed is None
    for a, b in zip(off.blocks, plan(mode).blocks):
        assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))


def test_plan_map_keeps_sharing_and_identities():
    p = plan("groups")
    seen = []
    m = p.map(lambda r: seen.append(r) or r * 2)
    assert len(seen) == 4  # group 0, group 1, embed, unembed: each distinct tensor once
    assert m.blocks[1] == (None, None)
    assert m.blocks[0][0] is m.blocks[2][1] and torch.equal(m.blocks[0][0], 2 * p.blocks[0][0])
    assert torch.equal(m.embed, 2 * p.embed)


def test_rotation_config_embeddings_option():
    on, off = RotationConfig(mode="shared"), RotationConfig(mode="shared", embeddings=False)
    assert on.embeddings and (on.label, off.label) == ("shared", "shared-noemb")
    assert RotationConfig(mode="partial", group_size=2, embeddings=False).label == "partial(2)-noemb"
    assert RotationConfig.model_validate("none").label == "none"
    with pytest.raises(ValueError, match="embeddings: false needs a rotation"):
        RotationConfig(mode="none", embeddings=False)
    cfg = lambda r: TrialConfig(model={"d_model": D, "n_layers": L, "n_heads": 2}, rotation=r,
                                optimizer={"name": "adam", "lr": 1e-3}, train={"steps": 1})
    a, b, n = cfg(on), cfg(off), cfg("none")
    assert a.trial_id != b.trial_id and a.config_id != b.config_id  # it is science
    assert (a.flat()["rotate_embeddings"], b.flat()["rotate_embeddings"], n.flat()["rotate_embeddings"]) == (True, False, None)
    assert b.flat()["rotation_label"] == "shared-noemb" and n.flat()["rotation_label"] == "none"
    assert TrialConfig.model_validate_json(b.model_dump_json()) == b
