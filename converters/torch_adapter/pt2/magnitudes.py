"""How large the numbers of a `.pt2` shape expression can get, bounded from its syntax before sympy sees it.

sympy computes with exact integers and rationals, holding the GIL: `Pow(Pow(Pow(Pow(Integer(10), 64), 64), 64), 64)`
(every exponent small) is a number of 55 million bits that `sympify` spent 14 s on, a server's every request waiting;
one level deeper, hours. A symbol does not stop it, since sympy distributes a power over a product's coefficient
(`(10*s0)**64` is `10**64 * s0**64`), nor does spelling it `**`, `PowByNatural`, `LShift`, a chain of products or one
long literal. `magnitude_problem` bounds, for every sub-expression of a parsed (never evaluated) expression, the bits of
the numerators and denominators sympy could make of it, each symbol counted at SYMBOL_BITS (program_checks.py holds
every integer of the program, hints and ranges included, to 2**64), without computing any of them. torch writes a
constant as one number (sympy folds constant arithmetic), so a sub-expression of literals alone may reach
MAX_LITERAL_BITS, what an int64 or uint64 shape needs; one with symbols may reach MAX_SYMBOLIC_BITS (`s0**64` is 4,096).
Max and Min compare every pair of their arguments through sympy's assumptions (200 arguments took 39 s), so they take at
most MAX_MINMAX_ARGUMENTS, nested calls of the same kind counted together (sympy flattens them).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

#: A constant part of a shape expression holds at most this many bits: an int64 or uint64 size, stride or bound.
MAX_LITERAL_BITS = 64
#: What a hint or range bound of a symbol may hold (program_checks.py refuses a larger integer anywhere in the program).
SYMBOL_BITS = 64
#: A sub-expression with symbols may reach this many bits with every symbol at 2**SYMBOL_BITS (s0**64 is 4,096).
MAX_SYMBOLIC_BITS = 16384
MAX_MINMAX_ARGUMENTS = 8
_LOG2_10 = math.log2(10)

_SUMS = frozenset(
    {"Add", "Max", "Min", "Piecewise", "ExprCondPair", "ITE", "Where"}
)  # a value is one of (or adds) its arguments
_QUOTIENTS = frozenset({"FloorDiv", "CleanDiv", "CeilDiv", "IntTrueDiv", "FloatTrueDiv"})
_REMAINDERS = frozenset({"Mod", "PythonMod", "ModularIndexing"})
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_SAME_SIZE = frozenset(
    {
        "Integer",
        "Abs",
        "floor",
        "ceiling",
        "sqrt",
        "CeilToInt",
        "FloorToInt",
        "TruncToFloat",
        "TruncToInt",
        "RoundToInt",
        "RoundDecimal",
        "ToFloat",
        "Identity",
        "RShift",
    }
)
_TRUTHS = frozenset(
    {
        "StrictLessThan",
        "LessThan",
        "StrictGreaterThan",
        "GreaterThan",
        "Equality",
        "Unequality",
        "Eq",
        "Ne",
        "Lt",
        "Le",
        "Gt",
        "Ge",
        "And",
        "Or",
        "Not",
        "Xor",
        "IsNonOverlappingAndDenseIndicator",
    }
)
_SYMBOLS = frozenset({"Symbol", "Dummy"})
#: sympy's named constants (every other name is a symbol, or a guard's inputs):
#: infinities and truth values hold no number.
_CONSTANT_BITS = {"oo": 0, "zoo": 0, "nan": 0, "true": 0, "false": 0, "True": 0, "False": 0, "pi": 2, "E": 2}
#: Float's precision in bits (`precision=`) or decimal digits (its second argument); torch writes 53 bits.
MAX_FLOAT_PRECISION = 1024
#: A Float's decimal text may hold an exponent of at most this size either way (sympy spent 14 s on '1e-1000000').
MAX_FLOAT_EXPONENT = 1024


class TooLarge(Exception):
    """An expression whose numbers could grow past the limits; the message says which and how far."""


@dataclass(frozen=True)
class _Size:
    """Upper bounds on the bits of the numerator and denominator of any number the sub-expression makes, and whether it
    mentions a symbol."""

    numerator: float
    denominator: float = 0.0
    symbolic: bool = False

    @property
    def bits(self) -> float:
        return max(self.numerator, self.denominator)


_SYMBOL = _Size(SYMBOL_BITS, 0.0, True)
_TRUTH = _Size(1.0)


def magnitude_problem(tree: ast.AST) -> None:
    """Raise TooLarge when a sub-expression of `tree` (an expression `expressions` accepted) could make a number past
    the limits."""
    _size(tree)


def _size(node: ast.AST) -> _Size:
    size = _measure(node)
    limit = MAX_SYMBOLIC_BITS if size.symbolic else MAX_LITERAL_BITS
    if size.bits > limit:
        shown = ast.unparse(node)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        kind = "with every symbol at 2**64" if size.symbolic else "from literals alone"
        raise TooLarge(
            f"holds {shown!r}, which makes a number of up to {_bits_text(size.bits)} bits {kind}, more than the "
            f"{limit} a shape can need"
        )
    return size


def _bits_text(bits: float) -> str:
    return "infinitely many" if math.isinf(bits) else f"{bits:,.0f}"


def _measure(node: ast.AST) -> _Size:
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.Name):
        return _Size(_CONSTANT_BITS[node.id]) if node.id in _CONSTANT_BITS else _SYMBOL
    if isinstance(node, ast.UnaryOp):
        operand = _size(node.operand)
        return (
            _Size(operand.numerator + 1, operand.denominator, operand.symbolic)
            if isinstance(node.op, ast.Invert)
            else operand
        )
    if isinstance(node, ast.BinOp):
        return _binary(node)
    if isinstance(node, (ast.BoolOp, ast.Compare)):
        for child in [*getattr(node, "values", []), getattr(node, "left", None), *getattr(node, "comparators", [])]:
            if child is not None:
                _size(child)
        return _TRUTH
    if isinstance(node, ast.Tuple):
        return _combined([_size(child) for child in node.elts], added=False)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _call(node)
    return _SYMBOL  # a guard's L['x'].size()[0]: an input's size, as a symbol


def _number(value: object) -> _Size:
    if isinstance(value, bool) or value is None:
        return _Size(0.0)
    if isinstance(value, int):
        return _Size(float(abs(value).bit_length()))
    if isinstance(
        value, float
    ):  # sympy computes with a float at its precision: only its size can grow, when made an integer
        return _Size(float(max(math.frexp(value)[1], 0)) if math.isfinite(value) else 0.0)
    return _Size(0.0)  # a symbol's name or a Float's text: measured by their call


def _binary(node: ast.BinOp) -> _Size:
    left, right = _size(node.left), _size(node.right)
    if isinstance(node.op, ast.Pow):
        return _power(left, node.right, right)
    if isinstance(node.op, ast.Mult):
        return _product([left, right])
    if isinstance(node.op, ast.Div):
        return _quotient(left, right)
    if isinstance(node.op, ast.FloorDiv):
        return _Size(left.numerator + right.denominator, 0.0, left.symbolic or right.symbolic)
    if isinstance(node.op, ast.Mod):
        return _remainder([left, right])
    return _combined([left, right], added=True)  # +, -, &, |, ^


def _call(node: ast.Call) -> _Size:
    name = node.func.id  # type: ignore[attr-defined]
    for keyword in node.keywords:
        if keyword.arg == "precision" and _above(keyword.value, MAX_FLOAT_PRECISION):
            raise TooLarge(
                f"asks for a precision of {ast.unparse(keyword.value)[:20]} bits, more than the {MAX_FLOAT_PRECISION} "
                "normbridge lets sympy compute with"
            )
    if name in _SYMBOLS:
        return _SYMBOL
    if name == "Float":
        return _float(node)
    if name in ("Max", "Min"):
        count = _flattened_arguments(node, name)
        if count > MAX_MINMAX_ARGUMENTS:
            raise TooLarge(
                f"calls {name} with {count} arguments, more than the {MAX_MINMAX_ARGUMENTS} normbridge lets sympy "
                "compare pairwise"
            )
    arguments = [_size(child) for child in node.args]
    if not arguments:
        return _Size(0.0)
    if name == "Rational":
        numerator, denominator = arguments[0], arguments[1] if len(arguments) > 1 else _Size(0.0)
        return _Size(
            numerator.numerator + denominator.denominator,
            numerator.denominator + denominator.numerator,
            numerator.symbolic or denominator.symbolic,
        )
    if name in _POWERS and len(arguments) == 2:
        return _power(arguments[0], node.args[1], arguments[1])
    if name == "LShift" and len(arguments) == 2:  # base * 2**shift
        return _power_of_two(arguments[0], arguments[1])
    if name == "Mul":
        return _product(arguments)
    if name in _QUOTIENTS and len(arguments) == 2:
        return _quotient(arguments[0], arguments[1])
    if name in _REMAINDERS:
        return _remainder(arguments)
    if name in _TRUTHS:
        return _Size(1.0, 0.0, any(a.symbolic for a in arguments))
    if name in _SAME_SIZE:
        return arguments[0]
    if name in _SUMS:
        return _combined(arguments, added=name == "Add")
    return _product(arguments)  # a function not named above: as large as the product of its arguments


def _flattened_arguments(node: ast.Call, name: str) -> int:
    """How many arguments sympy's Max or Min compares: nested calls of the same kind are merged into one."""
    count = 0
    for child in node.args:
        nested = isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == name
        count += _flattened_arguments(child, name) if nested else 1
    return count


