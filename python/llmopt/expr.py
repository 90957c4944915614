"""Expressions of the graph file (docs/formats/graph.md, "Expressions").

Grammar:
    expr   := term (('+'|'-') term)*
    term   := factor (('*'|'/') factor)*
    factor := unary ('^' factor)?
    unary  := '-' unary | number | symbol | '(' expr ')'

Evaluation is exact (fractions) for + - * / and integer powers; a fractional
exponent gives a float. Pure Python: used by capture (to symbolize probe values)
and by the reference interpreter (to evaluate shapes and attributes).
"""

from fractions import Fraction
import math
import re

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|([A-Za-z_][A-Za-z_0-9]*)|(.))")


class ExprError(ValueError):
    pass


def _tokenize(text):
    out = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprError("bad expression %r at %d" % (text, pos))
        num, sym, op = m.groups()
        if num is not None:
            out.append(("num", num))
        elif sym is not None:
            out.append(("sym", sym))
        elif op is not None and not op.isspace():
            if op not in "+-*/^()":
                raise ExprError("bad character %r in expression %r" % (op, text))
            out.append(("op", op))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self):
        t = self.peek()
        self.i += 1
        return t

    def parse(self):
        if not self.toks:
            raise ExprError("empty expression")
        node = self.expr()
        if self.i != len(self.toks):
            raise ExprError("trailing input in expression %r" % self.text)
        return node

    def expr(self):
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            node = (op, node, self.term())
        return node

    def term(self):
        node = self.factor()
        while self.peek() in (("op", "*"), ("op", "/")):
            op = self.take()[1]
            node = (op, node, self.factor())
        return node

    def factor(self):
        node = self.unary()
        if self.peek() == ("op", "^"):
            self.take()
            node = ("^", node, self.factor())
        return node

    def unary(self):
        kind, val = self.take()
        if kind == "op" and val == "-":
            return ("neg", self.unary())
        if kind == "num":
            return ("num", val)
        if kind == "sym":
            return ("sym", val)
        if kind == "op" and val == "(":
            node = self.expr()
            if self.take() != ("op", ")"):
                raise ExprError("missing ')' in expression %r" % self.text)
            return node
        raise ExprError("unexpected %r in expression %r" % (val, self.text))


_cache = {}


def parse(text):
    node = _cache.get(text)
    if node is None:
        node = _Parser(text).parse()
        _cache[text] = node
    return node


def symbols(text):
    """Names used by an expression."""
    out = set()

    def walk(n):
        if n[0] == "sym":
            out.add(n[1])
        elif n[0] == "neg":
            walk(n[1])
        elif n[0] != "num":
            walk(n[1])
            walk(n[2])

    walk(parse(text))
    return out


def _num(text):
    if re.fullmatch(r"\d+", text):
        return Fraction(int(text))
    return Fraction(text)  # exact decimal value


def _eval(n, env):
    kind = n[0]
    if kind == "num":
        return _num(n[1])
    if kind == "sym":
        if n[1] not in env:
            raise ExprError("unknown symbol %r" % n[1])
        v = env[n[1]]
        if isinstance(v, float):
            return Fraction(v)
        return Fraction(v) if isinstance(v, int) else v
    if kind == "neg":
        return -_eval(n[1], env)
    a = _eval(n[1], env)
    b = _eval(n[2], env)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    if kind == "/":
        if b == 0:
            raise ExprError("division by zero")
        if isinstance(a, float) or isinstance(b, float):
            return float(a) / float(b)
        return a / b
    if kind == "^":
        if isinstance(b, Fraction) and b.denominator == 1 and not isinstance(a, float):
            e = int(b)
            if e >= 0 or a != 0:
                return Fraction(a) ** e
        return math.pow(float(a), float(b))
    raise ExprError("bad node %r" % (kind,))


def evaluate(value, env):
    """Value of an expression (str) or a plain number, as Fraction or float."""
    if isinstance(value, bool):
        raise ExprError("boolean is not an expression")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return value
    if not isinstance(value, str):
        raise ExprError("expression must be a string or a number, got %r" % (value,))
    return _eval(parse(value), env)


def eval_int(value, env):
    """An expression that must be an exact integer (shapes, axes, slice bounds)."""
    v = evaluate(value, env)
    if isinstance(v, float):
        if v != int(v):
            raise ExprError("expression %r = %r is not an integer" % (value, v))
        return int(v)
    if v.denominator != 1:
        raise ExprError("expression %r = %s is not an integer (inexact division)" % (value, v))
    return int(v)


def eval_float(value, env):
    return float(evaluate(value, env))


class Symbolizer:
    """Maps probe values back to expressions.

    `dims`: candidate integer expressions over the hparams (e.g. "n_heads*head_dim");
    `floats`: candidate float expressions (e.g. "rms_eps", "head_dim^-0.5").
    Building fails if two candidates of one kind have the same probe value (the probe
    would then be ambiguous); lookups fail for values no candidate explains.
    """

    def __init__(self, probe, dims, floats=(), small_literals=(0, 1, 2)):
        self.probe = dict(probe)
        self.small = set(small_literals)
        self.by_int = {}
        for e in dims:
            v = eval_int(e, self.probe)
            if v in self.small:
                raise ExprError("probe value of %r is %d, which is also a plain literal; choose other probe values" % (e, v))
            if v in self.by_int and self.by_int[v] != e:
                raise ExprError("probe is ambiguous: %r and %r are both %d" % (self.by_int[v], e, v))
            self.by_int[v] = e
        self.floats = []
        for e in floats:
            v = eval_float(e, self.probe)
            for e2, v2 in self.floats:
                if _close(v, v2, 1e-6):
                    raise ExprError("probe is ambiguous: %r and %r are both %r" % (e2, e, v))
            self.floats.append((e, v))

    def dim(self, v, what="dimension"):
        """Expression string for a concrete integer seen in the graph."""
        v = int(v)
        if v in self.by_int:
            return self.by_int[v]
        if v in self.small:
            return str(v)
        raise ExprError(
            "concrete %s %d is not explained by the probe hyper-parameters %s; "
            "it would not follow other model sizes" % (what, v, self.probe))

    def int_or_literal(self, v):
        """Like dim(), but values no candidate explains stay literal numbers."""
        v = int(v)
        if v in self.by_int:
            return self.by_int[v]
        return v

    def float_value(self, v):
        """Expression string for a float constant, or the plain number."""
        v = float(v)
        for e, pv in self.floats:
            if _close(v, pv, 1e-6):
                return e
        if v == int(v) and abs(v) < 2 ** 53:
            return int(v)
        return v


def _close(a, b, rel):
    if a == b:
        return True
    return abs(a - b) <= rel * max(abs(a), abs(b))
