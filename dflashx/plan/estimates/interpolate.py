"""A measured curve read between its points: linear in the log of the abscissa, held at its ends."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def log_interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """The value at `x` of the (x, value) points, sorted by x: linear in log(x) between two, held at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return points[-1][1]
