"""Reference interpreter of graph files (docs/formats/graph.md), in pure Python.

It unrolls `repeat`, evaluates expressions, binds parameters from a GGUF file or a
Hugging Face checkpoint directory (config.json + safetensors) through a parameter map
(map.json: its "gguf" or "safetensors" section, transforms and match clause included) or
from a plain name -> tensor dict,
checks every node's declared shape and dtype, and runs the token-batch forward with a
KV cache owned by the interpreter (the runtime's attention semantics). Slow but
dependency-free: an oracle for small models only.

    python3 -m llmopt.ref_interp --graph programs/llama/graph.json \
        --map programs/llama/map.json --gguf tests/golden/llama_tiny/model.gguf \
        --golden tests/golden/llama_tiny/golden.json
    python3 -m llmopt.ref_interp ... --hf tests/golden/llama_tiny/hf --golden ...
"""

import argparse
import json
import math
import operator
import os
import sys

from . import expr as E
from .gguf_writer import GGUFFile
from .safetensors_io import HFCheckpoint


class InterpError(RuntimeError):
    pass


# --------------------------------------------------------------------------- tensors

def _strides(shape):
    st = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        st[d] = st[d + 1] * shape[d + 1]
    return st


def _gather_offsets(dims):
    """dims: per output dim, the list of input offsets; returns flat input indices."""
    idx = [0]
    for offs in dims:
        idx = [b + o for b in idx for o in offs]
    return idx


class Tensor:
    __slots__ = ("shape", "data", "dtype")

    def __init__(self, shape, data, dtype="f32"):
        self.shape = tuple(int(d) for d in shape)
        self.data = data
        self.dtype = dtype
        if len(data) != math.prod(self.shape):
            raise InterpError("tensor data has %d elements for shape %r" % (len(data), self.shape))

    def __repr__(self):
        return "Tensor(%s, %r)" % (self.dtype, self.shape)

    def take(self, idx, shape):
        d = self.data
        return Tensor(shape, [d[i] for i in idx], self.dtype)


def _norm_axis(a, nd):
    a = int(a)
    if a < 0:
        a += nd
    if not 0 <= a < nd:
        raise InterpError("axis %d out of range for rank %d" % (a, nd))
    return a


