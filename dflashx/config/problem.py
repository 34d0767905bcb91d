"""A problem and its fix: the one shape of "what is wrong, about which key, and what to do" in dflashx.

`Problem` is what every such type exposes, under the same four names:
  code     a stable name for the kind of problem (`budget_usd`, `recipe`, `disk`, `export_contract`)
  key      the dotted recipe (or engine config) key it is about; "" when it is about none
  message  what is wrong, in plain words
  fix      what to change; "" when there is nothing to say
Each type adds what its place needs: `config.errors.RecipeProblem` (file, line, expectation),
`plan.findings.Finding` (severity), `resolve.resolve.ResolveError` (an exception),
`run.check.Check` (status ok|warn|fail), `export.contract.Violation`. `describe` is the one-line
form an exception or a report carries.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Problem(Protocol):
    """What is wrong (`message`), about which key (`key`), what to do (`fix`), of what kind (`code`)."""

    @property
    def code(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def fix(self) -> str: ...


def describe(problem: Problem) -> str:
    """`key: message; fix: fix` (without the parts that are empty)."""
    head = ": ".join(p for p in (problem.key, problem.message) if p)
    return f"{head}; fix: {problem.fix}" if problem.fix else head
