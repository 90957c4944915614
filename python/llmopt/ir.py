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


def _union_find():
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra
    return parent, find, union


def extract_repeat(nodes, outputs, n_layers, layer_prefix, kinds=None):
    """Turns the nodes of layers 0..n_layers-1 into one `repeat`.

    `kinds` (one value per layer, default all 0) says which layers share a body: every
    layer's node list must equal that of the first layer of its kind (ops, attrs,
    shapes; operands internal at the same position, parameters equal up to the layer
    index, outer values identical) except for carried values, which must flow from the
    previous layer (of any kind). Carries are found by which of the previous layer's
    values each layer reads; each kind yields every carry from one position of its body.

    Returns (pre nodes, repeat dict, post nodes). With one kind the repeat dict holds
    "body" and "yield" (graph.md's plain repeat); with several, "bodies" (kind ->
    {"body", "yield"}) and "kinds" (in order of first appearance).
    """
    if kinds is None:
        kinds = [0] * n_layers
    kinds = list(kinds)
    if len(kinds) != n_layers:
        raise CaptureError("%d layer kinds for %d layers" % (len(kinds), n_layers))
    layers = [[n for n in nodes if n.layer == k] for k in range(n_layers)]
    stray = sorted({n.layer for n in nodes if n.layer is not None and not 0 <= n.layer < n_layers})
    if stray:
        raise CaptureError("nodes tagged with layers %r outside 0..%d" % (stray, n_layers - 1))
    for k in range(n_layers):
        if not layers[k]:
            raise CaptureError("no node was attributed to decoder layer %d (nn_module_stack missing?)" % k)
    pos = [{n.id: p for p, n in enumerate(L)} for L in layers]
    layer_of_id = {n.id: k for k, L in enumerate(layers) for n in L}
    kind_list = []
    for K in kinds:
        if K not in kind_list:
            kind_list.append(K)
    tmpl = {K: kinds.index(K) for K in kind_list}

    def fail(k, p, msg):
        t = tmpl[kinds[k]]
        a, b = layers[t][p], layers[k][p]
        raise CaptureError("layer %d differs from layer %d at node %d (%s %s vs %s %s): %s" % (
            k, t, p, a.op, a.src, b.op, b.src, msg))

    # 1. every layer has its kind's structure
    for k in range(n_layers):
        t = tmpl[kinds[k]]
        if k == t:
            continue
        if len(layers[k]) != len(layers[t]):
            raise CaptureError("layer %d has %d nodes, layer %d (the first of its kind) has %d: layers are not "
                               "identical" % (k, len(layers[k]), t, len(layers[t])))
        for p, (a, b) in enumerate(zip(layers[t], layers[k])):
            if a.op != b.op or a.attrs != b.attrs or a.shape != b.shape or a.dtype != b.dtype:
                fail(k, p, "op/attrs/shape differ: %r %r vs %r %r" % (a.attrs, a.shape, b.attrs, b.shape))
            if len(a.ins) != len(b.ins):
                fail(k, p, "operand count")

    # 2. carries: operand slots (kind, node, operand) that read the previous layer's value
    #    at (previous kind, node); one equivalence class per carried value
    parent, find, union = _union_find()
    for k in range(1, n_layers):
        K, J = kinds[k], kinds[k - 1]
        for q, n in enumerate(layers[k]):
            for j, r in enumerate(n.ins):
                if r[0] != "node" or r[1] not in layer_of_id or layer_of_id[r[1]] == k:
                    continue
                if layer_of_id[r[1]] != k - 1:
                    raise CaptureError("layer %d node %d (%s) reads a value of layer %d: only the previous layer's "
                                       "values can be carried" % (k, q, n.op, layer_of_id[r[1]]))
                union(("slot", K, q, j), ("yield", J, pos[k - 1][r[1]]))
    # Bodies of different kinds meet only at the boundaries the layer pattern has: with
    # conv, attn, conv, ... the values crossing conv -> attn and attn -> conv form two
    # classes. When exactly one value crosses every boundary (the residual stream), it
    # is the one carried value: merge.
    crossing = {}
    for k in range(1, n_layers):
        crossing[k] = {find(("yield", kinds[k - 1], pos[k - 1][r[1]]))
                       for n in layers[k] for r in n.ins
                       if r[0] == "node" and layer_of_id.get(r[1]) == k - 1}
    if crossing and all(len(c) == 1 for c in crossing.values()):
        first = next(iter(crossing[1]))
        for c in crossing.values():
            union(first, next(iter(c)))
    carry_slot = {}
    yield_pos = {}
    for x in list(parent):
        root = find(x)
        if x[0] == "slot":
            carry_slot[x[1:]] = root
        else:
            J, p = x[1], x[2]
            have = yield_pos.setdefault(root, {})
            if J in have and have[J] != p:
                raise CaptureError("one carried value is yielded from two nodes (%d, %d) of kind %r layers" % (
                    have[J], p, J))
            have[J] = p
    def root_order(r):
        slots = [(q, j) for (K, q, j), rr in carry_slot.items() if rr == r and K == kinds[0]]
        return min(slots) if slots else (1 << 30, 0)
    roots = sorted(set(carry_slot.values()), key=root_order)
    for r in roots:
        missing = [K for K in kind_list if K not in yield_pos.get(r, {})]
        if missing:
            raise CaptureError("cannot tell which values layers of kind %r carry to which layer kind: capture "
                               "with a layer pattern that has every transition between kinds (conv -> conv, "
                               "conv -> attention, attention -> attention, attention -> conv)" % (missing,))
    if n_layers > 1 and not roots:
        raise CaptureError("layers share no carried value")

    # 3. operands: internal at the same position, parameters up to the layer index,
    #    carries from the previous layer's yield (layer 0: the initial value)
    inits = {}
    for k in range(n_layers):
        K = kinds[k]
        t = tmpl[K]
        for p, (a, b) in enumerate(zip(layers[t], layers[k])):
            for j, (ra, rb) in enumerate(zip(a.ins, b.ins)):
                root = carry_slot.get((K, p, j))
                if root is not None:
                    if k == 0:
                        if rb[0] == "node" and rb[1] in layer_of_id:
                            fail(k, p, "operand %d: carried operand reads a layer value" % j)
                        if root in inits and inits[root] != rb:
                            fail(k, p, "operand %d: one carried value starts from two outer values" % j)
                        inits[root] = rb
                    else:
                        want = layers[k - 1][yield_pos[root][kinds[k - 1]]].id
                        if rb != ("node", want):
                            fail(k, p, "operand %d: reads %r where the carried value is %s" % (j, rb, want))
                    continue
                if ra[0] == "node" and ra[1] in pos[t]:
                    if not (rb[0] == "node" and rb[1] in pos[k] and pos[k][rb[1]] == pos[t][ra[1]]):
                        fail(k, p, "operand %d: internal value maps to %r" % (j, rb))
                    continue
                if ra[0] == "param" and rb[0] == "param":
                    ta = _layer_param_template(ra[1], layer_prefix, t)
                    tb = _layer_param_template(rb[1], layer_prefix, k)
                    if ta is None and tb is None and ra == rb:
                        continue
                    if ta is not None and ta == tb:
                        continue
                    fail(k, p, "operand %d: params %s vs %s" % (j, ra[1], rb[1]))
                if ra == rb and not (ra[0] == "node" and ra[1] in layer_of_id):
                    continue
                fail(k, p, "operand %d: %r vs %r" % (j, ra, rb))
    for r in roots:
        if r not in inits:
            raise CaptureError("a carried value is never read by layer 0, so it has no initial value")
    names = ["h"] + ["h%d" % c for c in range(1, len(roots))]
    name_of = {r: names[c] for c, r in enumerate(roots)}

    # outer nodes: split into pre (before the repeat) and post (reading the last layer)
    layer_ids = set(layer_of_id)
    last = layers[-1]
    out_id = {}
    for r in roots:
        out_id[last[yield_pos[r][kinds[-1]]].id] = name_of[r]
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

    # bodies: the first layer of each kind with carried operands renamed and params templated
    bodies = {}
    for K in kind_list:
        t = tmpl[K]
        body = []
        for q, n in enumerate(layers[t]):
            ins = []
            for j, r in enumerate(n.ins):
                root = carry_slot.get((K, q, j))
                if root is not None:
                    ins.append(("carry", name_of[root]))
                elif r[0] == "param":
                    tp = _layer_param_template(r[1], layer_prefix, t)
                    ins.append(("param", tp) if tp is not None else r)
                else:
                    ins.append(r)
            body.append(Node(n.id, n.op, ins, n.attrs, n.dtype, n.shape, 0, n.src))
        bodies[K] = {"body": body, "yield": {name_of[r]: layers[t][yield_pos[r][K]].id for r in roots}}
    carry = {name_of[r]: inits[r] for r in roots}
    if len(kind_list) == 1:
        b = bodies[kind_list[0]]
        return pre, {"carry": carry, "body": b["body"], "yield": b["yield"], "out_of_last": out_id}, post
    return pre, {"carry": carry, "bodies": bodies, "kinds": kind_list, "out_of_last": out_id}, post


