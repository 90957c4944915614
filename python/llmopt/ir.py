"""Capture-side graph IR (pure Python): a flat list of canonical nodes tagged with the
decoder layer they came from, the `repeat` extraction, and serialization to the graph
file (docs/formats/graph.md).

References (operands) are tuples: ("node", id), ("input", name), ("param", name).
"""


class CaptureError(RuntimeError):
    pass


class Node:
    __slots__ = ("id", "op", "ins", "attrs", "dtype", "shape", "layer", "src")

    def __init__(self, id, op, ins, attrs, dtype, shape, layer=None, src=""):
        self.id = id
        self.op = op
        self.ins = list(ins)
        self.attrs = dict(attrs)
        self.dtype = dtype
        self.shape = list(shape)
        self.layer = layer
        self.src = src

    def ref(self):
        return ("node", self.id)

    def __repr__(self):
        return "Node(%s=%s%r L%s %s)" % (self.id, self.op, self.ins, self.layer, self.shape)


class Builder:
    def __init__(self):
        self.nodes = []
        self.by_id = {}
        self.params = {}       # full name -> (dtype, shape exprs)
        self.param_order = []
        self._n = 0

    def add(self, op, ins, attrs, dtype, shape, layer=None, src=""):
        nid = "t%d" % self._n
        self._n += 1
        n = Node(nid, op, ins, attrs, dtype, shape, layer, src)
        self.nodes.append(n)
        self.by_id[nid] = n
        return n.ref()

    def param(self, name, dtype, shape):
        if name not in self.params:
            self.params[name] = (dtype, list(shape))
            self.param_order.append(name)
        return ("param", name)


def users_map(nodes):
    users = {}
    for n in nodes:
        for r in n.ins:
            if r[0] == "node":
                users.setdefault(r[1], []).append(n.id)
    return users


def dce(nodes, outputs):
    """Keeps nodes reachable from `outputs` (refs)."""
    by_id = {n.id: n for n in nodes}
    live = set()
    stack = [r[1] for r in outputs if r[0] == "node"]
    while stack:
        nid = stack.pop()
        if nid in live:
            continue
        live.add(nid)
        for r in by_id[nid].ins:
            if r[0] == "node":
                stack.append(r[1])
    return [n for n in nodes if n.id in live]


def forward_aliases(nodes, alias):
    """Rewrites operands through `alias` (node id -> ref), following chains."""
    def res(r):
        seen = 0
        while r[0] == "node" and r[1] in alias:
            r = alias[r[1]]
            seen += 1
            if seen > 100000:
                raise CaptureError("alias cycle")
        return r
    for n in nodes:
        n.ins = [res(r) for r in n.ins]
    return res


def fold_reshape_chains(nodes, outputs):
    """reshape(reshape(x)) -> reshape(x); reshape to the same shape -> x."""
    by_id = {n.id: n for n in nodes}
    alias = {}
    for n in nodes:
        if n.op != "reshape":
            continue
        src = n.ins[0]
        while src[0] == "node" and src[1] in alias:
            src = alias[src[1]]
        if src[0] == "node" and by_id[src[1]].op == "reshape" and by_id[src[1]].layer == n.layer:
            n.ins = [by_id[src[1]].ins[0]]
        else:
            n.ins = [src]
    # reshape whose input already has the target shape
    shape_of = {n.id: n.shape for n in nodes}
    for n in nodes:
        if n.op == "reshape" and n.ins[0][0] == "node" and shape_of.get(n.ins[0][1]) == n.shape:
            alias[n.id] = n.ins[0]
    res = forward_aliases(nodes, alias)
    outputs = [res(r) for r in outputs]
    return dce(nodes, outputs), outputs


def _layer_param_template(name, prefix, layer):
    """'model.layers.0.x' -> 'model.layers.{i}.x' (None when not a layer param)."""
    head = "%s.%d." % (prefix, layer)
    if name.startswith(head):
        return "%s.{i}.%s" % (prefix, name[len(head):])
    return None


