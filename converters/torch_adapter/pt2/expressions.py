"""Which expression strings of a `.pt2` program torch may evaluate: parsed with `ast`, never run.

torch rebuilds symbolic shapes with `sympy.sympify(expr_str)`, which is `eval` (a file can say
`__import__('os').system(...)`), and `ExportedProgram.module()` `exec`s the program's
`guards_code`. `expression_problem` accepts only what torch writes there: sympy's `srepr` form
(`Add(Mul(Integer(2), Symbol('s0', positive=True, integer=True)), Integer(1))`) or plain
arithmetic over symbols, and guards over input sizes (`L['x'].size()[0] <= 1024`). No attribute
but a tensor's size/stride/storage_offset, no call but sympy's arithmetic and relational classes,
no strings but a symbol name or a float literal, and no number that sympy would spend minutes
computing (`magnitudes`). Anything else is refused before torch sees it.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from .magnitudes import TooLarge, magnitude_problem

MAX_EXPRESSION = 4000
MAX_LITERAL_EXPONENT = 64

SYMBOL = re.compile(r"[a-z]+[0-9]+")
_FLOAT_TEXT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?inf|nan")

#: sympy classes `srepr` writes and torch's own sympy functions (torch.utils._sympy.functions).
SYMPY_CALLS = frozenset(
    {
        "Symbol",
        "Dummy",
        "Integer",
        "Rational",
        "Float",
        "Mul",
        "Add",
        "Pow",
        "Mod",
        "Max",
        "Min",
        "Abs",
        "floor",
        "ceiling",
        "sqrt",
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
        "Piecewise",
        "ExprCondPair",
        "ITE",
        "FloorDiv",
        "ModularIndexing",
        "Where",
        "PythonMod",
        "CleanDiv",
        "CeilToInt",
        "FloorToInt",
        "CeilDiv",
        "LShift",
        "RShift",
        "PowByNatural",
        "FloatPow",
        "FloatTrueDiv",
        "IntTrueDiv",
        "IsNonOverlappingAndDenseIndicator",
        "TruncToFloat",
        "TruncToInt",
        "RoundToInt",
        "RoundDecimal",
        "ToFloat",
        "Identity",
    }
)
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})
#: What srepr writes for exact numbers: Integer(5), Rational(1, 2), from integer literals only (a Rational of a Float is
#: exact, its denominator a power of two as long as the float's exponent).
_NUMBERS = frozenset({"Integer", "Rational"})
#: Assumption keywords of Symbol(...) and Float's precision.
SYMPY_KEYWORDS = frozenset(
    {
        "positive",
        "negative",
        "nonnegative",
        "nonpositive",
        "integer",
        "real",
        "finite",
        "infinite",
        "zero",
        "nonzero",
        "even",
        "odd",
        "commutative",
        "extended_real",
        "extended_positive",
        "extended_negative",
        "extended_nonnegative",
        "extended_nonpositive",
        "precision",
        "evaluate",
    }
)
SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "True", "False", "pi", "E"})
GUARD_ROOT = "L"
TENSOR_METHODS = frozenset({"size", "stride", "storage_offset"})

_OPERATORS = (
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.BitAnd,
    ast.BitOr,
    ast.BitXor,
    ast.USub,
    ast.UAdd,
    ast.Not,
    ast.Invert,
    ast.And,
    ast.Or,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
)


RUNS_CODE = "loading it could run code"
TAKES_MINUTES = "torch would spend minutes of CPU computing it"


class Problem(NamedTuple):
    """Why an expression is refused (`text`: what it holds) and what evaluating it would do (`consequence`)."""

    text: str
    consequence: str = RUNS_CODE


class _Refused(Exception):
    pass


def expression_problem(text: object, *, guard: bool) -> Problem | None:
    """Why torch must not evaluate `text` (a sympy expression, or a guard when `guard`), or None when it may."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION or "\n" in text or "\r" in text:
        return Problem(f"is not a one-line string of at most {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(text, mode="eval")
        _check(tree.body, guard)
        magnitude_problem(tree.body)
    except _Refused as refused:
        return Problem(str(refused))
    except TooLarge as too_large:
        return Problem(str(too_large), TAKES_MINUTES)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return Problem(f"is not a Python expression ({type(error).__name__})")
    return None


def _check(node: ast.AST, guard: bool) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str) or not isinstance(node.value, (int, float, bool)):
            raise _Refused(f"holds the literal {node.value!r:.40} where a number belongs")
    elif isinstance(node, ast.Name):
        if not (SYMBOL.fullmatch(node.id) or node.id in SYMPY_CONSTANTS or (guard and node.id == GUARD_ROOT)):
            raise _Refused(f"uses the name '{node.id}'")
    elif isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
        operators = [getattr(node, "op", None)] + list(getattr(node, "ops", []))
        if not all(isinstance(op, _OPERATORS) for op in operators if op is not None):
            raise _Refused(f"uses the operator {type(operators[0]).__name__}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            _check_exponent(node.right)
        for child in [
            getattr(node, "left", None),
            getattr(node, "right", None),
            getattr(node, "operand", None),
            *getattr(node, "values", []),
            *getattr(node, "comparators", []),
        ]:
            if child is not None:
                _check(child, guard)
    elif isinstance(node, ast.Tuple):
        for child in node.elts:
            _check(child, guard)
    elif isinstance(node, ast.Call):
        _check_call(node, guard)
    elif guard and isinstance(node, ast.Subscript):
        _check_subscript(node)
    else:
        raise _Refused(f"holds a {type(node).__name__} expression")


def _check_call(node: ast.Call, guard: bool) -> None:
    function = node.func
    if guard and isinstance(function, ast.Attribute):  # L['x'].size(), .stride(), .storage_offset()
        if function.attr not in TENSOR_METHODS or node.args or node.keywords:
            raise _Refused(f"calls '.{function.attr}(...)'")
        _check(function.value, guard)
        return
    if not isinstance(function, ast.Name) or function.id not in SYMPY_CALLS:
        raise _Refused(f"calls {ast.unparse(function)[:40]!r}")
    for keyword in node.keywords:
        if (
            keyword.arg not in SYMPY_KEYWORDS
            or not isinstance(keyword.value, ast.Constant)
            or not isinstance(keyword.value.value, (bool, int))
        ):
            raise _Refused(f"passes the keyword {keyword.arg!r}")
    if function.id in ("Symbol", "Dummy"):
        if len(node.args) != 1 or not _is_string(node.args[0], SYMBOL):
            raise _Refused("names a symbol that is not a letters-then-digits name")
        return
    if function.id in _NUMBERS and not all(_is_integer(argument) for argument in node.args):
        raise TooLarge(f"builds {function.id} from something other than integer literals (an exact number of any size)")
    if function.id == "Float" and node.args and _is_string(node.args[0], _FLOAT_TEXT):
        for child in node.args[1:]:
            _check(child, guard)
        return
    if function.id in _POWERS and len(node.args) == 2:
        _check_exponent(node.args[1])
    for child in node.args:
        _check(child, guard)


def _check_subscript(node: ast.Subscript) -> None:
    """L['name'] or <sizes>[index]: the only subscripts a guard holds."""
    index = node.slice
    if _is_string(index, re.compile(r"[A-Za-z_][A-Za-z0-9_]*")):
        if not (isinstance(node.value, ast.Name) and node.value.id == GUARD_ROOT):
            raise _Refused("indexes something other than the inputs L with a name")
        return
    if not (isinstance(index, ast.Constant) and type(index.value) is int):
        raise _Refused("indexes with something other than a number or an input name")
    _check(node.value, guard=True)


def _check_exponent(node: ast.AST) -> None:
    """A power stays small: a literal exponent of at most MAX_LITERAL_EXPONENT, or one that depends on a symbol."""
    if _mentions_symbol(node):
        return
    value = _literal(node)
    if value is None or abs(value) > MAX_LITERAL_EXPONENT:
        raise TooLarge(f"raises to a power that is neither a number of at most {MAX_LITERAL_EXPONENT} nor symbolic")


def _literal(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal(node.operand)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Integer", "Float", "Rational")
        and node.args
        and all(_literal(a) is not None or _is_string(a, _FLOAT_TEXT) for a in node.args)
    ):
        first = node.args[0]
        return _literal(first) if _literal(first) is not None else float(first.value)  # type: ignore[attr-defined]
    return None


def _mentions_symbol(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and SYMBOL.fullmatch(n.id))
        or (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("Symbol", "Dummy"))
        for n in ast.walk(node)
    )


def _is_integer(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_integer(node.operand)
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_string(node: ast.AST, pattern: re.Pattern) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(pattern.fullmatch(node.value))
