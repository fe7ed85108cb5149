"""TorchRL's ``MaskedCategorical`` (dense mask) against rlkit's masked logits
(``MaskedHead``: the lowest float where masked, then torch's ``Categorical``): right, and how fast.

    .venv/bin/python benchmarks/bench_masked_categorical.py \\
        --out benchmarks/results/bench_masked_categorical.json

Checks, per shape (rows x actions, a random mask per row with at least one valid action, one
row with a single valid action): samples and mode valid; log-prob and entropy against a softmax
over the valid logits (float64); gradient exactly 0 at masked logits and finite; KL finite; and
whether ``probs * (1 - 2 * log_softmax(dist.logits))`` (a loss that multiplies probabilities by
scaled log-probabilities, as discrete SAC's) is finite. Timings (median of ``--repeats``, one
thread): "collect" = build + sample + log-prob without gradient; "loss" = build + log-prob +
entropy + backward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torchrl.modules import MaskedCategorical

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlkit.modules.masks import masked_fill_lowest  # noqa: E402


def rlkit_dist(logits, mask):
    return torch.distributions.Categorical(logits=masked_fill_lowest(logits, mask))


def torchrl_dist(logits, mask):
    return MaskedCategorical(logits=logits, mask=mask)


def checks(make, logits, mask) -> dict:
    ref = torch.where(mask, logits.double(), -torch.inf).log_softmax(-1)
    raw = logits.clone().requires_grad_()
    d = make(raw, mask)
    a = d.sample()
    lp, ent = d.log_prob(a), d.entropy()
    (lp.sum() + ent.sum()).backward()
    p = ref.exp()
    ref_ent = -torch.where(mask, p * ref, 0.0).sum(-1)
    with torch.no_grad():
        kl = torch.distributions.kl_divergence(d, make(logits + 0.1, mask))
        consumer = (d.probs * (1.0 - 2.0 * d.logits.log_softmax(-1))).sum(-1)
    return dict(
        samples_valid=bool(mask.gather(-1, a[:, None]).all()),
        mode_valid=bool(mask.gather(-1, d.mode[:, None]).all()),
        log_prob_err=float((lp.double() - ref.gather(-1, a[:, None]).squeeze(-1)).abs().max()),
        entropy_err=float((ent.double() - ref_ent).abs().max()),
        grad_zero_at_masked=bool((raw.grad[~mask] == 0).all()),
        grad_finite=bool(torch.isfinite(raw.grad).all()),
        kl_finite=bool(torch.isfinite(kl).all()),
        logits_consumer_finite=bool(torch.isfinite(consumer).all()),
    )


def timing(make, logits, mask, repeats: int) -> dict:
    action = make(logits, mask).sample()

    def collect():
        with torch.no_grad():
            d = make(logits, mask)
            d.log_prob(d.sample())

    raw = logits.clone().requires_grad_()

    def loss():
        d = make(raw, mask)
        (d.log_prob(action).sum() + d.entropy().sum()).backward()

    out = {}
    for name, fn in (("collect_us", collect), ("loss_us", loss)):
        for _ in range(20):
            fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        out[name] = round(statistics.median(times), 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for b, n in ((8, 8), (256, 8), (256, 1000)):
        logits = torch.randn(b, n) * 3
        mask = torch.rand(b, n) < 0.5
        mask[torch.arange(b), torch.randint(0, n, (b,))] = True
        mask[0] = False
        mask[0, n - 1] = True  # one valid action
        for name, make in (
            ("rlkit MaskedHead", rlkit_dist),
            ("torchrl MaskedCategorical", torchrl_dist),
        ):
            row = dict(rows=b, actions=n, dist=name)
            row |= checks(make, logits, mask) | timing(make, logits, mask, args.repeats)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        import torchrl

        meta = dict(
            command=" ".join(sys.argv), torch=torch.__version__, torchrl=torchrl.__version__
        )
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))


if __name__ == "__main__":
    main()