def to_graph(name, source, hparams, inputs, params, pre, rep, post, outputs, n_layers_expr="n_layers",
             layer_hparams=None, kind_expr=None, kind_names=None):
    """Serializes to the graph file dict, numbering values v0, v1, ... in order.

    A repeat with several bodies (extract_repeat with kinds) needs `kind_expr` (the
    per-layer expression choosing the body, e.g. "layer_kind"); `kind_names` names the
    bodies ({0: "conv", 1: "attention"}); `layer_hparams` lists the per-layer hparams."""
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
        if "bodies" in rep:
            if not kind_expr:
                raise CaptureError("a repeat with several bodies needs the per-layer kind expression")
            bodies = {}
            for K in rep["kinds"]:
                b = rep["bodies"][K]
                body = [emit(n) for n in b["body"]]
                bodies[str(K)] = {"name": (kind_names or {}).get(K, str(K)), "body": body,
                                  "yield": {c: ids[v] for c, v in b["yield"].items()}}
        else:
            body = [emit(n) for n in rep["body"]]
            yld = {c: ids[v] for c, v in rep["yield"].items()}
        out = {}
        for last_id, c in sorted(rep["out_of_last"].items(), key=lambda kv: kv[1]):
            out[c] = new_id(last_id)
        if "bodies" in rep:
            out_nodes.append({"op": "repeat", "count": n_layers_expr, "index": "i", "kind": kind_expr,
                              "carry": carry, "bodies": bodies, "out": out})
        else:
            out_nodes.append({"op": "repeat", "count": n_layers_expr, "index": "i", "carry": carry,
                              "body": body, "yield": yld, "out": out})
    out_nodes += [emit(n) for n in post]
    used_params = set()

    def collect(nl):
        for n in nl:
            if n["op"] == "repeat":
                for b in repeat_bodies(n):
                    collect(b["body"])
            else:
                used_params.update(n["in"])
    collect(out_nodes)
    plist = [p for p in params if p["name"] in used_params]
    graph = {
        "format": "llmopt-graph",
        "version": 1,
        "name": name,
        "source": source,
        "hparams": hparams,
    }
    if layer_hparams:
        graph["layer_hparams"] = list(layer_hparams)
    graph.update({
        "inputs": inputs,
        "params": plist,
        "nodes": out_nodes,
        "outputs": [{"name": "logits", "value": ref(outputs[0])}],
    })
    return graph


