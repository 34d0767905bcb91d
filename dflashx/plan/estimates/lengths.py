"""The output-length distribution behind every length-dependent estimate: log-normal through the
recipe's mean and, when given, its 90th percentile (`dataset.stats.output_tokens_p90`).

Reasoning traces are right-skewed and positive, which a log-normal captures with two numbers.
Without a stated p90 the spread is an assumption, said so in `--explain`: a coefficient of
variation of 1 (sigma^2 = ln 2). The pilot and calibration replace it with measured lengths.

The interface every estimate uses (keep it when adding other distributions, e.g. a histogram):
`mean`, `quantile(p)`, `share_above(tokens)` and `clipped_moment(k, cap)` = E[min(X, cap)^k]
(the mean and second moment of what a `max_tokens` cap lets through).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from dflashx.config.schema import DatasetStats

ASSUMED_CV = 1.0
_Z90 = 1.2815515655446004  # standard normal 90th percentile
_N = NormalDist()


@dataclass(frozen=True)
class OutputLengths:
    mu: float
    sigma: float
    stated: bool  # the spread comes from a stated p90, not the assumption

    @classmethod
    def of(cls, stats: DatasetStats) -> "OutputLengths":
        return cls.through(stats.output_tokens_mean, stats.output_tokens_p90)

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

    @property
    def source(self) -> str:
        return ("log-normal through output_tokens_mean and output_tokens_p90" if self.stated else
                f"log-normal through output_tokens_mean with an assumed CV of {ASSUMED_CV:g} "
                "(state dataset.stats.output_tokens_p90 to replace it)")