def broadcast_shape(a, b):
    nd = max(len(a), len(b))
    a = (1,) * (nd - len(a)) + tuple(a)
    b = (1,) * (nd - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise InterpError("shapes %r and %r do not broadcast" % (a, b))
    return tuple(out)


def expand_to(t, shape):
    shape = tuple(shape)
    if t.shape == shape:
        return t
    nd = len(shape)
    if len(t.shape) > nd:
        raise InterpError("cannot expand %r to %r" % (t.shape, shape))
    ishape = (1,) * (nd - len(t.shape)) + t.shape
    st = _strides(ishape)
    dims = []
    for d in range(nd):
        if ishape[d] == shape[d]:
            dims.append([i * st[d] for i in range(shape[d])])
        elif ishape[d] == 1:
            dims.append([0] * shape[d])
        else:
            raise InterpError("cannot expand %r to %r" % (t.shape, shape))
    return t.take(_gather_offsets(dims), shape)


def permute(t, perm):
    nd = len(t.shape)
    perm = [_norm_axis(p, nd) for p in perm]
    if sorted(perm) != list(range(nd)):
        raise InterpError("bad permutation %r" % (perm,))
    st = _strides(t.shape)
    shape = tuple(t.shape[p] for p in perm)
    dims = [[i * st[p] for i in range(t.shape[p])] for p in perm]
    return t.take(_gather_offsets(dims), shape)


def slice_(t, dim, start, end, step):
    nd = len(t.shape)
    dim = _norm_axis(dim, nd)
    size = t.shape[dim]
    if step <= 0:
        raise InterpError("slice step must be positive")
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = max(0, min(start, size))
    end = max(start, min(end, size))
    rng = list(range(start, end, step))
    st = _strides(t.shape)
    dims = [[i * st[d] for i in (rng if d == dim else range(t.shape[d]))] for d in range(nd)]
    shape = list(t.shape)
    shape[dim] = len(rng)
    return t.take(_gather_offsets(dims), tuple(shape))


def concat(ts, dim):
    nd = len(ts[0].shape)
    dim = _norm_axis(dim, nd)
    outer = math.prod(ts[0].shape[:dim])
    for t in ts:
        if len(t.shape) != nd or t.shape[:dim] != ts[0].shape[:dim] or t.shape[dim + 1:] != ts[0].shape[dim + 1:]:
            raise InterpError("concat of %r" % ([t.shape for t in ts],))
    chunks = [math.prod(t.shape[dim:]) for t in ts]
    data = []
    for o in range(outer):
        for t, c in zip(ts, chunks):
            data.extend(t.data[o * c:(o + 1) * c])
    shape = list(ts[0].shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    return Tensor(shape, data, ts[0].dtype)


def binary(fn, a, b):
    shape = broadcast_shape(a.shape, b.shape)
    dtype = a.dtype if a.dtype == b.dtype else "f32"
    if a.shape == b.shape:
        return Tensor(shape, list(map(fn, a.data, b.data)), dtype)
    if len(b.data) == 1 and a.shape == shape:
        y = b.data[0]
        return Tensor(shape, [fn(x, y) for x in a.data], dtype)
    if len(a.data) == 1 and b.shape == shape:
        x = a.data[0]
        return Tensor(shape, [fn(x, y) for y in b.data], dtype)
    a = expand_to(a, shape)
    b = expand_to(b, shape)
    return Tensor(shape, list(map(fn, a.data, b.data)), dtype)


def _rows(t):
    k = t.shape[-1]
    d = t.data
    return [d[i:i + k] for i in range(0, len(d), k)]


def _dot(a, b):
    return sum(map(operator.mul, a, b))


def linear(x, w, bias=None):
    if len(w.shape) != 2 or x.shape[-1] != w.shape[1]:
        raise InterpError("linear: x %r, w %r" % (x.shape, w.shape))
    wr = _rows(w)
    out = []
    for r in _rows(x):
        out.extend(_dot(r, c) for c in wr)
    y = Tensor(x.shape[:-1] + (w.shape[0],), out)
    if bias is not None:
        y = binary(operator.add, y, bias)
    return y


def matmul(a, b):
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise InterpError("matmul: %r @ %r" % (a.shape, b.shape))
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    P, K = a.shape[-2:]
    Q = b.shape[-1]
    a = expand_to(a, batch + (P, K))
    b = expand_to(b, batch + (K, Q))
    nb = math.prod(batch)
    out = []
    for i in range(nb):
        ar = [a.data[i * P * K + p * K: i * P * K + (p + 1) * K] for p in range(P)]
        bb = b.data[i * K * Q:(i + 1) * K * Q]
        bc = [bb[q::Q] for q in range(Q)]
        for r in ar:
            out.extend(_dot(r, c) for c in bc)
    return Tensor(batch + (P, Q), out)


def reduce_(t, dims, keepdim, kind):
    nd = len(t.shape)
    dims = sorted(set(_norm_axis(d, nd) for d in dims))
    keep = [d for d in range(nd) if d not in dims]
    p = permute(t, keep + dims)
    inner = math.prod([t.shape[d] for d in dims])
    data = p.data
    out = []
    for i in range(0, len(data), inner):
        chunk = data[i:i + inner]
        if kind == "sum":
            out.append(sum(chunk))
        elif kind == "mean":
            out.append(sum(chunk) / inner)
        elif kind == "max":
            out.append(max(chunk))
        else:
            raise InterpError(kind)
    if keepdim:
        shape = [1 if d in dims else t.shape[d] for d in range(nd)]
    else:
        shape = [t.shape[d] for d in keep]
    return Tensor(shape, out, t.dtype)


def softmax(t, dim):
    nd = len(t.shape)
    dim = _norm_axis(dim, nd)
    perm = [d for d in range(nd) if d != dim] + [dim]
    p = permute(t, perm)
    out = []
    for r in _rows(p):
        m = max(r)
        e = [math.exp(x - m) for x in r]
        s = sum(e)
        out.extend(x / s for x in e)
    inv = [0] * nd
    for i, d in enumerate(perm):
        inv[d] = i
    return permute(Tensor(p.shape, out), inv)


def _gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


UNARY = {
    "neg": operator.neg,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x),
    "recip": lambda x: 1.0 / x,
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": math.tanh,
    "relu": lambda x: x if x > 0 else 0.0,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "cos": math.cos,
    "sin": math.sin,
}


def _pow(a, b):
    if b == 2:
        return a * a
    return math.pow(a, b)


def _div(a, b):
    return a / b


BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": _div,
    "pow": _pow,
    "maximum": max,
    "minimum": min,
}


# --------------------------------------------------------------------------- binding

def _subst_layer(name, i):
    return name.replace("{i}", str(i))