def _float(node: ast.Call) -> _Size:
    """A Float of a decimal text (its exponent read from the text, never computed: sympy spent 14 s parsing
    '1e-1000000') or of a number, at a precision sympy can afford."""
    for child in node.args[1:]:
        if _above(child, MAX_FLOAT_PRECISION):
            raise TooLarge(
                f"asks for {ast.unparse(child)[:20]} digits of precision, more than the {MAX_FLOAT_PRECISION} "
                "normbridge lets sympy compute with"
            )
        _size(child)
    first = node.args[0] if node.args else None
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return _size(first) if first is not None else _Size(0.0)
    try:
        number = Decimal(first.value)
    except (InvalidOperation, ValueError):
        return _Size(0.0)  # sympy refuses it
    if not number.is_finite() or number.is_zero():
        return _Size(0.0)
    exponent = number.adjusted()  # the power of ten of its first digit
    if abs(exponent) > MAX_FLOAT_EXPONENT:
        raise TooLarge(
            f"holds the number {first.value[:30]!r}, whose exponent is beyond the {MAX_FLOAT_EXPONENT} (either way) "
            "normbridge lets sympy parse"
        )
    return _Size(max(exponent + 1, 0) * _LOG2_10)


def _above(node: ast.AST, limit: int) -> bool:
    """Whether a literal integer argument (precision, digits) is larger than `limit`;
    other arguments are measured as usual."""
    value = node.value if isinstance(node, ast.Constant) else None
    return type(value) is int and abs(value) > limit