def repeat_bodies(rep):
    """The bodies of a repeat node as a list of {"body", "yield"[, "name", "key"]}: one
    for a plain repeat, one per kind for a repeat with "bodies"."""
    if "bodies" in rep:
        return [dict(b, key=k) for k, b in rep["bodies"].items()]
    return [{"body": rep.get("body", []), "yield": rep.get("yield", {}), "key": None}]


def find_repeat(graph):
    reps = [n for n in graph["nodes"] if n["op"] == "repeat"]
    return reps[0] if reps else None


def layer_body(rep, env):
    """The body (list of nodes) and yield a layer runs: `env` holds the hparams with the
    layer's index and per-layer values."""
    if "bodies" not in rep:
        return rep["body"], rep["yield"]
    from . import expr as E
    k = E.eval_int(rep["kind"], env)
    b = rep["bodies"].get(str(k))
    if b is None:
        raise CaptureError("layer %s: %s = %d has no body (bodies: %s)" % (
            env.get(rep.get("index", "i")), rep["kind"], k, sorted(rep["bodies"])))
    return b["body"], b["yield"]


def layer_env(graph, hparams, rep, i):
    """hparams (scalars, per-layer lists) as the environment of layer i."""
    env = {k: v for k, v in hparams.items() if not isinstance(v, (list, tuple))}
    for name in graph.get("layer_hparams", []):
        vals = hparams.get(name)
        if not isinstance(vals, (list, tuple)) or i >= len(vals):
            raise CaptureError("per-layer hparam %r has no value for layer %d" % (name, i))
        env[name] = vals[i]
    env[rep.get("index", "i")] = i
    return env


