"""rlkit.value.functional against textbook references written here.

References work on python floats, one environment at a time, straight from the sum
definitions (no recursion), so they share no code or structure with the implementation.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.value import functional as F
from rlkit.value.functional import gae, td_lambda, vtrace

# --------------------------------------------------------------------------- references


def _episode_end(done: list[bool], t: int) -> int:
    """Index of the first done step at or after t, or the last step of the batch."""
    for k in range(t, len(done)):
        if done[k]:
            return k
    return len(done) - 1


def _rows(x: torch.Tensor) -> list[list]:
    """[N, T, 1] -> N python lists of length T."""
    return x.squeeze(-1).tolist()


def gae_reference(r, v, nv, done, term, *, gamma, lmbda):
    """A_t = sum_{l=0}^{end-t} (gamma lmbda)^l delta_{t+l}, per env; returns (adv, target)."""
    adv_rows = []
    for rr, vv, nn, dd, tt in zip(*map(_rows, (r, v, nv, done, term)), strict=True):
        cut = [d or e for d, e in zip(dd, tt, strict=True)]
        delta = [rr[t] + gamma * (not tt[t]) * nn[t] - vv[t] for t in range(len(rr))]
        adv = []
        for t in range(len(rr)):
            end = _episode_end(cut, t)
            adv.append(sum((gamma * lmbda) ** (k - t) * delta[k] for k in range(t, end + 1)))
        adv_rows.append(adv)
    adv = torch.tensor(adv_rows, dtype=torch.float64).unsqueeze(-1)
    return adv, adv + v.double()


def td_lambda_reference(r, nv, done, term, *, gamma, lmbda):
    """G_t = (1-l) sum_{n<N} l^(n-1) G^(n)_t + l^(N-1) G^(N)_t with N the steps left."""
    rows = []
    for rr, nn, dd, tt in zip(*map(_rows, (r, nv, done, term)), strict=True):
        cut = [d or e for d, e in zip(dd, tt, strict=True)]
        row = []
        for t in range(len(rr)):
            horizon = _episode_end(cut, t) - t + 1

            def n_step(n, t=t, rr=rr, nn=nn, tt=tt):
                last = t + n - 1
                discounted = sum(gamma**k * rr[t + k] for k in range(n))
                return discounted + gamma**n * (not tt[last]) * nn[last]

            mix = sum((1 - lmbda) * lmbda ** (n - 1) * n_step(n) for n in range(1, horizon))
            row.append(mix + lmbda ** (horizon - 1) * n_step(horizon))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).unsqueeze(-1)


def vtrace_reference(blp, tlp, r, v, nv, done, term, *, gamma, lmbda, rho_clip, c_clip, pg_clip):
    """The paper's double sum, O(T^2) per env, and its pg advantage; returns (adv, vs)."""
    adv_rows, vs_rows = [], []
    rows = zip(*map(_rows, (blp, tlp, r, v, nv, done, term)), strict=True)
    for bb, pp, rr, vv, nn, dd, tt in rows:
        steps = len(rr)
        cut = [d or e for d, e in zip(dd, tt, strict=True)]
        rho = [math.exp(p - b) for p, b in zip(pp, bb, strict=True)]
        delta = [
            min(rho_clip, rho[t]) * (rr[t] + gamma * (not tt[t]) * nn[t] - vv[t])
            for t in range(steps)
        ]
        c = [lmbda * min(c_clip, x) for x in rho]
        vs = [
            vv[s]
            + sum(
                gamma ** (t - s) * math.prod(c[s:t]) * delta[t]
                for t in range(s, _episode_end(cut, s) + 1)
            )
            for s in range(steps)
        ]
        nxt = [nn[s] if cut[s] or s == steps - 1 else vs[s + 1] for s in range(steps)]
        adv = [
            min(pg_clip, rho[s]) * (rr[s] + gamma * (not tt[s]) * nxt[s] - vv[s])
            for s in range(steps)
        ]
        adv_rows.append(adv)
        vs_rows.append(vs)
    to = lambda x: torch.tensor(x, dtype=torch.float64).unsqueeze(-1)  # noqa: E731
    return to(adv_rows), to(vs_rows)