def extract_repeat(nodes, outputs, n_layers, layer_prefix):
    """Turns the nodes of layers 0..n_layers-1 into one `repeat` over layer 0's nodes.

    Checks that every layer's node list equals layer 0's (ops, attrs, shapes; operands
    internal at the same position, parameters equal up to the layer index, outer values
    identical) except for carried values, which must flow from the previous layer.
    Returns (pre nodes, repeat dict with Node lists, post nodes, outputs, param renames).
    """
    layers = [[n for n in nodes if n.layer == k] for k in range(n_layers)]
    stray = sorted({n.layer for n in nodes if n.layer is not None and not 0 <= n.layer < n_layers})
    if stray:
        raise CaptureError("nodes tagged with layers %r outside 0..%d" % (stray, n_layers - 1))
    if not layers[0]:
        raise CaptureError("no node was attributed to decoder layer 0 (nn_module_stack missing?)")
    pos = [{n.id: p for p, n in enumerate(L)} for L in layers]
    carries = []  # list of (init ref in layer 0, yield position)
    carry_of_init = {}

    def fail(k, p, msg):
        a, b = layers[0][p], layers[k][p]
        raise CaptureError("layer %d differs from layer 0 at node %d (%s %s vs %s %s): %s" % (
            k, p, a.op, a.src, b.op, b.src, msg))

    for k in range(1, n_layers):
        if len(layers[k]) != len(layers[0]):
            raise CaptureError("layer %d has %d nodes, layer 0 has %d: layers are not identical" % (
                k, len(layers[k]), len(layers[0])))
        for p, (a, b) in enumerate(zip(layers[0], layers[k])):
            if a.op != b.op or a.attrs != b.attrs or a.shape != b.shape or a.dtype != b.dtype:
                fail(k, p, "op/attrs/shape differ: %r %r vs %r %r" % (a.attrs, a.shape, b.attrs, b.shape))
            if len(a.ins) != len(b.ins):
                fail(k, p, "operand count")
            for j, (ra, rb) in enumerate(zip(a.ins, b.ins)):
                if ra[0] == "node" and ra[1] in pos[0]:
                    if not (rb[0] == "node" and rb[1] in pos[k] and pos[k][rb[1]] == pos[0][ra[1]]):
                        fail(k, p, "operand %d: internal value maps to %r" % (j, rb))
                    continue
                if rb[0] == "node" and rb[1] in pos[k - 1]:
                    # carried: layer k reads layer k-1's value where layer 0 reads an outer value
                    yp = pos[k - 1][rb[1]]
                    if ra in carry_of_init:
                        if carries[carry_of_init[ra]][1] != yp:
                            fail(k, p, "operand %d: one outer value carried from two places" % j)
                    else:
                        if k != 1:
                            fail(k, p, "operand %d: carry first seen after layer 1" % j)
                        carry_of_init[ra] = len(carries)
                        carries.append((ra, yp))
                    continue
                if ra[0] == "param" and rb[0] == "param":
                    ta = _layer_param_template(ra[1], layer_prefix, 0)
                    tb = _layer_param_template(rb[1], layer_prefix, k)
                    if ta is None and tb is None and ra == rb:
                        continue
                    if ta is not None and ta == tb:
                        continue
                    fail(k, p, "operand %d: params %s vs %s" % (j, ra[1], rb[1]))
                if ra == rb and (ra[0] != "node" or all(ra[1] not in P for P in pos)):
                    continue
                fail(k, p, "operand %d: %r vs %r" % (j, ra, rb))
        # every carried value of layer k-1 must be read by layer k through the carry
    if n_layers > 1 and not carries:
        raise CaptureError("layers share no carried value")
    names = ["h"] + ["h%d" % c for c in range(1, len(carries))]
    layer_ids = set()
    for L in layers:
        layer_ids.update(n.id for n in L)
    last = layers[-1]
    # outer nodes: split into pre (before the repeat) and post (reading the last layer)
    out_id = {}
    for c, (init, yp) in enumerate(carries):
        out_id[last[yp].id] = names[c]
    pre, post = [], []
    post_ids = set()
    for n in nodes:
        if n.id in layer_ids:
            continue
        is_post = False
        for r in n.ins:
            if r[0] != "node":
                continue
            if r[1] in post_ids:
                is_post = True
            elif r[1] in layer_ids:
                if r[1] not in out_id:
                    raise CaptureError("node %s (%s) outside the layers reads %s, a layer value that is not carried" % (
                        n.id, n.op, r[1]))
                is_post = True
        (post if is_post else pre).append(n)
        if is_post:
            post_ids.add(n.id)
    for L in layers:
        for n in L:
            for r in n.ins:
                if r[0] == "node" and r[1] in post_ids:
                    raise CaptureError("layer node %s reads %s, which is computed after the layers" % (n.id, r[1]))
    for r in outputs:
        if r[0] == "node" and r[1] in layer_ids and r[1] not in out_id:
            raise CaptureError("graph output is a layer value that is not carried")
    # body: layer 0 with carried operands renamed and params templated
    carry_name_of = {init: names[c] for c, (init, _) in enumerate(carries)}
    body = []
    for n in layers[0]:
        ins = []
        for r in n.ins:
            if r in carry_name_of:
                ins.append(("carry", carry_name_of[r]))
            elif r[0] == "param":
                t = _layer_param_template(r[1], layer_prefix, 0)
                ins.append(("param", t) if t is not None else r)
            else:
                ins.append(r)
        body.append(Node(n.id, n.op, ins, n.attrs, n.dtype, n.shape, 0, n.src))
    rep = {
        "carry": {names[c]: init for c, (init, _) in enumerate(carries)},
        "body": body,
        "yield": {names[c]: layers[0][yp].id for c, (_, yp) in enumerate(carries)},
        "out_of_last": out_id,  # last-layer node id -> carry name
    }
    return pre, rep, post


