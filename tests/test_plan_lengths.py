"""The output-length distribution: its moments and quantiles against samples drawn from it."""

from __future__ import annotations

import random

import pytest

from dflashx.plan.estimates.lengths import OutputLengths


@pytest.mark.parametrize("mean,p90", [(1818.0, 3600.0), (52.0, 78.0), (1818.0, None)])
def test_moments_and_quantiles_match_samples(mean, p90):
    d = OutputLengths.through(mean, p90)
    assert d.mean == pytest.approx(mean)
    if p90 is not None:
        assert d.quantile(0.9) == pytest.approx(p90)
    rng = random.Random(0)
    xs = sorted(rng.lognormvariate(d.mu, d.sigma) for _ in range(200_000))
    assert d.quantile(0.5) == pytest.approx(xs[len(xs) // 2], rel=0.02)
    for cap in (None, mean, 4 * mean):
        for k in (1, 2):
            sample = sum(min(x, cap or x) ** k for x in xs) / len(xs)
            assert d.clipped_moment(k, cap) == pytest.approx(sample, rel=0.03), (cap, k)
    cap = 2 * mean
    assert d.share_above(cap) == pytest.approx(sum(x > cap for x in xs) / len(xs), abs=0.005)


def test_a_cap_lowers_the_moments_and_a_zero_cap_lets_nothing_through():
    d = OutputLengths.through(1818.0, 3600.0)
    assert d.clipped_moment(1, 1024) < 1024 < d.mean
    assert d.clipped_moment(2, 8192) < d.clipped_moment(2)
    assert d.clipped_moment(1, 0) == 0.0