def param_layers(graph, hparams):
    """For each per-layer param ("{i}" in its name), the layers whose body reads it."""
    rep = find_repeat(graph)
    out = {p["name"]: [] for p in graph["params"] if "{i}" in p["name"]}
    if rep is None:
        return out
    from . import expr as E
    env0 = {k: v for k, v in hparams.items() if not isinstance(v, (list, tuple))}
    count = E.eval_int(rep["count"], env0)
    cache = {}
    for i in range(count):
        body, _ = layer_body(rep, layer_env(graph, hparams, rep, i))
        key = id(body)
        if key not in cache:
            cache[key] = {r for n in body for r in n["in"]}
        for name in out:
            if name in cache[key]:
                out[name].append(i)
    return out


def op_histogram(graph):
    hist = {}

    def walk(nl, mult):
        for n in nl:
            if n["op"] == "repeat":
                hist["repeat"] = hist.get("repeat", 0) + 1
                for b in repeat_bodies(n):
                    walk(b["body"], mult)
            else:
                hist[n["op"]] = hist.get(n["op"], 0) + 1
    walk(graph["nodes"], 1)
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def count_nodes(graph):
    total = 0
    for n in graph["nodes"]:
        total += 1
        if n["op"] == "repeat":
            total += sum(len(b["body"]) for b in repeat_bodies(n))
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
                if ("bodies" in n) != ("kind" in n) or ("bodies" in n) == ("body" in n):
                    raise CaptureError("repeat needs 'body' and 'yield', or 'kind' and 'bodies'")
                for b in repeat_bodies(n):
                    inner = set(n["carry"])
                    check(b["body"], inner)
                    for c in n["carry"]:
                        if c not in b["yield"]:
                            raise CaptureError("repeat body %s yields no %s" % (b.get("key"), c))
                    for c, v in b["yield"].items():
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
    "reshape", "permute", "expand", "slice", "concat", "cast", "select_rows", "attention", "short_conv",
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
        if n["op"] == "repeat" and "bodies" in n:
            head = {k: v for k, v in n.items() if k not in ("bodies", "out")}
            parts = []
            for key, b in n["bodies"].items():
                body = ",\n".join("          " + j(x) for x in b["body"])
                rest = {k: v for k, v in b.items() if k not in ("body", "yield")}
                parts.append("        %s: " % j(key) + j(rest)[:-1] + ', "body": [\n' + body + "\n        ],\n"
                             + '          "yield": %s}' % j(b["yield"]))
            out.append("    " + j(head)[:-1] + ', "bodies": {\n' + ",\n".join(parts) + "\n      },\n      "
                       + '"out": %s}' % j(n["out"]))
        elif n["op"] == "repeat":
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