def _move_rope_rows(shape, data, heads, to_graph):
    """Reorder the rows of a q/k weight between the two RoPE layouts: file order
    (llama.cpp's converter interleaves each head's rotary pairs: row 2*j+half) and graph
    order (HF splits each head into halves: row half*(Dh/2)+j). `to_graph` picks the way."""
    rows = shape[0]
    if rows % heads:
        raise InterpError("rope row permutation: %d rows for %d heads" % (rows, heads))
    dh = rows // heads
    if dh % 2:
        raise InterpError("rope row permutation: odd head size %d" % dh)
    k = math.prod(shape[1:])
    out = [None] * len(data)
    for h in range(heads):
        for half in range(2):
            for j in range(dh // 2):
                graph_row = h * dh + half * (dh // 2) + j
                file_row = h * dh + 2 * j + half
                dst, src = (graph_row, file_row) if to_graph else (file_row, graph_row)
                out[dst * k:(dst + 1) * k] = data[src * k:(src + 1) * k]
    return out


def unpermute_rope_rows(shape, data, heads):
    """File order (interleaved pairs per head) -> graph order (split halves)."""
    return _move_rope_rows(shape, data, heads, True)


def permute_rope_rows(shape, data, heads):
    """Graph order -> file order (what llama.cpp's converter writes)."""
    return _move_rope_rows(shape, data, heads, False)


def _resolve_hparams(names, lookup):
    """lookup(name, env) -> value or raises KeyError-like _Pending."""
    env = {}
    pending = list(names)
    while pending:
        progress = False
        for name in list(pending):
            try:
                env[name] = lookup(name, env)
            except _Pending:
                continue
            pending.remove(name)
            progress = True
        if not progress:
            raise InterpError("cannot resolve hparams %r (cyclic or missing defaults)" % pending)
    return env


class _Pending(Exception):
    pass


class BindError(InterpError):
    """A program does not bind to a weights file (a refusal, not a broken program)."""


def _config_get(config, path):
    """Dotted path into config.json; None when absent (or null)."""
    v = config
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


class _GGUFSource:
    section = "gguf"

    def __init__(self, gg):
        self.gg = gg
        self.arch = gg.kv.get("general.architecture", "")
        self.tensors = gg.tensors
        self.tensor_order = gg.tensor_order

    def raw(self, h):
        """(value, key) of the first present key of rule h, or (None, None)."""
        if "key" not in h:
            return None, None
        for tmpl in (h["key"] if isinstance(h["key"], list) else [h["key"]]):
            key = tmpl.replace("{arch}", self.arch)
            if key in self.gg.kv:
                return self.gg.kv[key], key
        return None, None

    def match_value(self, key):
        return self.gg.kv.get(key.replace("{arch}", self.arch))

    def tensor_values(self, name):
        return self.gg.tensor_values(name)


class _HFSource:
    section = "safetensors"

    def __init__(self, ck):
        self.ck = ck
        self.tensors = ck.tensors
        self.tensor_order = ck.tensor_order

    def raw(self, h):
        if "config" not in h:
            return None, None
        paths = h["config"] if isinstance(h["config"], list) else [h["config"]]
        for p in paths:
            v = _config_get(self.ck.config, p)
            if v is not None:
                return v, "config.json " + p
        return None, None

    def match_value(self, key):
        return _config_get(self.ck.config, key)

    def tensor_values(self, name):
        return self.ck.tensor_values(name)


def apply_transform(tr, shape, data, env, pname=""):
    """The map transforms (docs/formats/graph.md), on row-major f32 data."""
    op = tr.get("op")
    if op == "unpermute_rope_rows":
        return unpermute_rope_rows(shape, data, E.eval_int(tr["heads"], env))
    if op == "add_scalar":
        v = E.eval_float(tr["value"], env)
        return [x + v for x in data]
    if op == "reshape":
        return data  # a view: the shape was checked at binding
    raise BindError("param %r: unknown transform %r" % (pname, op))


def check_match(pmap_section, src):
    """The section's `match` clause: each metadata key must hold one of the listed values
    (null in the list: the key may be absent or null)."""
    for key, allowed in (pmap_section.get("match") or {}).items():
        got = src.match_value(key)
        if got not in allowed:
            raise BindError("metadata %r is %s; this program wants one of %s" % (
                key, json.dumps(got), json.dumps(allowed)))


def _value_key(x):
    """How a metadata value is spelled as a key of a per-layer rule's "values"."""
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)) and float(x).is_integer():
        return str(int(x))
    return repr(float(x))


def _as_number(v, name, where):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BindError("hparam %r: %s is %s, not a number" % (name, where, json.dumps(v)))
    return v


def _plain(v):
    if isinstance(v, float):
        return v
    return int(v) if v.denominator == 1 else float(v)