def to_graph(name, source, hparams, inputs, params, pre, rep, post, outputs, n_layers_expr="n_layers"):
    """Serializes to the graph file dict, numbering values v0, v1, ... in order."""
    ids = {}
    counter = [0]

    def new_id(old):
        nid = "v%d" % counter[0]
        counter[0] += 1
        ids[old] = nid
        return nid

    def ref(r):
        kind, v = r
        if kind == "node":
            if v not in ids:
                raise CaptureError("value %s used before it is defined" % v)
            return ids[v]
        return v  # input name, parameter name, carry name

    def emit(n):
        ins = [ref(r) for r in n.ins]
        return {"id": new_id(n.id), "op": n.op, "in": ins, "attrs": n.attrs, "dtype": n.dtype, "shape": n.shape}

    out_nodes = [emit(n) for n in pre]
    if rep is not None:
        carry = {c: ref(init) for c, init in rep["carry"].items()}
        body = [emit(n) for n in rep["body"]]
        yld = {c: ids[v] for c, v in rep["yield"].items()}
        out = {}
        for last_id, c in sorted(rep["out_of_last"].items(), key=lambda kv: kv[1]):
            out[c] = new_id(last_id)
        out_nodes.append({"op": "repeat", "count": n_layers_expr, "index": "i", "carry": carry,
                          "body": body, "yield": yld, "out": out})
    out_nodes += [emit(n) for n in post]
    used_params = set()

    def collect(nl):
        for n in nl:
            if n["op"] == "repeat":
                collect(n["body"])
            else:
                used_params.update(n["in"])
    collect(out_nodes)
    plist = [p for p in params if p["name"] in used_params]
    return {
        "format": "llmopt-graph",
        "version": 1,
        "name": name,
        "source": source,
        "hparams": hparams,
        "inputs": inputs,
        "params": plist,
        "nodes": out_nodes,
        "outputs": [{"name": "logits", "value": ref(outputs[0])}],
    }