# --------------------------------------------------------------------------- data


def make_batch(n=3, steps=9, *, seed=0, dtype=torch.float64, p_done=0.25, off_policy=True):
    """A [n, steps, 1] batch with terminations AND truncations mid-batch."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, steps, 1)
    r = torch.randn(shape, generator=g, dtype=dtype)
    v = torch.randn(shape, generator=g, dtype=dtype)
    nv = torch.randn(shape, generator=g, dtype=dtype)
    done = torch.rand(shape, generator=g) < p_done
    term = done & (torch.rand(shape, generator=g) < 0.5)
    if n >= 2 and steps >= 4:  # force both kinds in every batch
        done[0, 1], term[0, 1] = True, True
        done[1, 2], term[1, 2] = True, False
    blp = -torch.rand(shape, generator=g, dtype=dtype) * 2
    tlp = -torch.rand(shape, generator=g, dtype=dtype) * 2 if off_policy else blp.clone()
    return dict(r=r, v=v, nv=nv, done=done, term=term, blp=blp, tlp=tlp)


@pytest.fixture(params=["scan", "loop"])
def kernel(request, monkeypatch):
    """Run a test through both recurrence kernels."""
    monkeypatch.setattr(F, "_SCAN_MAX_WORK", 10**9 if request.param == "scan" else -1)
    return request.param


def close(actual, expected, tol=1e-10):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (0.9, 0.5), (1.0, 1.0), (0.5, 0.0)])
def test_gae_matches_sum_definition(kernel, gamma, lmbda):
    b = make_batch(n=4, steps=11, seed=1)
    adv, target = gae(b["r"], b["v"], b["nv"], b["done"], b["term"], gamma=gamma, lmbda=lmbda)
    ref_adv, ref_target = gae_reference(
        b["r"], b["v"], b["nv"], b["done"], b["term"], gamma=gamma, lmbda=lmbda
    )
    close(adv, ref_adv)
    close(target, ref_target)


@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (0.9, 0.5), (1.0, 1.0), (0.7, 0.0)])
def test_td_lambda_matches_n_step_mixture(kernel, gamma, lmbda):
    b = make_batch(n=4, steps=11, seed=2)
    out = td_lambda(b["r"], b["nv"], b["done"], b["term"], gamma=gamma, lmbda=lmbda)
    ref = td_lambda_reference(b["r"], b["nv"], b["done"], b["term"], gamma=gamma, lmbda=lmbda)
    close(out, ref)


@pytest.mark.parametrize(
    "lmbda,rho_clip,c_clip,pg_clip",
    [(1.0, 1.0, 1.0, 1.0), (0.9, 2.0, 0.5, 1.5), (0.5, 0.7, 1.3, 0.3), (1.0, math.inf, 1.0, 1.0)],
)
def test_vtrace_matches_double_sum(kernel, lmbda, rho_clip, c_clip, pg_clip):
    b = make_batch(n=4, steps=10, seed=3)
    # stretch the log-ratios so that every clip is active somewhere
    b["tlp"] = b["blp"] + 1.5 * torch.randn(b["blp"].shape, dtype=torch.float64)
    args = (b["blp"], b["tlp"], b["r"], b["v"], b["nv"], b["done"], b["term"])
    kw = dict(gamma=0.95, lmbda=lmbda, rho_clip=rho_clip, c_clip=c_clip)
    adv, vs = vtrace(*args, **kw, pg_rho_clip=pg_clip)
    ref_adv, ref_vs = vtrace_reference(*args, **kw, pg_clip=pg_clip)
    close(vs, ref_vs)
    close(adv, ref_adv)


def test_wide_batches_use_the_loop_and_agree(monkeypatch):
    """Wide batches run the loop by default; it must match the scan and the reference."""
    width = F._SCAN_MAX_WORK // math.ceil(math.log2(37)) + 1
    b = make_batch(n=width, steps=37, seed=4, dtype=torch.float32)
    args = (b["r"], b["v"], b["nv"], b["done"], b["term"])
    loop = gae(*args, gamma=0.99, lmbda=0.95)
    monkeypatch.setattr(F, "_SCAN_MAX_WORK", 10**9)
    scan = gae(*args, gamma=0.99, lmbda=0.95)
    ref = gae_reference(*args, gamma=0.99, lmbda=0.95)
    for out in (loop, scan):
        torch.testing.assert_close(out[0].double(), ref[0], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- golden arrays


def golden_trajectory():
    """One env, 4 steps: t=1 truncated (bootstrap from V'=3.0), t=3 terminated (V'=7 unused).

    V'_0 = V_1 and V'_2 = V_3 (consistent values); V'_1 = 3.0 is the value of the true final
    observation, not of the reset observation (V_2 = 2.0).
    """
    t = lambda x: torch.tensor(x, dtype=torch.float64).view(1, 4, 1)  # noqa: E731
    r = t([1.0, 2.0, 3.0, 4.0])
    v = t([0.5, 1.0, 2.0, 1.5])
    nv = t([1.0, 3.0, 1.5, 7.0])
    done = t([0, 1, 0, 1]).bool()
    term = t([0, 0, 0, 1]).bool()
    return r, v, nv, done, term, t


def test_gae_golden(kernel):
    r, v, nv, done, term, t = golden_trajectory()
    adv, target = gae(r, v, nv, done, term, gamma=0.9, lmbda=0.5)
    # delta = r + 0.9 (1 - term) V' - V
    #   d0 = 1 + 0.9*1.0 - 0.5 = 1.4     d1 = 2 + 0.9*3.0 - 1.0 = 3.7 (truncated: bootstrap)
    #   d2 = 3 + 0.9*1.5 - 2.0 = 2.35    d3 = 4 + 0         - 1.5 = 2.5 (terminated: no V')
    # A_t = d_t + 0.45 (1 - done_t) A_{t+1}
    #   A3 = 2.5   A2 = 2.35 + 0.45*2.5 = 3.475   A1 = 3.7 (cut)   A0 = 1.4 + 0.45*3.7 = 3.065
    close(adv, t([3.065, 3.7, 3.475, 2.5]))
    close(target, t([3.565, 4.7, 5.475, 4.0]))


def test_td_lambda_golden(kernel):
    r, _, nv, done, term, t = golden_trajectory()
    out = td_lambda(r, nv, done, term, gamma=0.9, lmbda=0.5)
    # G3 = 4 (terminated)       G2 = 3 + 0.9 (0.5*1.5 + 0.5*4) = 5.475
    # G1 = 2 + 0.9*3.0 = 4.7    G0 = 1 + 0.9 (0.5*1.0 + 0.5*4.7) = 3.565
    # (equal to the GAE targets because the values are consistent)
    close(out, t([3.565, 4.7, 5.475, 4.0]))


def test_vtrace_golden(kernel):
    r, v, nv, done, term, t = golden_trajectory()
    rho = t([2.0, 0.5, 1.0, 0.25])
    adv, vs = vtrace(torch.zeros_like(rho), rho.log(), r, v, nv, done, term, gamma=0.9, lmbda=0.5)
    # rho_bar = min(1, rho) = [1, 0.5, 1, 0.25]; c = 0.5 min(1, rho) = [0.5, 0.25, 0.5, 0.125]
    # TD errors d_t as in test_gae_golden: [1.4, 3.7, 2.35, 2.5]
    # vs3 - V3 = 0.25*2.5 = 0.625                      -> vs3 = 2.125
    # vs2 - V2 = 2.35 + 0.9*0.5*0.625 = 2.63125          -> vs2 = 4.63125
    # vs1 - V1 = 0.5*3.7 = 1.85 (cut)                    -> vs1 = 2.85
    # vs0 - V0 = 1.4 + 0.9*0.5*1.85 = 2.2325             -> vs0 = 2.7325
    close(vs, t([2.7325, 2.85, 4.63125, 2.125]))
    # A_s = min(1, rho_s) (r_s + 0.9 (1 - term_s) vhat_{s+1} - V_s)
    # A0 = 1.0 (1 + 0.9*vs1 - 0.5) = 0.5 + 2.565 = 3.065
    # A1 = 0.5 (2 + 0.9*V'_1 - 1.0) = 0.5*3.7 = 1.85   (truncated: vhat = V'_1 = 3.0)
    # A2 = 1.0 (3 + 0.9*vs3 - 2.0) = 1 + 1.9125 = 2.9125
    # A3 = 0.25 (4 - 1.5) = 0.625                      (terminated)
    close(adv, t([3.065, 1.85, 2.9125, 0.625]))


# --------------------------------------------------------------------------- identities


def test_gae_lambda_zero_is_td_error(kernel):
    b = make_batch(seed=5)
    adv, _ = gae(b["r"], b["v"], b["nv"], b["done"], b["term"], gamma=0.97, lmbda=0.0)
    td_error = b["r"] + 0.97 * b["nv"] * (~b["term"]) - b["v"]
    close(adv, td_error)


def test_on_policy_vtrace_is_the_lambda_one_return(kernel):
    b = make_batch(seed=6, off_policy=False)
    args = (b["r"], b["v"], b["nv"], b["done"], b["term"])
    _, vs = vtrace(b["blp"], b["tlp"], *args, gamma=0.9, rho_clip=1.5, c_clip=1.0)
    _, gae_target = gae(*args, gamma=0.9, lmbda=1.0)
    close(vs, gae_target)
    # with consistent values (V'_t = V_{t+1} inside an episode) it is also TD(1)
    nv = torch.cat([b["v"][:, 1:], b["nv"][:, -1:]], dim=1)
    nv = torch.where(b["done"], b["nv"], nv)
    _, vs = vtrace(b["blp"], b["tlp"], b["r"], b["v"], nv, b["done"], b["term"], gamma=0.9)
    close(vs, td_lambda(b["r"], nv, b["done"], b["term"], gamma=0.9, lmbda=1.0))


@pytest.mark.parametrize("kw", [dict(c_clip=0.0), dict(lmbda=0.0)])
def test_vtrace_without_traces_is_the_one_step_target(kw):
    b = make_batch(seed=7, off_policy=False)
    _, vs = vtrace(
        b["blp"], b["tlp"], b["r"], b["v"], b["nv"], b["done"], b["term"], gamma=0.8, **kw
    )
    close(vs, b["r"] + 0.8 * b["nv"] * (~b["term"]))


def test_gae_target_equals_td_lambda_with_consistent_values(kernel):
    b = make_batch(seed=8)
    nv = torch.where(b["done"], b["nv"], torch.cat([b["v"][:, 1:], b["nv"][:, -1:]], dim=1))
    _, target = gae(b["r"], b["v"], nv, b["done"], b["term"], gamma=0.93, lmbda=0.7)
    close(target, td_lambda(b["r"], nv, b["done"], b["term"], gamma=0.93, lmbda=0.7))


# --------------------------------------------------------------------------- shapes, dtypes


def test_log_probs_without_trailing_dim_are_accepted():
    b = make_batch(seed=9)
    args = (b["r"], b["v"], b["nv"], b["done"], b["term"])
    full = vtrace(b["blp"], b["tlp"], *args, gamma=0.9)
    squeezed = vtrace(b["blp"].squeeze(-1), b["tlp"].squeeze(-1), *args, gamma=0.9)
    for x, y in zip(full, squeezed, strict=True):
        assert x.shape == b["r"].shape
        close(x, y, tol=0)


def test_outputs_are_contiguous_gradless_and_keep_dtype():
    b = make_batch(seed=10, dtype=torch.float32)
    v = b["v"].clone().requires_grad_()
    for out in gae(b["r"], v, b["nv"], b["done"], b["term"], gamma=0.9, lmbda=0.9):
        assert out.dtype == torch.float32 and out.is_contiguous() and not out.requires_grad


def test_empty_time_dimension():
    b = make_batch(n=2, steps=0, seed=11)
    args = (b["r"], b["v"], b["nv"], b["done"], b["term"])
    assert gae(*args, gamma=0.9, lmbda=0.9)[0].shape == (2, 0, 1)
    assert vtrace(b["blp"], b["tlp"], *args, gamma=0.9)[1].shape == (2, 0, 1)
    assert td_lambda(b["r"], b["nv"], b["done"], b["term"], gamma=0.9, lmbda=0.9).shape == (
        2,
        0,
        1,
    )


def _call_all(b, time_dim):
    args = (b["r"], b["v"], b["nv"], b["done"], b["term"])
    return (
        *gae(*args, gamma=0.9, lmbda=0.8, time_dim=time_dim),
        td_lambda(b["r"], b["nv"], b["done"], b["term"], gamma=0.9, lmbda=0.8, time_dim=time_dim),
        *vtrace(b["blp"], b["tlp"], *args, gamma=0.9, lmbda=0.9, c_clip=1.2, time_dim=time_dim),
    )


@settings(max_examples=40, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    steps=st.integers(1, 7),
    feature=st.integers(1, 2),
    dest=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    use_scan=st.booleans(),
)
def test_time_dim_anywhere_gives_the_transposed_result(lead, steps, feature, dest, seed, use_scan):
    """Same data with time moved to another dim gives the same result, moved likewise."""
    old = F._SCAN_MAX_WORK
    F._SCAN_MAX_WORK = 10**9 if use_scan else -1
    try:
        g = torch.Generator().manual_seed(seed)
        shape = (*lead, steps, feature)
        b = {k: torch.randn(shape, generator=g, dtype=torch.float64) for k in ("r", "v", "nv")}
        b["done"] = torch.rand(shape, generator=g) < 0.3
        b["term"] = b["done"] & (torch.rand(shape, generator=g) < 0.5)
        b["blp"], b["tlp"] = (-torch.rand(shape, generator=g, dtype=torch.float64) for _ in "ab")
        time_dim = len(lead)
        base = _call_all(b, -2)
        dest = dest % len(shape)
        moved = _call_all({k: x.movedim(time_dim, dest) for k, x in b.items()}, dest)
        for x, y in zip(base, moved, strict=True):
            close(y, x.movedim(time_dim, dest), tol=1e-12)
        # and the base result is the reference on the flattened [N, T, 1] view
        flat = {k: x.movedim(-1, 0).reshape(-1, steps, 1) for k, x in b.items()}
        ref_adv, ref_target = gae_reference(
            flat["r"], flat["v"], flat["nv"], flat["done"], flat["term"], gamma=0.9, lmbda=0.8
        )
        close(base[0].movedim(-1, 0).reshape(-1, steps, 1), ref_adv)
        close(base[1].movedim(-1, 0).reshape(-1, steps, 1), ref_target)
    finally:
        F._SCAN_MAX_WORK = old


# --------------------------------------------------------------------------- errors


def _gae_args(b):
    return (b["r"], b["v"], b["nv"], b["done"], b["term"])


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(gamma=1.5), ValueError, r"gamma must be in \[0, 1\], got 1.5"),
        (dict(gamma=-0.1), ValueError, r"gamma must be in \[0, 1\]"),
        (dict(gamma=float("nan")), ValueError, r"gamma must be in \[0, 1\]"),
        (dict(lmbda=2.0), ValueError, r"lmbda must be in \[0, 1\], got 2.0"),
        (dict(gamma=True), TypeError, r"gamma must be a real number"),
        (dict(time_dim=3), ValueError, r"time_dim=3 is out of range for inputs with 3 dims"),
    ],
)
def test_gae_rejects_bad_hyperparameters(kw, exc, match):
    b = make_batch()
    kwargs = dict(gamma=0.9, lmbda=0.9) | kw
    with pytest.raises(exc, match=match):
        gae(*_gae_args(b), **kwargs)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(rho_clip=0.0), r"rho_clip must be > 0 \(use math.inf for no clipping\), got 0.0"),
        (dict(pg_rho_clip=-1.0), r"pg_rho_clip must be > 0"),
        (dict(c_clip=-0.5), r"c_clip must be >= 0, got -0.5"),
        (dict(lmbda=-0.1), r"lmbda must be in \[0, 1\]"),
    ],
)
def test_vtrace_rejects_bad_clips(kw, match):
    b = make_batch()
    with pytest.raises(ValueError, match=match):
        vtrace(b["blp"], b["tlp"], *_gae_args(b), gamma=0.9, **kw)


def test_shape_mismatch_names_both_inputs():
    b = make_batch()
    with pytest.raises(ValueError, match=r"next_value has shape \(3, 8, 1\) but reward has"):
        gae(b["r"], b["v"], b["nv"][:, 1:], b["done"], b["term"], gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match=r"terminated has shape \(3, 9\) but reward"):
        td_lambda(b["r"], b["nv"], b["done"], b["term"][..., 0], gamma=0.9, lmbda=0.9)


def test_log_prob_shape_and_flag_dtype_errors():
    b = make_batch()
    with pytest.raises(ValueError, match=r"target_log_prob has shape \(3, 9, 2\); expected"):
        vtrace(b["blp"], b["tlp"].expand(3, 9, 2), *_gae_args(b), gamma=0.9)
    with pytest.raises(TypeError, match=r"done must be a bool tensor, got torch.float64"):
        gae(b["r"], b["v"], b["nv"], b["done"].double(), b["term"], gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match=r"reward must be a floating-point tensor"):
        gae(b["r"].long(), b["v"], b["nv"], b["done"], b["term"], gamma=0.9, lmbda=0.9)


def test_terminated_alone_cuts_the_recursion():
    """A step flagged terminated but not done is still an episode end."""
    b = make_batch(seed=12)
    inconsistent = b["done"] & ~b["term"]
    adv, _ = gae(b["r"], b["v"], b["nv"], inconsistent, b["term"], gamma=0.9, lmbda=0.9)
    ref, _ = gae_reference(b["r"], b["v"], b["nv"], b["done"], b["term"], gamma=0.9, lmbda=0.9)
    close(adv, ref)


# --------------------------------------------------------------------------- adv_mode="acme"


def acme_advantage_reference(blp, tlp, r, v, done, term, last_nv, *, gamma, lmbda, pg_clip, vs):
    """evorl's / Acme's pg advantage, read literally: the bootstrap of step s inside an
    episode is lmbda vs[s+1] + (1 - lmbda) V(x_{s+1}) with V(x_{s+1}) = v[s+1] (the next
    row's value); at a done step it is V' of the final observation, at the batch's last step
    V'_{T-1}; a terminated step bootstraps from nothing."""
    rows = []
    data = zip(*map(_rows, (blp, tlp, r, v, done, term, last_nv, vs)), strict=True)
    for bb, pp, rr, vv, dd, tt, ln, ss in data:
        row = []
        for s in range(len(rr)):
            if dd[s] or tt[s] or s == len(rr) - 1:
                boot = ln[s]
            else:
                boot = lmbda * ss[s + 1] + (1 - lmbda) * vv[s + 1]
            rho = math.exp(pp[s] - bb[s])
            row.append(min(pg_clip, rho) * (rr[s] + gamma * (not tt[s]) * boot - vv[s]))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).unsqueeze(-1)