def resolve_hparams(graph, spec, src):
    """Values of the graph's hparams and of every other hparam the map section names
    (max_positions), from metadata, tensor shapes and defaults. Per-layer hparams (the
    graph's "layer_hparams") become lists with one value per layer."""
    hspec = spec["hparams"]
    layer_names = list(graph.get("layer_hparams", []))

    def lookup(name, env):
        if name not in hspec:
            raise BindError("map.json has no hparam %r" % name)
        h = hspec[name]
        v, where = src.raw(h)
        if v is not None:
            if isinstance(v, list):
                if h.get("reduce") != "max":
                    raise BindError("hparam %r: %s is a list (one value per layer?); a scalar hparam needs "
                                    "\"reduce\": \"max\"" % (name, where))
                if not v:
                    raise BindError("hparam %r: %s is an empty list" % (name, where))
                return max(_as_number(x, name, where) for x in v)
            return _as_number(v, name, where)
        if "tensor" in h:
            t = src.tensors.get(h["tensor"])
            if t is not None:
                return t["shape"][h.get("dim", 0)]
        if "default" in h:
            need = E.symbols(str(h["default"])) if isinstance(h["default"], str) else set()
            if not need <= set(env):
                raise _Pending()
            return _plain(E.evaluate(h["default"], env))
        raise BindError("hparam %r: %s absent and no default" % (
            name, h.get("key", h.get("config", h.get("tensor")))))

    names = [h for h in graph["hparams"] if h not in layer_names]
    names += [h for h in hspec if h not in graph["hparams"] and h not in layer_names]
    try:
        env = _resolve_hparams(names, lookup)
    except InterpError as e:
        raise BindError(str(e)) from e
    if layer_names:
        from . import ir
        rep = ir.find_repeat(graph)
        if rep is None:
            raise BindError("per-layer hparams without a repeat")
        count = E.eval_int(rep["count"], env)
        for name in layer_names:
            if name not in hspec:
                raise BindError("map.json has no hparam %r" % name)
            env[name] = per_layer_values(name, hspec[name], src, env, count)
    return env


def per_layer_values(name, h, src, env, count):
    """A per-layer hparam: a list of `count` numbers from a list (or a scalar, the same
    for every layer) in the metadata, each mapped through "values" when the rule has it;
    else "default", an expression over the hparams and the layer index i."""
    v, where = src.raw(h)
    if v is None:
        if "default" not in h:
            raise BindError("hparam %r: %s absent and no default" % (name, h.get("key", h.get("config"))))
        return [_plain(E.evaluate(h["default"], dict(env, i=i))) for i in range(count)]
    items = v if isinstance(v, list) else [v] * count
    if len(items) != count:
        raise BindError("hparam %r: %s has %d entries for %d layers" % (name, where, len(items), count))
    out = []
    for i, x in enumerate(items):
        if "values" in h:
            table = h["values"]
            k = _value_key(x)
            if k in table:
                e = table[k]
            elif "*" in table:
                e = table["*"]
            else:
                raise BindError("hparam %r: %s[%d] is %s; the program takes %s" % (
                    name, where, i, json.dumps(x), ", ".join(sorted(table))))
            out.append(_plain(E.evaluate(e, dict(env, i=i))))
        else:
            out.append(_as_number(x, name, "%s[%d]" % (where, i)))
    return out


def _file_shape_ok(p, m, shape, env):
    """The tensor's shape against what the graph wants (a "reshape" transform names the
    file's shape: same elements, same rows). Returns the graph's shape or raises."""
    want = [E.eval_int(d, env) for d in p["shape"]]
    tr = m.get("transform")
    if tr and tr.get("op") == "reshape":
        stored = [E.eval_int(d, env) for d in tr["shape"]]
        if list(shape) != stored:
            return None, stored
        if math.prod(stored) != math.prod(want) or (stored and want and stored[-1] != want[-1]):
            raise BindError("param %r: reshape from %r to %r changes the rows" % (p["name"], stored, want))
        return want, stored
    return (want if list(shape) == want else None), want