def op_histogram(graph):
    hist = {}

    def walk(nl, mult):
        for n in nl:
            if n["op"] == "repeat":
                hist["repeat"] = hist.get("repeat", 0) + 1
                walk(n["body"], mult)
            else:
                hist[n["op"]] = hist.get(n["op"], 0) + 1
    walk(graph["nodes"], 1)
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def count_nodes(graph):
    total = 0
    for n in graph["nodes"]:
        total += 1
        if n["op"] == "repeat":
            total += len(n["body"])
    return total


def validate(graph, canonical_ops):
    """Structural checks of a graph file dict: ids unique, operands defined before use,
    ops canonical, params declared."""
    defined = {i["name"] for i in graph["inputs"]}
    params = {p["name"] for p in graph["params"]}
    seen = set()

    def check(nl, scope):
        for n in nl:
            if n["op"] == "repeat":
                if scope is not defined:
                    raise CaptureError("nested repeat")
                for c, init in n["carry"].items():
                    if init not in defined and init not in params:
                        raise CaptureError("repeat carry %s: %s undefined" % (c, init))
                inner = set(n["carry"])
                check(n["body"], inner)
                for c, v in n["yield"].items():
                    if v not in inner:
                        raise CaptureError("repeat yield %s: %s not a body value" % (c, v))
                for c, v in n["out"].items():
                    if c not in n["carry"]:
                        raise CaptureError("repeat out %s is not a carry" % c)
                    if v in seen:
                        raise CaptureError("duplicate id %s" % v)
                    seen.add(v)
                    defined.add(v)
                continue
            if n["op"] not in canonical_ops:
                raise CaptureError("op %r is not canonical" % n["op"])
            for r in n["in"]:
                if r not in defined and r not in params and r not in scope:
                    raise CaptureError("node %s reads %s before it is defined" % (n["id"], r))
            if n["id"] in seen:
                raise CaptureError("duplicate id %s" % n["id"])
            seen.add(n["id"])
            scope.add(n["id"])
    check(graph["nodes"], defined)
    for o in graph["outputs"]:
        if o["value"] not in defined:
            raise CaptureError("output %s undefined" % o["value"])
    if any("{i}" in p for p in params) and not any(n["op"] == "repeat" for n in graph["nodes"]):
        raise CaptureError("per-layer params without a repeat")


CANONICAL_OPS = {
    "const", "rope_freqs", "embedding", "linear", "matmul",
    "neg", "exp", "sqrt", "rsqrt", "recip", "silu", "sigmoid", "tanh", "relu", "gelu", "gelu_tanh", "cos", "sin",
    "add", "sub", "mul", "div", "pow", "maximum", "minimum",
    "mean", "sum", "max", "softmax", "rms_norm", "layer_norm",
    "reshape", "permute", "expand", "slice", "concat", "cast", "select_rows", "attention",
}


def dumps_graph(graph):
    """JSON text with one node per line (diff-friendly)."""
    import json

    def j(x):
        return json.dumps(x, separators=(", ", ": "))

    lines = ["{"]
    keys = [k for k in graph if k != "nodes"]
    for k in keys[:keys.index("params")]:
        lines.append('  "%s": %s,' % (k, j(graph[k])))
    lines.append('  "params": [')
    lines.append(",\n".join("    " + j(p) for p in graph["params"]))
    lines.append("  ],")
    lines.append('  "nodes": [')
    out = []
    for n in graph["nodes"]:
        if n["op"] == "repeat":
            head = {k: v for k, v in n.items() if k not in ("body", "yield", "out")}
            body = ",\n".join("        " + j(b) for b in n["body"])
            out.append("    " + j(head)[:-1] + ', "body": [\n' + body + "\n      ],\n      "
                       + '"yield": %s, "out": %s}' % (j(n["yield"]), j(n["out"])))
        else:
            out.append("    " + j(n))
    lines.append(",\n".join(out))
    lines.append("  ],")
    rest = [k for k in keys[keys.index("params") + 1:]]
    for i, k in enumerate(rest):
        lines.append('  "%s": %s%s' % (k, j(graph[k]), "," if i < len(rest) - 1 else ""))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    if json.loads(text) != json.loads(json.dumps(graph)):
        raise CaptureError("graph pretty-printer lost information")
    return text