def consistent_batch(seed):
    """make_batch with V'_t = V_{t+1} inside episodes (V' free at done steps)."""
    b = make_batch(seed=seed)
    nv = torch.cat([b["v"][:, 1:], b["nv"][:, -1:]], dim=1)
    b["nv"] = torch.where(b["done"] | b["term"], b["nv"], nv)
    return b


def test_vtrace_acme_golden(kernel):
    r, v, nv, done, term, t = golden_trajectory()
    rho = t([2.0, 0.5, 1.0, 0.25])
    kw = dict(gamma=0.9, lmbda=0.5, adv_mode="acme")
    adv, vs = vtrace(torch.zeros_like(rho), rho.log(), r, v, nv, done, term, **kw)
    close(vs, t([2.7325, 2.85, 4.63125, 2.125]))  # v_s does not depend on adv_mode
    # vhat_{s+1} = 0.5 vs_{s+1} + 0.5 V(x_{s+1}) inside an episode (V(x_1) = V'_0 = 1.0,
    # V(x_3) = V'_2 = 1.5); V' at the truncation, nothing at the termination:
    # A0 = 1.0 (1 + 0.9 (0.5*2.85 + 0.5*1.0) - 0.5) = 0.5 + 0.9*1.925 = 2.2325
    # A1 = 0.5 (2 + 0.9*3.0 - 1.0) = 1.85                 (truncated, as official)
    # A2 = 1.0 (3 + 0.9 (0.5*2.125 + 0.5*1.5) - 2.0) = 1 + 0.9*1.8125 = 2.63125
    # A3 = 0.25 (4 - 1.5) = 0.625                          (terminated, as official)
    close(adv, t([2.2325, 1.85, 2.63125, 0.625]))


