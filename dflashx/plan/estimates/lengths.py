"""The output-length distribution behind every length-dependent estimate.

`OutputLengths.of(stats)` is the one place that picks it: the recipe's histogram
(`dataset.stats.output_tokens_histogram`, stated or measured by `dflashx pilot`) when there is one,
else a log-normal through the recipe's mean and, when given, its 90th percentile
(`dataset.stats.output_tokens_p90`). Reasoning traces are right-skewed and positive, which a
log-normal captures with two numbers. Without a stated p90 the spread is an assumption, said so
in `--explain`: a coefficient of variation of 1 (sigma^2 = ln 2).

The interface every estimate uses, shared by both distributions: `mean`, `quantile(p)`,
`share_above(tokens)`, `clipped_moment(k, cap)` = E[min(X, cap)^k] (the mean and second moment of
what a `max_tokens` cap lets through), `scaled(factor)` (every length times `factor`: the range
scenarios) and `source` (one line for messages and `--explain`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from statistics import NormalDist
from typing import Protocol

from dflashx.config.schema import DatasetStats, OutputHistogram

ASSUMED_CV = 1.0
_Z90 = 1.2815515655446004  # standard normal 90th percentile
_N = NormalDist()


@dataclass(frozen=True)
class OutputLengths:
    mu: float
    sigma: float
    stated: bool  # the spread comes from a stated p90, not the assumption

    @staticmethod
    def of(stats: DatasetStats) -> "OutputLengths | HistogramLengths":
        """The distribution the recipe states: its histogram, else the log-normal through the mean
        (and p90)."""
        if stats.output_tokens_histogram is not None:
            return HistogramLengths.of(stats.output_tokens_histogram)
        return OutputLengths.through(stats.output_tokens_mean, stats.output_tokens_p90)

    @classmethod
    def through(cls, mean: float, p90: float | None = None) -> "OutputLengths":
        """The log-normal with this mean and, when given and above the mean, this p90."""
        if p90 is not None and p90 > mean:
            # mean = exp(mu + s^2/2), p90 = exp(mu + z s): s^2/2 - z s + ln(p90/mean) = 0, smaller root
            disc = _Z90 ** 2 - 2 * math.log(p90 / mean)
            if disc >= 0:
                sigma = _Z90 - math.sqrt(disc)
                return cls(math.log(mean) - sigma ** 2 / 2, sigma, True)
        sigma = math.sqrt(math.log(1 + ASSUMED_CV ** 2))
        return cls(math.log(mean) - sigma ** 2 / 2, sigma, False)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma ** 2 / 2)

    def quantile(self, p: float) -> float:
        """The length below which a share `p` (0 < p < 1) of completions end."""
        return math.exp(self.mu + self.sigma * _N.inv_cdf(p))

    def share_above(self, tokens: float) -> float:
        """Expected share of completions longer than `tokens`."""
        if tokens <= 0:
            return 1.0
        z = (math.log(tokens) - self.mu) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))

    def clipped_moment(self, k: int, cap: float | None = None) -> float:
        """E[min(X, cap)^k]: the k-th moment of lengths cut at `cap` (None: uncut).

        For a log-normal, E[X^k; X < c] = exp(k mu + k^2 s^2 / 2) Phi((ln c - mu - k s^2) / s).
        """
        raw = math.exp(k * self.mu + k * k * self.sigma ** 2 / 2)
        if cap is None:
            return raw
        if cap <= 0:
            return 0.0
        below = raw * _N.cdf((math.log(cap) - self.mu - k * self.sigma ** 2) / self.sigma)
        return below + cap ** k * self.share_above(cap)

    def scaled(self, factor: float) -> "OutputLengths":
        return OutputLengths(self.mu + math.log(factor), self.sigma, self.stated)

    @property
    def source(self) -> str:
        return ("log-normal through output_tokens_mean and output_tokens_p90" if self.stated else
                f"log-normal through output_tokens_mean with an assumed CV of {ASSUMED_CV:g} "
                "(state dataset.stats.output_tokens_p90 to replace it)")


@dataclass(frozen=True)
class HistogramLengths:
    """Lengths spread evenly inside each bin; `above` is the share longer than the last edge, whose
    lengths are unknown beyond it (a pilot's completions cut at max_tokens). Past the last edge the
    figures are bounds: `share_above` keeps the whole tail (an upper bound), `clipped_moment` and
    `quantile` put it at the last edge (lower bounds)."""

    edges: tuple[float, ...]
    shares: tuple[float, ...]  # one per bin, with `above` summing to 1
    above: float

    @classmethod
    def of(cls, hist: OutputHistogram) -> "HistogramLengths":
        total = sum(hist.counts) + hist.above
        return cls(tuple(hist.edges), tuple(c / total for c in hist.counts), hist.above / total)

    @classmethod
    def histogram(cls, lengths: list[float], cut_at: float | None = None) -> OutputHistogram:
        """Measured lengths as the histogram whose edges are the sorted lengths themselves (the
        empirical distribution, linear between neighbours, each length weighing one); lengths at
        `cut_at` or above (completions stopped by max_tokens) become `above`, with a last edge at
        `cut_at`."""
        kept = sorted(x for x in lengths if cut_at is None or x < cut_at)
        above = float(len(lengths) - len(kept))
        edges = kept if len(kept) > 1 else kept * 2 or [cut_at or 0.0] * 2
        counts = [len(kept) / (len(edges) - 1)] * (len(edges) - 1)
        if above and cut_at is not None and cut_at > edges[-1]:
            edges, counts = [*edges, cut_at], [*counts, 0.0]
        return OutputHistogram(edges=edges, counts=counts, above=above)

    def _bins(self):
        return zip(self.edges, self.edges[1:], self.shares)

    @property
    def mean(self) -> float:
        return self.clipped_moment(1)

    @cached_property
    def _cumulative(self) -> list[float]:
        return list(accumulate(self.shares))

    def quantile(self, p: float) -> float:
        cum = self._cumulative
        i = bisect_right(cum, p)
        if i >= len(self.shares):
            return self.edges[-1]
        lo, hi, share = self.edges[i], self.edges[i + 1], self.shares[i]
        before = cum[i] - share
        return lo + (hi - lo) * ((p - before) / share if share else 0.0)

    def share_above(self, tokens: float) -> float:
        out = self.above
        for lo, hi, share in self._bins():
            if tokens < lo:
                out += share
            elif tokens < hi:
                out += share * (hi - tokens) / (hi - lo)
        return out

    def clipped_moment(self, k: int, cap: float | None = None) -> float:
        """E[min(X, cap)^k]: inside a bin [a, b) cut at c, the uniform density gives
        (min(b, c)^(k+1) - a^(k+1)) / ((k+1)(b-a)) + c^k x the bin's share above c."""
        cap = math.inf if cap is None else max(cap, 0.0)
        total = self.above * min(self.edges[-1], cap) ** k
        for lo, hi, share in self._bins():
            if hi == lo or cap <= lo:
                total += share * min(lo, cap) ** k
                continue
            top = min(hi, cap)
            below = (top ** (k + 1) - lo ** (k + 1)) / ((k + 1) * (hi - lo))
            total += share * (below + cap ** k * (hi - top) / (hi - lo) if top < hi else below)
        return total

    def scaled(self, factor: float) -> "HistogramLengths":
        return HistogramLengths(tuple(e * factor for e in self.edges), self.shares, self.above)

    @property
    def source(self) -> str:
        tail = f"; {self.above:.1%} longer than {self.edges[-1]:,.0f} (cut there)" if self.above else ""
        return f"histogram of {len(self.shares)} bins (dataset.stats.output_tokens_histogram{tail})"


class Lengths(Protocol):
    """What every estimate reads of an output-length distribution (both classes above)."""

    @property
    def mean(self) -> float: ...
    def quantile(self, p: float) -> float: ...
    def share_above(self, tokens: float) -> float: ...
    def clipped_moment(self, k: int, cap: float | None = None) -> float: ...
    def scaled(self, factor: float) -> "Lengths": ...
    @property
    def source(self) -> str: ...


def scaled_stats(stats: DatasetStats, factor: float) -> DatasetStats:
    """`stats` with every output length times `factor` (mean, p90 and histogram edges alike)."""
    hist = stats.output_tokens_histogram
    update = {
        "output_tokens_mean": stats.output_tokens_mean * factor,
        "output_tokens_p90": stats.output_tokens_p90 * factor if stats.output_tokens_p90 else None,
        "output_tokens_histogram": (hist.model_copy(update={"edges": [e * factor for e in hist.edges]})
                                    if hist else None),
    }
    return stats.model_copy(update=update)
