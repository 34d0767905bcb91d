"""How much of the measured GEMM ceiling a dense weight GEMM reaches at the rows a forward gives it (pure).

A forward of T tokens multiplies T rows by each weight matrix. engine.py's GEMM ceiling was measured at 8,192^3
(`device_ceilings.json`); `benchmarks/dense_gemm.py` times the registered dense targets' projections at
T = 1 ... 4,096 rows (cuBLAS through torch, replayed in a CUDA graph, weights never in L2), and
`DENSE_EFFICIENCY` holds, per row count, the FLOPs over (time x the same run's 8,192^3 rate). Until that
measurement is in (benchmarks/results/dense_gemm.json), every row count gets the 8,192^3 share: efficiency 1.
"""

from __future__ import annotations

from dflashx.plan.estimates.interpolate import log_interpolate

# (rows, efficiency against the dense 8,192^3 bf16 GEMM of the same run): not measured yet (module doc)
DENSE_EFFICIENCY: tuple[tuple[float, float], ...] = ((1, 1.0), (8192, 1.0))


def dense_efficiency(rows: float) -> float:
    """DENSE_EFFICIENCY interpolated in log(rows), held at its ends."""
    return log_interpolate(DENSE_EFFICIENCY, rows)