def bind_source(graph, pmap, src):
    """Hparams and params of `graph` from a weights source through section
    `src.section` of parameter map `pmap`. Returns (hparams, params, unused tensors).
    Raises BindError when the program does not bind (missing tensor, wrong shape, ...).
    A per-layer param binds only on the layers whose body reads it (layer kinds)."""
    if src.section not in pmap:
        raise BindError("map.json has no %r section" % src.section)
    spec = pmap[src.section]
    check_match(spec, src)
    hp = resolve_hparams(graph, spec, src)
    from . import ir
    players = ir.param_layers(graph, hp)
    pspec = spec["params"]
    used = set()
    plan = []
    scalars = {k: v for k, v in hp.items() if not isinstance(v, list)}
    # names and shapes first (a refusal reads no tensor data), then the data
    for p in graph["params"]:
        name = p["name"]
        if name not in pspec:
            raise InterpError("map.json has no entry for param %r" % name)
        m = pspec[name]
        layers = players[name] if "{i}" in name else [None]
        for i in layers:
            full = name if i is None else _subst_layer(name, i)
            tname = m["tensor"] if i is None else _subst_layer(m["tensor"], i)
            if tname not in src.tensors and "fallback" in m:
                tname = m["fallback"] if i is None else _subst_layer(m["fallback"], i)
            if tname not in src.tensors:
                raise BindError("param %r: tensor %r not in the file" % (full, tname))
            used.add(tname)
            shape = list(src.tensors[tname]["shape"])
            env = dict(scalars)
            if i is not None:
                env["i"] = i
            got, want = _file_shape_ok(p, m, shape, env)
            if got is None:
                raise BindError("param %r (tensor %r): shape %r, graph wants %r" % (full, tname, shape, want))
            plan.append((full, tname, got, m.get("transform"), env))
    params = {}
    for full, tname, shape, tr, env in plan:
        data = src.tensor_values(tname)
        if tr:
            data = apply_transform(tr, shape, data, env, full)
        params[full] = Tensor(shape, data)
    unused = [t for t in src.tensor_order if t not in used]
    return hp, params, unused


def bind_gguf(graph, pmap, gg):
    """Hparams and params of `graph` from GGUFFile `gg` through the map's "gguf" section."""
    return bind_source(graph, pmap, _GGUFSource(gg))


def bind_safetensors(graph, pmap, ck):
    """... from an HFCheckpoint (config.json + safetensors) through the "safetensors" section."""
    return bind_source(graph, pmap, _HFSource(ck))


def load_program(program_dir):
    with open(os.path.join(program_dir, "graph.json")) as f:
        graph = json.load(f)
    with open(os.path.join(program_dir, "map.json")) as f:
        pmap = json.load(f)
    return graph, pmap


def select_program(programs_dir, weights):
    """The runtime's structure matching, in Python: tries every program of `programs_dir`
    (sorted by name) on `weights` (a GGUFFile or an HFCheckpoint) and returns
    (name, hparams, params, refusals) of the first whose params all bind and which uses
    every tensor of the file; name is None when none does."""
    refusals = {}
    for name in sorted(os.listdir(programs_dir)):
        d = os.path.join(programs_dir, name)
        if not os.path.exists(os.path.join(d, "graph.json")):
            continue
        graph, pmap = load_program(d)
        src = _GGUFSource(weights) if isinstance(weights, GGUFFile) else _HFSource(weights)
        try:
            hp, params, unused = bind_source(graph, pmap, src)
        except BindError as e:
            refusals[name] = str(e)
            continue
        if unused:
            refusals[name] = "tensors the program does not use: %s" % unused[:8]
            continue
        return name, hp, params, refusals
    return None, None, None, refusals


def bind_dict(graph, hparams, tensors):
    """Params from a dict of full names -> (shape, flat data)."""
    params = {}
    from . import ir
    players = ir.param_layers(graph, hparams)
    for p in graph["params"]:
        name = p["name"]
        for i in (players[name] if "{i}" in name else [None]):
            full = name if i is None else _subst_layer(name, i)
            if full not in tensors:
                raise InterpError("param %r missing" % full)
            shape, data = tensors[full]
            env = {k: v for k, v in hparams.items() if not isinstance(v, list)}
            if i is not None:
                env["i"] = i
            want = [E.eval_int(d, env) for d in p["shape"]]
            if list(shape) != want:
                raise InterpError("param %r: shape %r, graph wants %r" % (full, list(shape), want))
            params[full] = Tensor(shape, list(data))
    return dict(hparams), params


# --------------------------------------------------------------------------- program

