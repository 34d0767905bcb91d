"""The explained formulas (issue 39): a number and its --explain text come from one expression tree."""

from __future__ import annotations

import math

from dflashx.plan.explain import explained
from dflashx.plan.expr import call, ceil, const, maximum, minimum, named, total, var
from dflashx.resolve.formulas import optimizer_steps


def test_the_text_is_the_arithmetic_with_its_groups():
    a, b, c = var("a", 6.0), var("b", 2.0), var("c", 4.0)
    cases = [(a - (b + c), "a - (b + c)", 0.0), (a - b + c, "a - b + c", 8.0), (a / (b * c), "a / (b x c)", 0.75),
             (a / b * c, "a / b x c", 12.0), ((a + b) * c, "(a + b) x c", 32.0), (2 * a + 1, "2 x a + 1", 13.0),
             (1 / a, "1 / a", 1 / 6), (total(a, b, c) / 3, "(a + b + c) / 3", 4.0)]
    for expr, text, value in cases:
        assert (expr.formula(), expr.value) == (text, value)
        # the rendered text evaluates to the value (the operands substituted)
        assert eval(text.replace("x", "*"), {}, {"a": 6.0, "b": 2.0, "c": 4.0}) == value


def test_functions_and_shared_formulas():
    assert minimum(var("n", 5.0), 3).formula() == "min(n, 3)" and minimum(var("n", 5.0), 3).value == 3
    assert maximum(var("n", 5.0), const(7)).value == 7 and ceil(var("x", 2.1)).value == 3
    assert minimum(var("only", 4)).value == 4 and minimum(var("only", 4)).formula() == "min(only)"
    steps = call(optimizer_steps, var("per_epoch", 10), var("epochs", 1.5), var("max_steps", None))
    assert steps.formula() == "optimizer_steps(per_epoch, epochs, max_steps)"
    assert steps.value == optimizer_steps(10, 1.5, None) == 15
    assert steps.inputs() == {"per_epoch": 10, "epochs": 1.5, "max_steps": None}


def test_named_parts_are_defined_once_and_are_inputs():
    sequences = named("sequences", var("steps", 10.0) * var("batch", 4.0))
    flops = var("flops", 3.0) * sequences
    seconds = named("seconds", flops / var("peak", 2.0) + sequences / var("rate", 8.0))
    assert seconds.formula() == ("flops x sequences / peak + sequences / rate; where sequences = steps x batch")
    assert seconds.value == 3.0 * 40 / 2 + 40 / 8
    assert seconds.inputs() == {"flops": 3.0, "sequences": 40.0, "steps": 10.0, "batch": 4.0, "peak": 2.0,
                                "rate": 8.0}


def test_a_term_reads_value_formula_and_inputs_off_the_expression():
    t = explained("x.seconds", var("n", 3.0) * var("per", 0.5), "s", "a source", note="why")
    assert (t.key, t.value, t.unit, t.formula, t.source) == ("x.seconds", 1.5, "s", "n x per", "a source")
    assert t.inputs == {"n": 3.0, "per": 0.5, "note": "why"}
    assert math.isclose(t.value, t.inputs["n"] * t.inputs["per"])