@pytest.mark.parametrize("lmbda,pg_clip", [(0.0, 1.0), (0.7, 1.0), (0.95, 1.5)])
def test_vtrace_acme_matches_the_textbook_loop(kernel, lmbda, pg_clip):
    b = consistent_batch(seed=21)
    args = (b["blp"], b["tlp"], b["r"], b["v"], b["nv"], b["done"], b["term"])
    kw = dict(gamma=0.9, lmbda=lmbda, rho_clip=1.2, c_clip=0.9, pg_rho_clip=pg_clip)
    adv, vs = vtrace(*args, **kw, adv_mode="acme")
    _, ref_vs = vtrace_reference(
        *args, gamma=0.9, lmbda=lmbda, rho_clip=1.2, c_clip=0.9, pg_clip=pg_clip
    )
    close(vs, ref_vs)
    ref = acme_advantage_reference(
        b["blp"], b["tlp"], b["r"], b["v"], b["done"], b["term"], b["nv"],
        gamma=0.9, lmbda=lmbda, pg_clip=pg_clip, vs=ref_vs,
    )  # fmt: skip
    close(adv, ref)
    official, _ = vtrace(*args, **kw)
    assert (adv - official).abs().max() > 1e-3  # the modes differ for lmbda < 1


def test_on_policy_acme_advantage_is_gae(kernel):
    """rho = 1, consistent values: Acme's advantage is GAE(lambda)'s."""
    b = make_batch(seed=22, off_policy=False)
    nv = torch.cat([b["v"][:, 1:], b["nv"][:, -1:]], dim=1)
    nv = torch.where(b["done"] | b["term"], b["nv"], nv)
    args = (b["r"], b["v"], nv, b["done"], b["term"])
    adv, _ = vtrace(b["blp"], b["tlp"], *args, gamma=0.9, lmbda=0.8, adv_mode="acme")
    close(adv, gae_reference(*args, gamma=0.9, lmbda=0.8)[0])