class Program:
    """A bound graph with its own KV cache."""

    def __init__(self, graph, hparams, params):
        if graph.get("format") != "llmopt-graph" or graph.get("version") != 1:
            raise InterpError("not a version 1 llmopt graph")
        self.g = graph
        self.hp = dict(hparams)
        self.params = params
        self.kv = {}  # attention node (unrolled id) -> {slot: {pos: (k rows, v rows)}}
        self.conv = {}  # short_conv node (unrolled id) -> {slot: {pos: input row}}
        self.check_shapes = True
        self._shapes = {}  # (node id, layer, N, M) -> declared shape, evaluated

    def reset(self):
        self.kv = {}
        self.conv = {}

    # -- values
    def _lookup(self, ref, scopes, layer):
        for s in scopes:
            if ref in s:
                return s[ref]
        name = ref if layer is None else _subst_layer(ref, layer)
        if name in self.params:
            return self.params[name]
        raise InterpError("undefined value %r" % ref)

    def forward(self, tokens, positions, seq_slots, out_rows):
        N, M = len(tokens), len(out_rows)
        env = {k: v for k, v in self.hp.items() if not isinstance(v, list)}
        env["N"] = N
        env["M"] = M
        inputs = {
            "tokens": Tensor([N], [int(t) for t in tokens], "i32"),
            "positions": Tensor([N], [int(p) for p in positions], "i32"),
            "seq_slots": Tensor([N], [int(s) for s in seq_slots], "i32"),
            "out_rows": Tensor([M], [int(r) for r in out_rows], "i32"),
        }
        for spec in self.g["inputs"]:
            if spec["name"] not in inputs:
                raise InterpError("unknown graph input %r" % spec["name"])
        outer = dict(inputs)
        self._run(self.g["nodes"], [outer], None, env, "")
        outs = self.g["outputs"]
        if len(outs) != 1 or outs[0]["name"] != "logits":
            raise InterpError("graph must have exactly one output, logits")
        return outer[outs[0]["value"]]

    def _run(self, nodes, scopes, layer, env, suffix):
        local = scopes[0]
        for n in nodes:
            if n["op"] == "repeat":
                if layer is not None:
                    raise InterpError("nested repeat")
                from . import ir
                count = E.eval_int(n["count"], env)
                carry = {name: self._lookup(init, scopes, layer) for name, init in n["carry"].items()}
                for i in range(count):
                    body_env = ir.layer_env(self.g, self.hp, n, i)
                    body_env["N"], body_env["M"] = env["N"], env["M"]
                    body, yld = ir.layer_body(n, body_env)
                    inner = dict(carry)
                    self._run(body, [inner] + scopes, i, body_env, "@%d" % i)
                    carry = {name: inner[v] for name, v in yld.items()}
                for name, oid in n["out"].items():
                    local[oid] = carry[name]
                continue
            args = [self._lookup(r, scopes, layer) for r in n["in"]]
            try:
                val = self._op(n, args, env, n["id"] + suffix)
            except (InterpError, E.ExprError, ValueError, ZeroDivisionError, IndexError) as e:
                raise InterpError("node %s (%s): %s" % (n["id"] + suffix, n["op"], e)) from e
            if self.check_shapes:
                key = (n["id"], layer, env["N"], env["M"])
                want = self._shapes.get(key)
                if want is None:
                    want = self._shapes[key] = tuple(E.eval_int(d, env) for d in n["shape"])
                if val.shape != want:
                    raise InterpError("node %s (%s): shape %r, declared %r = %r" % (
                        n["id"] + suffix, n["op"], val.shape, n["shape"], want))
                if n.get("dtype") and n["dtype"] != val.dtype:
                    raise InterpError("node %s (%s): dtype %s, declared %s" % (n["id"] + suffix, n["op"], val.dtype, n["dtype"]))
            local[n["id"]] = val

    def _op(self, n, a, env, uid):
        op = n["op"]
        at = n.get("attrs", {})
        if op == "const":
            return Tensor((), [E.eval_float(at["value"], env)])
        if op == "rope_freqs":
            dim = E.eval_int(at["dim"], env)
            theta = E.eval_float(at["theta"], env)
            return Tensor([dim // 2], [theta ** (-2.0 * j / dim) for j in range(dim // 2)])
        if op == "embedding":
            w, ids = a
            D = w.shape[1]
            out = []
            for t in ids.data:
                if not 0 <= t < w.shape[0]:
                    raise InterpError("token id %d out of range" % t)
                out.extend(w.data[t * D:(t + 1) * D])
            return Tensor(ids.shape + (D,), out)
        if op == "linear":
            return linear(a[0], a[1], a[2] if len(a) > 2 else None)
        if op == "matmul":
            return matmul(a[0], a[1])
        if op in UNARY:
            f = UNARY[op]
            return Tensor(a[0].shape, [f(x) for x in a[0].data])
        if op in BINARY:
            return binary(BINARY[op], a[0], a[1])
        if op in ("mean", "sum", "max"):
            return reduce_(a[0], at["dims"], int(at.get("keepdim", 0)), op)
        if op == "softmax":
            return softmax(a[0], at["dim"])
        if op == "rms_norm":
            x, w = a
            eps = E.eval_float(at["eps"], env)
            out = []
            for r in _rows(x):
                s = 1.0 / math.sqrt(sum(v * v for v in r) / len(r) + eps)
                out.extend(v * s * g for v, g in zip(r, w.data))
            return Tensor(x.shape, out)
        if op == "layer_norm":
            x, w, b = a
            eps = E.eval_float(at["eps"], env)
            out = []
            for r in _rows(x):
                mu = sum(r) / len(r)
                var = sum((v - mu) ** 2 for v in r) / len(r)
                s = 1.0 / math.sqrt(var + eps)
                out.extend((v - mu) * s * g + c for v, g, c in zip(r, w.data, b.data))
            return Tensor(x.shape, out)
        if op == "reshape":
            shape = [E.eval_int(d, env) for d in at["shape"]]
            if math.prod(shape) != len(a[0].data):
                raise InterpError("reshape %r to %r" % (a[0].shape, shape))
            return Tensor(shape, a[0].data, a[0].dtype)
        if op == "permute":
            return permute(a[0], at["perm"])
        if op == "expand":
            return expand_to(a[0], [E.eval_int(d, env) for d in at["shape"]])
        if op == "slice":
            return slice_(a[0], at["dim"], E.eval_int(at["start"], env), E.eval_int(at["end"], env),
                          E.eval_int(at.get("step", 1), env))
        if op == "concat":
            return concat(a, at["dim"])
        if op == "cast":
            dt = at["dtype"]
            if dt == "f32":
                return Tensor(a[0].shape, [float(x) for x in a[0].data], "f32")
            if dt == "i32":
                return Tensor(a[0].shape, [int(x) for x in a[0].data], "i32")
            raise InterpError("cast to %r" % dt)
        if op == "select_rows":
            x, rows = a
            nd = len(x.shape)
            if nd < 2:
                raise InterpError("select_rows on rank %d" % nd)
            st = _strides(x.shape)
            n_rows = x.shape[-2]
            for r in rows.data:
                if not 0 <= r < n_rows:
                    raise InterpError("select_rows: row %d of %d" % (r, n_rows))
            dims = [[i * st[d] for i in range(x.shape[d])] for d in range(nd - 2)]
            dims.append([r * st[nd - 2] for r in rows.data])
            dims.append(list(range(x.shape[-1])))
            return x.take(_gather_offsets(dims), x.shape[:-2] + (len(rows.data), x.shape[-1]))
        if op == "attention":
            return self._attention(a, at, env, uid)
        if op == "short_conv":
            return self._short_conv(a, uid)
        raise InterpError("op %r is not canonical (or not in this interpreter)" % op)

    def _short_conv(self, a, uid):
        """y[t, c] = sum_j w[c, j] * u(pos_t - (L-1) + j)[c] (w [C, L] or [C, 1, L]), u(q) the sequence's input at
        position q (this batch or earlier ones), 0 for q < 0."""
        x, w, pos, slots = a
        if len(w.shape) == 3 and w.shape[1] == 1:  # [C, 1, L]: PyTorch's depthwise Conv1d layout
            w = Tensor((w.shape[0], w.shape[2]), w.data)
        if len(x.shape) != 3 or x.shape[0] != 1 or len(w.shape) != 2 or w.shape[0] != x.shape[2]:
            raise InterpError("short_conv shapes x %r w %r" % (x.shape, w.shape))
        _, N, C = x.shape
        L = w.shape[1]
        state = self.conv.setdefault(uid, {})
        for t in range(N):
            state.setdefault(slots.data[t], {})[pos.data[t]] = x.data[t * C:(t + 1) * C]
        wr = _rows(w)
        out = []
        for t in range(N):
            p = pos.data[t]
            seq = state[slots.data[t]]
            acc = [0.0] * C
            for j in range(L):
                q = p - (L - 1) + j
                if q < 0:
                    continue
                if q not in seq:
                    raise InterpError("short_conv: position %d of slot %d was never seen" % (q, slots.data[t]))
                u = seq[q]
                for c in range(C):
                    acc[c] += wr[c][j] * u[c]
            out.extend(acc)
        return Tensor((1, N, C), out)

    def _attention(self, a, at, env, uid):
        q, k, v, pos, slots = a
        if len(q.shape) != 4 or q.shape[0] != 1:
            raise InterpError("attention q shape %r" % (q.shape,))
        _, H, N, Dh = q.shape
        Hkv = k.shape[1]
        if k.shape != (1, Hkv, N, Dh) or v.shape != (1, Hkv, N, Dh) or H % Hkv:
            raise InterpError("attention shapes q %r k %r v %r" % (q.shape, k.shape, v.shape))
        scale = E.eval_float(at["scale"], env)
        window = E.eval_int(at.get("window", 0), env)
        cache = self.kv.setdefault(uid, {})
        # append every token's k, v first: the batch's own tokens are visible to later ones
        for t in range(N):
            krow = [k.data[((h * N) + t) * Dh:((h * N) + t + 1) * Dh] for h in range(Hkv)]
            vrow = [v.data[((h * N) + t) * Dh:((h * N) + t + 1) * Dh] for h in range(Hkv)]
            cache.setdefault(slots.data[t], {})[pos.data[t]] = (krow, vrow)
        rep = H // Hkv
        out = [0.0] * (N * H * Dh)
        for t in range(N):
            p = pos.data[t]
            seq = cache[slots.data[t]]
            keys = sorted(s for s in seq if s <= p and (window <= 0 or p - s < window))
            for h in range(H):
                qv = q.data[((h * N) + t) * Dh:((h * N) + t + 1) * Dh]
                kh = h // rep
                sc = [_dot(qv, seq[s][0][kh]) * scale for s in keys]
                m = max(sc)
                e = [math.exp(x - m) for x in sc]
                z = sum(e)
                acc = [0.0] * Dh
                for w, s in zip(e, keys):
                    vv = seq[s][1][kh]
                    w /= z
                    for d in range(Dh):
                        acc[d] += w * vv[d]
                base = (t * H + h) * Dh
                out[base:base + Dh] = acc
        return Tensor((1, N, H, Dh), out)


# --------------------------------------------------------------------------- golden check

def _row_errors(got, want):
    m = max(abs(x) for x in want) or 1.0
    d = max(abs(x - y) for x, y in zip(got, want))
    return d, d / m


def _argmax(r):
    best = 0
    for i, x in enumerate(r):
        if x > r[best]:
            best = i
    return best


def _logit_rows(t):
    V = t.shape[-1]
    return [t.data[i:i + V] for i in range(0, len(t.data), V)]


class _Stats:
    def __init__(self):
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.rows = 0
        self.argmax_mismatch = 0

    def add(self, got, want):
        d, r = _row_errors(got, want)
        self.max_abs = max(self.max_abs, d)
        self.max_rel = max(self.max_rel, r)
        self.rows += 1
        if _argmax(got) != _argmax(want):
            self.argmax_mismatch += 1

    def __str__(self):
        return "rows=%d max_abs=%.3g max_rel=%.3g argmax_mismatch=%d" % (
            self.rows, self.max_abs, self.max_rel, self.argmax_mismatch)


def check_golden(prog, golden, log=print):
    """Replays golden.json through `prog` (prefill, then decode with the KV cache)."""
    results = {}
    for case in golden["cases"]:
        prog.reset()
        st = _Stats()
        for step in case["steps"]:
            out = prog.forward(step["tokens"], step["positions"], step["seq_slots"], step["out_rows"])
            rows = _logit_rows(out)
            if len(rows) != len(step["logits"]):
                raise InterpError("case %s: %d logit rows, golden has %d" % (case["name"], len(rows), len(step["logits"])))
            for g, w in zip(rows, step["logits"]):
                st.add(g, w)
        log("golden case %-10s %s" % (case["name"], st))
        results[case["name"]] = st
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", required=True)
    ap.add_argument("--map", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="bind a GGUF file through the map's gguf section")
    src.add_argument("--hf", help="bind a Hugging Face directory (config.json + safetensors) through the "
                                  "map's safetensors section")
    ap.add_argument("--golden", required=True)
    ap.add_argument("--max-rel", type=float, default=1e-4, help="fail above this relative error")
    args = ap.parse_args(argv)
    with open(args.graph) as f:
        graph = json.load(f)
    with open(args.map) as f:
        pmap = json.load(f)
    with open(args.golden) as f:
        golden = json.load(f)
    if args.gguf:
        hp, params, unused = bind_gguf(graph, pmap, GGUFFile(args.gguf))
    else:
        hp, params, unused = bind_safetensors(graph, pmap, HFCheckpoint(args.hf))
    print("bound hparams:", json.dumps(hp))
    if unused:
        print("tensors in the file the graph does not use:", unused)
    prog = Program(graph, hp, params)
    res = check_golden(prog, golden)
    worst = max(s.max_rel for s in res.values())
    mism = sum(s.argmax_mismatch for s in res.values())
    print("ref_interp: max_rel=%.3g argmax_mismatch=%d" % (worst, mism))
    if worst > args.max_rel or mism or unused:
        print("ref_interp: FAILED", file=sys.stderr)
        return 1
    print("ref_interp: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
