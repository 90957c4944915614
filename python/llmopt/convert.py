"""torch.export program (ATen, pre-dispatch) -> canonical capture IR (llmopt.ir).

Generic: nothing here knows an architecture. Concrete sizes become expressions through
the probe Symbolizer, the dynamic dims become N and M, float constants become hparam
expressions, the rotary inv_freq buffer becomes `rope_freqs`, and every node is tagged
with the decoder layer it belongs to (from node.meta["nn_module_stack"]).
"""

import math
import operator
import re

import torch

from .ir import Builder, CaptureError

INPUT_NAMES = ["tokens", "positions", "seq_slots", "out_rows"]

DTYPES = {torch.float32: "f32", torch.int64: "i32", torch.int32: "i32"}

UNARY = {
    "aten::neg": "neg", "aten::exp": "exp", "aten::sqrt": "sqrt", "aten::rsqrt": "rsqrt",
    "aten::reciprocal": "recip", "aten::silu": "silu", "aten::sigmoid": "sigmoid",
    "aten::tanh": "tanh", "aten::relu": "relu", "aten::cos": "cos", "aten::sin": "sin",
}
BINARY = {
    "aten::add": "add", "aten::sub": "sub", "aten::mul": "mul", "aten::div": "div",
    "aten::pow": "pow", "aten::maximum": "maximum", "aten::minimum": "minimum",
}
RESHAPES = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::unsqueeze", "aten::squeeze",
    "aten::flatten", "aten::unflatten", "aten::view_as", "aten::reshape_as",
}
IDENTITY = {
    "aten::clone", "aten::contiguous", "aten::alias", "aten::detach", "aten::lift_fresh_copy",
    "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::lift_fresh",
}
CASTS = {"aten::to", "aten::_to_copy", "aten::type_as", "aten::_autocast_to_reduced_precision",
         "aten::_autocast_to_full_precision"}
BIG = 2 ** 62


class TV:
    """A tensor value during conversion: IR reference, dtype and symbolic shape."""
    __slots__ = ("ref", "dtype", "shape", "cshape")

    def __init__(self, ref, dtype, shape, cshape=None):
        self.ref = ref
        self.dtype = dtype
        self.shape = list(shape)
        self.cshape = cshape

    def __repr__(self):
        return "TV(%r %s %r)" % (self.ref, self.dtype, self.shape)


def norm_module_path(p):
    p = str(p)
    p = re.sub(r"^L\['self'\]", "", p)
    p = re.sub(r"^self(?=\.|$)", "", p)
    p = re.sub(r"\._modules\['([^']+)'\]", r".\1", p)
    p = re.sub(r"\['([^']+)'\]", r".\1", p)
    p = re.sub(r"\[(\d+)\]", r".\1", p)
    # iterating `layers[:n]` (an index-preserving slice) records the slice in the path
    p = re.sub(r"\.slice\(None, *[^,()]*, *None\)", "", p)
    return p.strip(".")


