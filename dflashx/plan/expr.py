"""Formulas that explain themselves: an estimate is computed from an expression tree, and its `--explain` text
is rendered from that same tree, so the text cannot drift from the arithmetic (issue 39).

    per_epoch = var("steps_per_epoch", 14095)
    steps = named("steps", ceil(var("epochs", 6.0) * per_epoch))
    steps.value      -> 84570
    steps.formula()  -> "ceil(epochs x steps_per_epoch)"
    steps.inputs()   -> {"epochs": 6.0, "steps_per_epoch": 14095}

`var` is a named operand (an input of the explanation), `const` a number written into the text (2 bytes, 0.5),
`named` a sub-expression that its parents show by name and the explanation defines once ("where compute_s =
..."). `+ - * /` combine them (plain numbers are lifted to constants); `minimum`, `maximum`, `ceil`, `total`,
`ln`, `exp` and `hypot` are the functions, and `call` applies one of the shared formulas
(`dflashx.resolve.formulas`, ...) to named operands: the value is that function's, the text its name and
arguments, so no formula is written twice. `explain.explained` turns one into a `Term`. Pure Python: the
planner's layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

_SUM, _PRODUCT, _ATOM = 1, 2, 3
_SYMBOL = {"+": "+", "-": "-", "*": "x", "/": "/"}
_APPLY: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


class Expr:
    """A number and the formula that computed it (immutable once built: nothing assigns to a node)."""

    __slots__ = ()
    value: float

    def text(self) -> str:
        """The formula as its parent shows it."""
        raise NotImplementedError

    @property
    def precedence(self) -> int:
        return _ATOM

    def operands(self) -> Iterator[Expr]:
        return iter(())

    def formula(self) -> str:
        """The formula, then each named sub-expression's own ("; where x = ...")."""
        defs = [f"{n.name} = {n.body.text()}" for n in _named(self) if n is not self]
        body = self.body.text() if isinstance(self, Named) else self.text()
        return body + ("; where " + "; ".join(defs) if defs else "")

    def inputs(self) -> dict[str, Any]:
        """Every named operand and sub-expression with its value, in the order the formula reads them."""
        out: dict[str, Any] = {}
        for node in _walk(self):
            if isinstance(node, Var | Named) and node is not self:
                out.setdefault(node.name, node.value)
        return out

    def __add__(self, other: Expr | float) -> Expr:
        return Op("+", self, lift(other))

    def __radd__(self, other: float) -> Expr:
        return Op("+", lift(other), self)

    def __sub__(self, other: Expr | float) -> Expr:
        return Op("-", self, lift(other))

    def __rsub__(self, other: float) -> Expr:
        return Op("-", lift(other), self)

    def __mul__(self, other: Expr | float) -> Expr:
        return Op("*", self, lift(other))

    def __rmul__(self, other: float) -> Expr:
        return Op("*", lift(other), self)

    def __truediv__(self, other: Expr | float) -> Expr:
        return Op("/", self, lift(other))

    def __rtruediv__(self, other: float) -> Expr:
        return Op("/", lift(other), self)


def _walk(expr: Expr) -> Iterator[Expr]:
    """Every node, parents before their operands, left to right; a named part's operands once (it may be used
    several times, its first definition is its only one)."""
    stack, named_seen = [expr], set()
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Named):
            if node.name in named_seen:
                continue
            named_seen.add(node.name)
        stack.extend(reversed(tuple(node.operands())))


def _named(expr: Expr) -> list[Named]:
    """The named sub-expressions, innermost definitions after the ones that use them, each once."""
    seen: dict[str, Named] = {}
    for node in _walk(expr):
        if isinstance(node, Named):
            seen.setdefault(node.name, node)
    return list(seen.values())


class Var(Expr):
    """A named operand: an input of the explanation. `value`: a number, or None for an unset recipe value a shared
    formula takes (max_steps)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any):
        self.name, self.value = name, value

    def text(self) -> str:
        return self.name


class Const(Expr):
    """A number written into the formula's text."""

    __slots__ = ("value",)

    def __init__(self, value: float):
        self.value = value

    def text(self) -> str:
        return f"{self.value:g}"


