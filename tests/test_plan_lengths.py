"""The output-length distribution: its moments and quantiles against samples drawn from it."""

from __future__ import annotations

import random

import pytest

from dflashx.config.schema import DatasetStats, OutputHistogram
from dflashx.plan.estimates.lengths import HistogramLengths, OutputLengths, scaled_stats


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


def _samples(n: int, cap: float | None = None) -> list[float]:
    rng = random.Random(1)
    return [min(round(rng.lognormvariate(7.3, 0.8)), cap or 1e12) for _ in range(n)]


def test_a_measured_histogram_reproduces_its_samples():
    xs = _samples(2000, cap=8192)
    d = HistogramLengths.of(HistogramLengths.histogram(xs, cut_at=8192))
    cut = sum(x >= 8192 for x in xs) / len(xs)
    assert cut > 0 and d.share_above(8192) == pytest.approx(cut)
    for cap in (512, 3000, 8192):
        for k in (1, 2):
            sample = sum(min(x, cap) ** k for x in xs) / len(xs)
            assert d.clipped_moment(k, cap) == pytest.approx(sample, rel=0.01), (cap, k)
    for p in (0.1, 0.5, 0.9):
        assert d.quantile(p) == pytest.approx(sorted(xs)[int(p * len(xs))], rel=0.02)
    for t in (300, 1500, 5000):
        assert d.share_above(t) == pytest.approx(sum(x > t for x in xs) / len(xs), abs=0.002)


def test_a_stated_histogram_is_the_distribution_and_bounds_its_tail():
    hist = OutputHistogram(edges=[0, 1000, 2000, 4000], counts=[50, 30, 15], above=5)
    d = OutputLengths.of(DatasetStats(output_tokens_histogram=hist))
    assert isinstance(d, HistogramLengths) and "histogram of 3 bins" in d.source
    assert d.mean == pytest.approx(0.5 * 500 + 0.3 * 1500 + 0.15 * 3000 + 0.05 * 4000)
    assert d.share_above(1500) == pytest.approx(0.15 + 0.15 + 0.05)
    assert d.share_above(10_000) == 0.05  # beyond the last edge: the whole tail, an upper bound
    assert d.quantile(0.25) == pytest.approx(500) and d.quantile(0.99) == 4000
    assert d.clipped_moment(1, 1000) == pytest.approx(0.5 * 500 + 0.5 * 1000)
    with pytest.raises(ValueError, match="one count per bin"):
        OutputHistogram(edges=[0, 10], counts=[1, 2])
    with pytest.raises(ValueError, match="never decrease"):
        OutputHistogram(edges=[0, 10, 5], counts=[1, 2])


@pytest.mark.parametrize("stats", [DatasetStats(output_tokens_mean=1818, output_tokens_p90=3600),
                                   DatasetStats(output_tokens_histogram=HistogramLengths.histogram(_samples(500)))])
def test_scaling_moves_every_length(stats):
    d, twice = OutputLengths.of(stats), OutputLengths.of(scaled_stats(stats, 2.0))
    assert twice.mean == pytest.approx(2 * d.mean)
    assert twice.quantile(0.9) == pytest.approx(2 * d.quantile(0.9))
    assert twice.share_above(2000) == pytest.approx(d.share_above(1000))
    assert d.scaled(2.0).clipped_moment(2, 4000) == pytest.approx(twice.clipped_moment(2, 4000))