def _power(base: _Size, exponent_node: ast.AST, exponent: _Size) -> _Size:
    """base**exponent: a literal exponent multiplies the base's bits (a negative one swaps numerator and denominator);
    sympy never evaluates a symbolic one, which stands for an unknown value like a symbol."""
    if exponent.symbolic:
        return _Size(SYMBOL_BITS, 0.0, True)
    value = _signed_value(exponent_node)
    if value is None:  # a literal expression: as large as its bits allow, either sign
        bits = base.bits * 2.0**exponent.bits
        return _Size(bits, bits, base.symbolic)
    times = max(abs(value), 1.0)
    if value < 0:
        return _Size(base.denominator * times, base.numerator * times, base.symbolic)
    return _Size(base.numerator * times, base.denominator * times, base.symbolic)


def _signed_value(node: ast.AST) -> float | None:
    """An exponent written as one number (2, -3, Integer(64), 0.5; Rational(p, q) counts as p, with the sign of p/q:
    sympy computes base**p to take its q-th root), or None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value) if math.isfinite(node.value) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _signed_value(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Integer", "Rational")
        and len(node.args) in (1, 2)
        and not node.keywords
    ):
        values = [_signed_value(argument) for argument in node.args]
        if None in values or (len(values) == 2 and values[1] == 0):
            return None
        return math.copysign(values[0], values[1]) if len(values) == 2 else values[0]
    return None


def _power_of_two(base: _Size, shift: _Size) -> _Size:
    if shift.symbolic:
        return _Size(SYMBOL_BITS, 0.0, True)
    return _Size(base.numerator + 2.0**shift.bits, base.denominator, base.symbolic)


def _product(factors: list[_Size]) -> _Size:
    return _Size(
        sum(f.numerator for f in factors), sum(f.denominator for f in factors), any(f.symbolic for f in factors)
    )


def _quotient(dividend: _Size, divisor: _Size) -> _Size:
    return _Size(
        dividend.numerator + divisor.denominator,
        dividend.denominator + divisor.numerator,
        dividend.symbolic or divisor.symbolic,
    )


def _remainder(arguments: list[_Size]) -> _Size:
    """A remainder is smaller than its divisor, but over rationals its numbers share every denominator."""
    denominators = sum(a.denominator for a in arguments)
    return _Size(max(a.numerator for a in arguments) + denominators, denominators, any(a.symbolic for a in arguments))


def _combined(terms: list[_Size], *, added: bool) -> _Size:
    """A sum (`added`: the bits of the largest term over a common denominator, plus one per doubling of the terms) or a
    choice among the terms (Max, Min, Piecewise: the largest)."""
    if not terms:
        return _Size(0.0)
    denominators = sum(t.denominator for t in terms) if added else max(t.denominator for t in terms)
    largest = max(t.numerator + (denominators - t.denominator if added else 0.0) for t in terms)
    carry = math.ceil(math.log2(len(terms))) if added and len(terms) > 1 else 0
    return _Size(largest + carry, denominators, any(t.symbolic for t in terms))


__all__ = [
    "MAX_LITERAL_BITS",
    "MAX_MINMAX_ARGUMENTS",
    "MAX_SYMBOLIC_BITS",
    "SYMBOL_BITS",
    "TooLarge",
    "magnitude_problem",
]
