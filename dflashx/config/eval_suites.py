"""The eval stage's built-in names: the run's held-out suite, the untrained baseline, and the
benchmarks the DFlash paper reports (Chen, Liang, Liu 2026, arXiv 2602.06036), as data.

A recipe names them in `stages.eval.suites` / `stages.eval.baselines`; `dflashx.resolve.suites`
turns a name into its full definition (`ResolvedSuite`) once. Each benchmark is loaded from the
`datasets` hub id, configuration and split that the z-lab reference's benchmark script loads
(PyPI `dflash` 0.1.0, `dflash/benchmark.py`, `DATASETS`), and its user turn is written with the
same text around the record's field (`format` there, `template` here), so a drafter's τ on them is
measured on the prompts z-lab measures theirs on. Alpaca is in the paper's table but not in that
script: its records become a user turn as the `alpaca` source format does (instruction, then the
input when there is one). The prompts are picked as the script's `_select_dataset` picks them:
the record order shuffled by `random.Random(42)`, then the first `count`. MT-Bench records hold two
user turns (`prompt` is a list); the suite decodes the first (the script's server mode does the
same). Every record count below is the split's size on the hub.

The schema validates names and templates with the helpers below; this module imports nothing but
the standard library.
"""

from __future__ import annotations

import re
import string
from typing import Any

from dflashx.config.suggest import did_you_mean

HELDOUT = "heldout"  # the run's own held-out prompts: stages.eval.prompts, else ingest.eval_prompts
UNTRAINED = "untrained"  # a drafter of the trained one's config, seeded init: shows training worked
TRAINED = "trained"  # the run's drafter (reserved: no baseline may take the name)
ZLAB_SAMPLE_SEED = 42  # dflash/benchmark.py `_select_dataset`: random.Random(42).shuffle(order)

_REASON = "{%s}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

BENCHMARKS: dict[str, dict[str, Any]] = {
    # 1,319 grade-school maths word problems
    "gsm8k": {"hf_id": "openai/gsm8k", "hf_config": "main", "split": "test", "template": _REASON % "question"},
    # 500 competition maths problems (Lightman et al.'s MATH subset)
    "math500": {"hf_id": "HuggingFaceH4/MATH-500", "split": "test", "template": _REASON % "problem"},
    # 164 Python function signatures with docstrings
    "humaneval": {"hf_id": "openai/openai_humaneval", "split": "test",
                  "template": "Write a solution to the following problem and make sure that it passes the "
                              "tests:\n```python\n{prompt}\n```"},
    # 257 hand-verified Python tasks (the `sanitized` configuration's test split)
    "mbpp": {"hf_id": "google-research-datasets/mbpp", "hf_config": "sanitized", "split": "test",
             "template": "{prompt}"},
    # 80 two-turn conversations over 8 categories; the first turn
    "mt-bench": {"hf_id": "HuggingFaceH4/mt_bench_prompts", "split": "train", "template": "{prompt[0]}"},
    # 52,002 instructions, about 40% with an input
    "alpaca": {"hf_id": "tatsu-lab/alpaca", "split": "train", "format": "alpaca"},
}
BENCHMARKS = {name: spec | {"sample_seed": ZLAB_SAMPLE_SEED} for name, spec in BENCHMARKS.items()}

BUILTIN_SUITES: tuple[str, ...] = (HELDOUT, *BENCHMARKS)
BUILTIN_BASELINES: tuple[str, ...] = (UNTRAINED,)

_TEMPLATE_FIELD = re.compile(r"^[A-Za-z_]\w*(\[\d+\])?$")


def template_fields(template: str) -> list[str]:
    """The record fields a suite's `template` reads (`{question}`, `{prompt[0]}`); ValueError for
    anything else (attribute access, unbalanced braces), so a template can only read fields."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"template {template!r}: {exc} (write a literal brace as {{{{ or }}}})") from None
    bad = [n for n in names if not _TEMPLATE_FIELD.match(n)]
    if bad or not names:
        raise ValueError(f"template {template!r} must name record fields as {{field}} or {{field[0]}}"
                         + (f"; not {bad}" if bad else ""))
    return names


def unique_names(items: list, what: str, reserved: tuple[str, ...] = ()) -> list:
    """`items` (each with a `.name`) when every name is unique and none is `reserved`."""
    names = [item.name for item in items]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{what} names must be unique; {twice} appear more than once")
    taken = sorted(set(names) & set(reserved))
    if taken:
        raise ValueError(f"{what} name {taken[0]!r} is reserved for the run's own drafter; choose another")
    return items


def known_names(names: list[str], builtins: tuple[str, ...], what: str, fix: str) -> list[str]:
    """`names` when each is one of `builtins` (else an error with a did-you-mean and `fix`)."""
    for item in names:
        if item not in builtins:
            hint = did_you_mean(item, builtins)
            raise ValueError(f"unknown built-in {what} {item!r}" + (f" ({hint})" if hint else "")
                             + f"; built-ins: {', '.join(builtins)}; or {fix}")
    return names