class Named(Expr):
    """A sub-expression shown by its name in its parents and defined once in the explanation."""

    __slots__ = ("body", "name", "value")

    def __init__(self, name: str, body: Expr):
        self.name, self.body, self.value = name, body, body.value

    def text(self) -> str:
        return self.name

    def operands(self) -> Iterator[Expr]:
        yield self.body


class Op(Expr):
    """`left op right` for op in + - * /; its value computed once, from the operands."""

    __slots__ = ("left", "op", "right", "value")

    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right
        self.value = _APPLY[op](left.value, right.value)

    @property
    def precedence(self) -> int:
        return _SUM if self.op in "+-" else _PRODUCT

    def text(self) -> str:
        left = self.left.text()
        if self.left.precedence < self.precedence:
            left = f"({left})"
        right = self.right.text()
        # a - (b + c), a / (b x c): the right side of a non-associative operator keeps its group
        if self.right.precedence < self.precedence or (self.right.precedence == self.precedence
                                                       and self.op in "-/"):
            right = f"({right})"
        return f"{left} {_SYMBOL[self.op]} {right}"

    def operands(self) -> Iterator[Expr]:
        yield self.left
        yield self.right


class Call(Expr):
    """A function of its arguments (minimum, maximum, ceil, total, a shared formula); its value computed once."""

    __slots__ = ("args", "compute", "function", "value")

    def __init__(self, function: str, args: tuple[Expr, ...], compute: Callable[..., float]):
        self.function, self.args, self.compute = function, args, compute
        self.value = compute(*(a.value for a in args))

    def text(self) -> str:
        if self.function == "total" and len(self.args) > 1:
            return " + ".join(a.text() for a in self.args)
        return f"{self.function}({', '.join(a.text() for a in self.args)})"

    @property
    def precedence(self) -> int:
        return _SUM if self.function == "total" and len(self.args) > 1 else _ATOM

    def operands(self) -> Iterator[Expr]:
        yield from self.args


def lift(x: Expr | float) -> Expr:
    return x if isinstance(x, Expr) else Const(float(x))


def var(name: str, value: Any) -> Var:
    return Var(name, value)


def const(value: float) -> Const:
    return Const(value)


def named(name: str, body: Expr) -> Named:
    return Named(name, body)


def minimum(*args: Expr | float) -> Expr:
    return Call("min", tuple(lift(a) for a in args), lambda *values: min(values))


def maximum(*args: Expr | float) -> Expr:
    return Call("max", tuple(lift(a) for a in args), lambda *values: max(values))


def ceil(arg: Expr | float) -> Expr:
    return Call("ceil", (lift(arg),), math.ceil)


def total(*args: Expr | float) -> Expr:
    """A sum of several parts, shown as `a + b + c` (one sum, not nested pairs)."""
    return Call("total", tuple(lift(a) for a in args), lambda *values: sum(values))


def ln(arg: Expr | float) -> Expr:
    return Call("ln", (lift(arg),), math.log)


def exp(arg: Expr | float) -> Expr:
    return Call("exp", (lift(arg),), math.exp)


def hypot(*args: Expr | float) -> Expr:
    """sqrt(a^2 + b^2 + ...): independent log errors combined in quadrature."""
    return Call("hypot", tuple(lift(a) for a in args), math.hypot)


def call(function: Callable[..., float], *args: Expr, name: str = "") -> Expr:
    """`function(args...)` for one of the shared formulas: its value, its name (or `name`, for a function bound to
    the recipe) in the text."""
    return Call(name or function.__name__, args, function)


def scoped(prefix: str, expr: Expr) -> Expr:
    """`expr` with every operand and part named `prefix + name` (the same values): two forwards of one formula
    (a verify and a draft step) explained side by side keep their parts apart."""
    if isinstance(expr, Var):
        return Var(prefix + expr.name, expr.value)
    if isinstance(expr, Named):
        return Named(prefix + expr.name, scoped(prefix, expr.body))
    if isinstance(expr, Op):
        return Op(expr.op, scoped(prefix, expr.left), scoped(prefix, expr.right))
    if isinstance(expr, Call):
        return Call(expr.function, tuple(scoped(prefix, a) for a in expr.args), expr.compute)
    return expr