class Converter:
    def __init__(self, ep, sym, layers_fqn, layer_cls_name, n_layers, rope_theta,
                 param_prefix="hf.", log=print, root=None):
        self.ep = ep
        self.root = root
        self.sym = sym
        self.layers_fqn = norm_module_path(layers_fqn)
        self.layer_cls_name = layer_cls_name
        self.n_layers = n_layers
        self.rope_theta = rope_theta
        self.param_prefix = param_prefix
        self.log = log
        self.b = Builder()
        self.dyn = {}            # sympy symbol name -> "N" / "M"
        self.cur_layer = None
        self.cur_src = ""
        self.layer_method = None
        self._cls_layer_keys = {}
        self.unsupported = {}
        self.notes = []

    # ------------------------------------------------------------------ symbols
    def sdim(self, d, what="dimension"):
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            if getattr(expr, "is_number", False):
                return self.sym.dim(int(expr), what)
            text = str(expr)
            names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
            for n in names:
                if n not in self.dyn:
                    raise CaptureError("symbolic size %s uses %s, which is neither N nor M" % (text, n))
            out = re.sub(r"[A-Za-z_][A-Za-z_0-9]*", lambda m: self.dyn[m.group(0)], text)
            if not re.fullmatch(r"[0-9NM*+\-/() ]+", out):
                raise CaptureError("symbolic size %s is not an expression the graph file can hold" % text)
            return out.replace(" ", "")
        return self.sym.dim(int(d), what)

    def sshape(self, shape):
        return [self.sdim(d) for d in shape]

    def meta_val(self, node):
        v = node.meta.get("val")
        if v is None:
            v = node.meta.get("example_value")
        return v

    def dtype_of(self, t, node=None):
        dt = DTYPES.get(t.dtype)
        if dt is None:
            raise CaptureError("%s: dtype %s is not supported (f32, i32/i64 only)" % (
                node.format_node() if node is not None else "value", t.dtype))
        return dt

    # ------------------------------------------------------------------ layers
    def layer_of(self, node):
        stack = node.meta.get("nn_module_stack") or {}
        pat = re.compile(r"^%s\.(\d+)(\.|$)" % re.escape(self.layers_fqn))
        for key, v in stack.items():
            path = v[0] if isinstance(v, (tuple, list)) else v
            m = pat.match(norm_module_path(path))
            if m:
                self.layer_method = self.layer_method or "nn_module_stack path"
                return int(m.group(1))
        # fallback: the outermost entry of the decoder-layer class, numbered by first use
        for key, v in stack.items():
            cls = v[1] if isinstance(v, (tuple, list)) and len(v) > 1 else None
            cname = getattr(cls, "__name__", None) or str(cls)
            if self.layer_cls_name and cname and re.search(r"\b%s\b" % re.escape(self.layer_cls_name), cname):
                path = v[0] if isinstance(v, (tuple, list)) else v
                k = (key, str(path))
                if k not in self._cls_layer_keys:
                    self._cls_layer_keys[k] = len(self._cls_layer_keys)
                self.layer_method = "nn_module_stack class order"
                return self._cls_layer_keys[k]
        return None

    # ------------------------------------------------------------------ emission
    def emit(self, op, ins, attrs, dtype, shape, cshape=None):
        ref = self.b.add(op, [i.ref for i in ins], attrs, dtype, shape, self.cur_layer, self.cur_src)
        return TV(ref, dtype, shape, cshape)

    def emit_like(self, op, ins, attrs, node):
        v = self.meta_val(node)
        if not isinstance(v, torch.Tensor):
            raise CaptureError("%s: no tensor metadata" % node.format_node())
        return self.emit(op, ins, attrs, self.dtype_of(v, node), self.sshape(v.shape), tuple(v.shape))

    def const(self, value):
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, torch.SymInt):
            value = self.sdim(value, "scalar")
        elif isinstance(value, int):
            value = self.sym.int_or_literal(value)
        elif isinstance(value, float):
            if math.isinf(value) or math.isnan(value):
                raise CaptureError("constant %r cannot be written to the graph file" % value)
            value = self.sym.float_value(value)
        else:
            raise CaptureError("constant %r of type %s" % (value, type(value).__name__))
        return self.emit("const", [], {"value": value}, "f32", [])

    def tensor(self, x):
        """Operand as a tensor value (python scalars become const nodes)."""
        if isinstance(x, TV):
            return x
        if isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat)):
            if isinstance(x, torch.SymFloat):
                raise CaptureError("symbolic float scalar operand")
            return self.const(x)
        if isinstance(x, torch.Tensor):
            if x.numel() == 1:
                return self.const(x.item())
            raise CaptureError("tensor constant of shape %s used as an operand" % (tuple(x.shape),))
        raise CaptureError("operand %r is not a tensor" % (x,))

    def cast_to(self, t, dtype):
        if t.dtype == dtype:
            return t
        return self.emit("cast", [t], {"dtype": dtype}, dtype, t.shape, t.cshape)

    # ------------------------------------------------------------------ driver
    def run(self):
        ep = self.ep
        gm = ep.graph_module
        sig = ep.graph_signature
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        user_inputs = [n for n in placeholders if specs[n.name].kind == torch.export.graph_signature.InputKind.USER_INPUT]
        if len(user_inputs) != 4:
            raise CaptureError("expected 4 user inputs, found %d" % len(user_inputs))
        tok = self.meta_val(user_inputs[0])
        rows = self.meta_val(user_inputs[3])
        for t, name in ((tok, "N"), (rows, "M")):
            d = t.shape[0]
            if not isinstance(d, torch.SymInt) or getattr(d.node.expr, "is_number", False):
                raise CaptureError("the %s dimension was specialized to %s by export" % (name, d))
            self.dyn[str(d.node.expr)] = name
        for n in user_inputs[1:3]:
            d = self.meta_val(n).shape[0]
            if str(getattr(getattr(d, "node", None), "expr", d)) not in self.dyn or self.dyn[str(d.node.expr)] != "N":
                raise CaptureError("input %s is not [N] (shape %s)" % (n.name, d))
        self.inputs = []
        for name, n in zip(INPUT_NAMES, user_inputs):
            t = self.meta_val(n)
            self.inputs.append({"name": name, "dtype": self.dtype_of(t, n), "shape": self.sshape(t.shape)})
        env = {}
        live = self.liveness(gm.graph)
        for n, spec in ((n, specs[n.name]) for n in placeholders):
            kind = spec.kind
            IK = torch.export.graph_signature.InputKind
            if n not in live:
                continue
            if kind == IK.USER_INPUT:
                i = user_inputs.index(n)
                d = self.inputs[i]
                env[n] = TV(("input", d["name"]), "i32", d["shape"], tuple(self.meta_val(n).shape))
            elif kind == IK.PARAMETER:
                name = spec.target
                if name.startswith(self.param_prefix):
                    name = name[len(self.param_prefix):]
                t = self.meta_val(n)
                shape = self.sshape(t.shape)
                ref = self.b.param(name, self.dtype_of(t, n), shape)
                env[n] = TV(ref, self.dtype_of(t, n), shape, tuple(t.shape))
            elif kind in (IK.BUFFER, IK.CONSTANT_TENSOR):
                env[n] = self.constant_tensor(spec.target, self.lookup_constant(spec.target))
            else:
                raise CaptureError("input %s of kind %s is not supported" % (n.name, kind))
        out = self.convert_graph(gm, gm.graph, env, live)
        user_outs = [i for i, s in enumerate(sig.output_specs)
                     if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
        if len(user_outs) != 1:
            raise CaptureError("expected one user output (logits), found %d" % len(user_outs))
        logits = out[user_outs[0]]
        if not isinstance(logits, TV):
            raise CaptureError("output is not a tensor")
        if self.unsupported:
            lines = ["  %s  (x%d, e.g. %s)" % (k, c, e) for k, (c, e) in sorted(self.unsupported.items())]
            raise CaptureError("ops outside the canonical set:\n" + "\n".join(lines))
        return logits

    def lookup_constant(self, target):
        ep = self.ep
        for d in (getattr(ep, "constants", {}), ep.state_dict):
            if target in d:
                return d[target]
        if self.root is not None:
            try:
                return self.root.get_buffer(target)
            except AttributeError:
                pass
        raise CaptureError("constant %s not found in the exported program" % target)

    def constant_tensor(self, name, t):
        """A buffer or lifted constant: the rotary inv_freq (-> rope_freqs) or a scalar."""
        t = t.detach().to("cpu")
        if t.numel() == 1:
            return t  # inlined as a const where used
        if t.dim() == 1 and t.is_floating_point():
            L = t.numel()
            dim = 2 * L
            theta = float(self.rope_theta)
            want = torch.tensor([theta ** (-2.0 * j / dim) for j in range(L)], dtype=torch.float64)
            got = t.double()
            err = ((got - want).abs() / want.abs()).max().item()
            if err < 1e-5:
                prev = self.cur_layer
                self.cur_layer = None
                self.cur_src = name
                v = self.emit("rope_freqs", [], {"dim": self.sym.dim(dim), "theta": "rope_theta"}, "f32",
                              [self.sym.dim(L)], (L,))
                self.cur_layer = prev
                return v
            raise CaptureError(
                "buffer %s (%d values) is not theta^(-2j/dim) for theta=%s, dim=%d (max rel err %.3g): "
                "a scaled or non-default RoPE needs its own op or a capture change" % (name, L, theta, dim, err))
        raise CaptureError("tensor constant %s of shape %s cannot be expressed in the graph file" % (
            name, tuple(t.shape)))

    def liveness(self, graph):
        out = [n for n in graph.nodes if n.op == "output"]
        live = set()
        stack = list(out)
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            for a in n.all_input_nodes:
                stack.append(a)
        return live

    def convert_graph(self, gm, graph, env, live):
        result = None
        for n in graph.nodes:
            if n.op == "placeholder":
                continue
            if n not in live:
                continue
            if n.op == "output":
                result = self.resolve(n.args[0], env)
                break
            if n.op == "get_attr":
                env[n] = _get_attr(gm, n.target)
                continue
            if n.op != "call_function":
                raise CaptureError("unsupported fx node %s (%s)" % (n.format_node(), n.op))
            layer = self.layer_of(n)
            prev = (self.cur_layer, self.cur_src)
            if layer is not None or self.cur_layer is None:
                self.cur_layer = layer
            self.cur_src = n.name
            try:
                env[n] = self.call(gm, n, env)
            finally:
                self.cur_layer, self.cur_src = prev
        return result

    def resolve(self, a, env):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.resolve(x, env) for x in a)
        if isinstance(a, dict):
            return {k: self.resolve(v, env) for k, v in a.items()}
        return a

    # ------------------------------------------------------------------ ops
    def call(self, gm, n, env):
        tgt = n.target
        if tgt is operator.getitem:
            seq = self.resolve(n.args[0], env)
            return seq[n.args[1]]
        if isinstance(tgt, torch._ops.HigherOrderOperator):
            return self.inline_hop(gm, n, env)
        if not isinstance(tgt, torch._ops.OpOverload):
            v = self.meta_val(n)
            if isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
                return v
            raise CaptureError("unsupported call %s" % n.format_node())
        name = tgt._schema.name
        ovl = tgt._overloadname
        v = self.meta_val(n)
        if isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            return v  # sym_size, sym_numel and other size arithmetic: the value itself
        args = self.resolve(n.args, env)
        kwargs = self.resolve(n.kwargs, env)
        fn = getattr(self, "op_" + name.replace("::", "_"), None)
        if fn is not None:
            return fn(n, args, kwargs)
        if name in UNARY:
            return self.emit_like(UNARY[name], [self.tensor(args[0])], {}, n)
        if name == "aten::gelu":
            approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            return self.emit_like("gelu_tanh" if approx == "tanh" else "gelu", [self.tensor(args[0])], {}, n)
        if name in BINARY:
            return self.binary(n, BINARY[name], args, kwargs)
        if name == "aten::rsub":
            return self.binary(n, "sub", [args[1], args[0]] + list(args[2:]), kwargs)
        if name in RESHAPES:
            return self.reshape(n, self.tensor(args[0]))
        if name in IDENTITY:
            return self.tensor(args[0])
        if name in CASTS:
            x = self.tensor(args[0])
            return self.cast_to(x, self.dtype_of(v, n))
        key = "%s.%s" % (name, ovl)
        c, e = self.unsupported.get(key, (0, n.format_node()))
        self.unsupported[key] = (c + 1, e)
        # keep going to list every unsupported op at once: a placeholder value
        if isinstance(v, torch.Tensor):
            return TV(("input", "?unsupported"), DTYPES.get(v.dtype, "f32"), ["?"] * v.dim(), tuple(v.shape))
        return None

    def inline_hop(self, gm, n, env):
        args = list(n.args)
        sub_i = None
        for i, a in enumerate(args):
            if isinstance(a, torch.fx.Node) and a.op == "get_attr" and isinstance(_get_attr(gm, a.target), torch.fx.GraphModule):
                sub_i = i
                break
        if sub_i is None:
            raise CaptureError("higher-order op %s without a subgraph" % n.format_node())
        sub = _get_attr(gm, args[sub_i].target)
        operands = [self.resolve(a, env) for a in args[sub_i + 1:]]
        phs = [p for p in sub.graph.nodes if p.op == "placeholder"]
        if len(phs) != len(operands):
            raise CaptureError("higher-order op %s: %d operands for %d placeholders" % (n.name, len(operands), len(phs)))
        self.notes.append("inlined %s" % getattr(n.target, "__name__", n.target))
        sub_env = dict(zip(phs, operands))
        return self.convert_graph(sub, sub.graph, sub_env, self.liveness(sub.graph))

    def binary(self, n, op, args, kwargs):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if kwargs.get("rounding_mode") is not None:
            raise CaptureError("%s: rounding division is not canonical" % n.format_node())
        v = self.meta_val(n)
        out_dtype = self.dtype_of(v, n)
        # x * 1, x + 0: no node
        if isinstance(b, (int, float)) and isinstance(a, TV) and alpha == 1 and a.dtype == out_dtype:
            if (op in ("mul", "div") and b == 1) or (op in ("add", "sub") and b == 0) or (op == "pow" and b == 1):
                return a
        if isinstance(a, (int, float)) and isinstance(b, TV) and alpha == 1 and b.dtype == out_dtype:
            if (op == "mul" and a == 1) or (op == "add" and a == 0):
                return b
        ta = self.tensor(a)
        tb = self.tensor(b)
        if alpha != 1:
            tb = self.emit("mul", [tb, self.const(alpha)], {}, tb.dtype, tb.shape, tb.cshape)
        ta = self.cast_to(ta, out_dtype) if isinstance(a, TV) else ta
        tb = self.cast_to(tb, out_dtype) if isinstance(b, TV) else tb
        return self.emit_like(op, [ta, tb], {}, n)

    def reshape(self, n, x):
        v = self.meta_val(n)
        shape = self.sshape(v.shape)
        if shape == x.shape:
            return x
        return self.emit("reshape", [x], {"shape": shape}, x.dtype, shape, tuple(v.shape))

    def op_aten_linear(self, n, a, k):
        ins = [self.tensor(a[0]), self.tensor(a[1])]
        bias = a[2] if len(a) > 2 else k.get("bias")
        if bias is not None:
            ins.append(self.tensor(bias))
        return self.emit_like("linear", ins, {}, n)

    def op_aten_matmul(self, n, a, k):
        x, y = self.tensor(a[0]), self.tensor(a[1])
        if len(x.shape) < 2 or len(y.shape) < 2:
            raise CaptureError("%s: matmul of vectors" % n.format_node())
        return self.emit_like("matmul", [x, y], {}, n)

    op_aten_mm = op_aten_matmul
    op_aten_bmm = op_aten_matmul

    def op_aten_embedding(self, n, a, k):
        return self.emit_like("embedding", [self.tensor(a[0]), self.tensor(a[1])], {}, n)

    def _reduce(self, n, a, k, op):
        x = self.tensor(a[0])
        dims = a[1] if len(a) > 1 else k.get("dim")
        keep = a[2] if len(a) > 2 else k.get("keepdim", False)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(len(x.shape)))
        if isinstance(dims, int):
            dims = [dims]
        if k.get("dtype") is not None and k.get("dtype") != torch.float32:
            raise CaptureError("%s: reduction dtype" % n.format_node())
        return self.emit_like(op, [x], {"dims": [int(d) for d in dims], "keepdim": 1 if keep else 0}, n)

    def op_aten_mean(self, n, a, k):
        return self._reduce(n, a, k, "mean")

    def op_aten_sum(self, n, a, k):
        return self._reduce(n, a, k, "sum")

    def op_aten_amax(self, n, a, k):
        return self._reduce(n, a, k, "max")

    def op_aten_softmax(self, n, a, k):
        return self.emit_like("softmax", [self.tensor(a[0])], {"dim": int(a[1] if len(a) > 1 else k["dim"])}, n)

    op_aten__softmax = op_aten_softmax

    def _permute(self, n, x, perm):
        nd = len(x.shape)
        perm = [int(p) % nd for p in perm]
        if perm == list(range(nd)):
            return x
        return self.emit_like("permute", [x], {"perm": perm}, n)

    def op_aten_transpose(self, n, a, k):
        x = self.tensor(a[0])
        nd = len(x.shape)
        d0, d1 = int(a[1]) % nd, int(a[2]) % nd
        perm = list(range(nd))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self._permute(n, x, perm)

    op_aten_swapaxes = op_aten_transpose

    def op_aten_permute(self, n, a, k):
        return self._permute(n, self.tensor(a[0]), a[1])

    def op_aten_t(self, n, a, k):
        x = self.tensor(a[0])
        return self._permute(n, x, [1, 0] if len(x.shape) == 2 else [0])

    def op_aten_expand(self, n, a, k):
        x = self.tensor(a[0])
        v = self.meta_val(n)
        shape = self.sshape(v.shape)
        if shape == x.shape:
            return x
        return self.emit("expand", [x], {"shape": shape}, x.dtype, shape, tuple(v.shape))

    op_aten_expand_as = op_aten_expand

    def _bound(self, b, size):
        """A slice bound as an expression, given the (concrete or symbolic) dim size."""
        if isinstance(b, torch.SymInt):
            return self.sdim(b, "slice bound")
        b = int(b)
        if b < 0:
            if isinstance(size, torch.SymInt):
                raise CaptureError("negative slice bound %d on a symbolic dimension" % b)
            b = max(0, b + int(size))
        if not isinstance(size, torch.SymInt) and b >= int(size):
            return self.sdim(size)
        if isinstance(size, torch.SymInt) and b >= BIG:
            return self.sdim(size)
        if b in (0, 1, 2):
            return b
        return self.sdim(b, "slice bound")

    def op_aten_slice(self, n, a, k):
        x = self.tensor(a[0])
        dim = int(a[1] if len(a) > 1 else k.get("dim", 0))
        start = a[2] if len(a) > 2 else k.get("start")
        end = a[3] if len(a) > 3 else k.get("end")
        step = a[4] if len(a) > 4 else k.get("step", 1)
        size = x.cshape[dim] if x.cshape is not None else None
        if size is None:
            raise CaptureError("%s: slice of a value without a known shape" % n.format_node())
        s = self._bound(0 if start is None else start, size)
        e = self.sdim(size) if end is None else self._bound(end, size)
        step = int(step)
        if s in (0, "0") and e == self.sdim(size) and step == 1:
            return x
        return self.emit_like("slice", [x], {"dim": dim, "start": s, "end": e, "step": step}, n)

    def op_aten_select(self, n, a, k):
        x = self.tensor(a[0])
        nd = len(x.shape)
        dim = int(a[1]) % nd
        idx = a[2]
        size = x.cshape[dim]
        if isinstance(idx, torch.SymInt):
            raise CaptureError("%s: select at a symbolic index" % n.format_node())
        idx = int(idx)
        if idx < 0:
            if isinstance(size, torch.SymInt):
                raise CaptureError("%s: negative select on a symbolic dimension" % n.format_node())
            idx += int(size)
        shape = list(x.shape)
        shape[dim] = "1"
        cs = list(x.cshape)
        cs[dim] = 1
        start = idx if idx in (0, 1, 2) else self.sdim(idx, "select index")
        end = idx + 1 if idx + 1 in (0, 1, 2) else self.sdim(idx + 1, "select index")
        sl = self.emit("slice", [x], {"dim": dim, "start": start, "end": end, "step": 1}, x.dtype, shape, tuple(cs))
        return self.reshape(n, sl)

    def op_aten_cat(self, n, a, k):
        ts = [self.tensor(t) for t in a[0]]
        dim = int(a[1] if len(a) > 1 else k.get("dim", 0))
        if len(ts) == 1:
            return ts[0]
        return self.emit_like("concat", ts, {"dim": dim}, n)

    op_aten_concat = op_aten_cat

    def op_aten_index(self, n, a, k):
        x = self.tensor(a[0])
        idx = list(a[1])
        nd = len(x.shape)
        real = [(i, t) for i, t in enumerate(idx) if t is not None]
        if len(real) != 1 or not isinstance(real[0][1], TV) or len(real[0][1].shape) != 1:
            raise CaptureError("%s: only indexing one dim with a 1-d index is canonical (select_rows)" % n.format_node())
        d, rows = real[0]
        if d != nd - 2:
            raise CaptureError("%s: indexing dim %d of %d; select_rows takes rows along dim -2" % (n.format_node(), d, nd))
        return self.emit_like("select_rows", [x, self.cast_to(rows, "i32")], {}, n)

    def op_aten_index_select(self, n, a, k):
        x = self.tensor(a[0])
        nd = len(x.shape)
        d = int(a[1]) % nd
        if d != nd - 2:
            raise CaptureError("%s: index_select on dim %d of %d; select_rows takes rows along dim -2" % (
                n.format_node(), d, nd))
        return self.emit_like("select_rows", [x, self.cast_to(self.tensor(a[2]), "i32")], {}, n)

    def op_aten_scalar_tensor(self, n, a, k):
        return self.const(a[0])

    def op_aten_full(self, n, a, k):
        v = self.meta_val(n)
        if v.dim() == 0:
            return self.const(a[1])
        raise CaptureError("%s: non-scalar full() is not canonical" % n.format_node())

    def op_llmopt_attention(self, n, a, k):
        q, kk, vv, pos, slots = [self.tensor(t) for t in a[:5]]
        scale = a[5] if len(a) > 5 else k["scale"]
        window = a[6] if len(a) > 6 else k.get("window", 0)
        sc = self.sym.float_value(float(scale))
        if not isinstance(sc, str):
            self.notes.append("attention scale %r is not an hparam expression" % scale)
        w = int(window)
        return self.emit_like("attention", [q, kk, vv, self.cast_to(pos, "i32"), self.cast_to(slots, "i32")],
                              {"scale": sc, "window": self.sym.int_or_literal(w) if w else 0}, n)


    def op_llmopt_short_conv(self, n, a, k):
        x, w, pos, slots = [self.tensor(t) for t in a[:4]]
        return self.emit_like("short_conv", [x, w, self.cast_to(pos, "i32"), self.cast_to(slots, "i32")], {}, n)


def _get_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
