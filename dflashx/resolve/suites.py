"""The eval stage's suites, resolved: built-in names become their definitions, counts are filled in.

A suite that names a built-in (`dflashx.config.eval_suites`) takes the built-in's definition, and
the keys the recipe wrote override it; a suite that gives a `path` drops the built-in's hub id
(`{name: gsm8k, path: gsm8k_test.parquet}` reads a local copy of GSM8K with its template and
sampling). `count` defaults to `stages.eval.num_prompts`. `sampled_runs` is how many seeded decodes
at the serving temperature join the greedy one (`stages.eval.sampling_seeds` when `deploy.temperature`
> 0, else none), and `decodes` how many prompts the stage decodes at most: each suite's count, once
per drafter (the trained one and each baseline) and run (the greedy one and the sampled ones).
Pure: no I/O.
"""

from __future__ import annotations

from dflashx.config.eval_suites import BENCHMARKS
from dflashx.config.schema import DeploySpec, EvalStage, EvalSuite
from dflashx.resolve.model import ResolvedEvalStage, ResolvedSuite

_LOCATION = ("path", "hf_id", "hf_config", "split")


def resolve_suite(suite: EvalSuite, num_prompts: int) -> ResolvedSuite:
    """`suite` with its built-in definition under the keys it set, and its count decided."""
    written = suite.model_dump(include=suite.model_fields_set)
    builtin = dict(BENCHMARKS.get(suite.name, {}))
    if "path" in written or "hf_id" in written:  # its own location replaces the built-in's
        builtin = {k: v for k, v in builtin.items() if k not in _LOCATION}
    merged = {**suite.model_dump(), **builtin, **written}
    return ResolvedSuite(**{**merged, "count": merged["count"] or num_prompts})


def resolve_eval(stage: EvalStage, deploy: DeploySpec) -> ResolvedEvalStage:
    """The eval stage with every suite resolved, its sampled runs and the number of decodes it runs at most."""
    suites = [resolve_suite(s, stage.num_prompts) for s in stage.suites]
    sampled = stage.sampling_seeds if deploy.temperature > 0 else 0
    # every drafter greedily; the trained drafter (whose τ predicts the served speed-up) also sampled
    decodes = sum(s.count for s in suites) * (1 + len(stage.baselines) + sampled)
    return ResolvedEvalStage(**{**dict(stage), "suites": suites, "sampled_runs": sampled, "decodes": decodes})