def test_adv_modes_agree_at_lambda_one_and_official_is_the_default():
    b = make_batch(seed=23)
    args = (b["blp"], b["tlp"], *_gae_args(b))
    default = vtrace(*args, gamma=0.9, lmbda=0.6)
    official = vtrace(*args, gamma=0.9, lmbda=0.6, adv_mode="official")
    assert all(torch.equal(x, y) for x, y in zip(default, official, strict=True))
    acme = vtrace(*args, gamma=0.9, lmbda=1.0, adv_mode="acme")
    close(acme[0], vtrace(*args, gamma=0.9, lmbda=1.0)[0])


@pytest.mark.parametrize("mode", ["ACME", "rllib", None, ""])
def test_vtrace_rejects_an_unknown_adv_mode(mode):
    b = make_batch()
    with pytest.raises(ValueError, match=r"^vtrace: adv_mode must be 'official' .* or 'acme'"):
        vtrace(b["blp"], b["tlp"], *_gae_args(b), gamma=0.9, adv_mode=mode)


def test_the_value_page_adv_mode_example_runs(capsys):
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "value.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "adv_mode=mode" in b]
    exec(compile(block, "docs/value.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "official [3.065, 1.85, 2.9125, 0.625]",
        "acme [2.2325, 1.85, 2.63125, 0.625]",
    ]
