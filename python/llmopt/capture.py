"""Capture a Hugging Face causal LM into a graph file and a parameter map.

    python3 -m llmopt.capture --hf-arch llama -o programs/llama
    python3 -m llmopt.capture --hf-arch all -o programs          (every architecture)

Builds the model from *probe* hyper-parameters (random weights, nothing downloaded),
routes attention through llmopt::attention, exports the token-batch forward with
torch.export (N and M dynamic), converts the ATen graph to canonical ops with every
size symbolic, folds the decoder layers into one `repeat`, and checks the result three
ways: exported program vs eager, eager llmopt attention vs the model's own attention,
and the pure-Python interpreter of the written graph vs eager.
"""

import argparse
import json
import math
import os
import re
import sys
import time

from . import ir
from .archs import ARCHS, names_from_arg, run_each
from .expr import Symbolizer


def init_random(model, seed):
    """Weights with unit-scale activations (embeddings N(0,1), projections
    N(0, 1/fan_in), norm gains 1 + 0.1 N(0,1), biases 0.2 N(0,1)), so logits are well
    separated."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb = set()
        for mod in model.modules():
            if isinstance(mod, torch.nn.Embedding):
                emb.add(id(mod.weight))
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if id(p) in emb:
                p.copy_(r)
            elif p.dim() == 1 and name.endswith(".bias"):
                p.copy_(0.2 * r)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * r)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))


def find_layer_list(root):
    """The nn.ModuleList of identical decoder layers (the largest such list)."""
    import torch
    best = None
    for name, m in root.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            size = sum(p.numel() for p in m.parameters())
            if best is None or size > best[2]:
                best = (name, m, size)
    if best is None:
        raise ir.CaptureError("no nn.ModuleList of identical layers in the model")
    return best[0], best[1]


def example_batch(vocab, seed=7):
    """Two sequences in one token batch (slots 1 and 0), positions restarting at 0."""
    import torch
    g = torch.Generator().manual_seed(seed)
    la, lb = 6, 7  # N=13 and M=4 are no probe values
    tokens = torch.randint(0, vocab, (la + lb,), generator=g, dtype=torch.int64)
    positions = torch.tensor(list(range(la)) + list(range(lb)), dtype=torch.int64)
    seq_slots = torch.tensor([1] * la + [0] * lb, dtype=torch.int64)
    out_rows = torch.tensor([la - 1, la + lb - 1, 2, 7], dtype=torch.int64)
    return tokens, positions, seq_slots, out_rows


def eager_reference(model, tokens, positions, seq_slots, out_rows):
    """Logits rows [M, vocab] with the model's own attention, one sequence at a time."""
    import torch
    rows = {}
    with torch.no_grad():
        for s in sorted(set(seq_slots.tolist())):
            idx = [i for i in range(len(tokens)) if int(seq_slots[i]) == s]
            order = sorted(idx, key=lambda i: int(positions[i]))
            ids = tokens[order].unsqueeze(0)
            pos = positions[order].unsqueeze(0)
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
            for j, i in enumerate(order):
                rows[i] = logits[j]
    return torch.stack([rows[int(r)] for r in out_rows])


def max_rel(a, b):
    d = (a.double() - b.double()).abs().max().item()
    return d, d / max(b.double().abs().max().item(), 1e-30)


def export_program(wrapper, inputs, log):
    import torch
    Dim = torch.export.Dim
    N = Dim("N", min=1, max=1 << 16)
    M = Dim("M", min=1, max=1 << 16)
    dyn = ({0: N}, {0: N}, {0: N}, {0: M})
    with torch.no_grad():
        try:
            return torch.export.export(wrapper, inputs, dynamic_shapes=dyn, strict=False)
        except Exception as e:
            log("export with Dim(min=1) failed: %s: %s" % (type(e).__name__, str(e)[:2000]))
            log("retrying with Dim.DYNAMIC")
            dyn = ({0: Dim.DYNAMIC}, {0: Dim.DYNAMIC}, {0: Dim.DYNAMIC}, {0: Dim.DYNAMIC})
            return torch.export.export(wrapper, inputs, dynamic_shapes=dyn, strict=False)


def dump_export(ep, path):
    with open(path, "w") as f:
        f.write(str(ep.graph_signature) + "\n\n")
        for n in ep.graph.nodes:
            stack = n.meta.get("nn_module_stack")
            last = list(stack.values())[-1] if stack else None
            val = n.meta.get("val")
            shape = tuple(val.shape) if hasattr(val, "shape") else val
            f.write("%-28s %-14s %-45s %s  | %s\n" % (n.name, n.op, str(n.target)[:45], shape, last))
        f.write("\n" + str(ep.graph_module.code) + "\n")


def capture(arch_name, out_dir, log=print, debug_dir=None, seed=0, command=None):
    import torch
    import transformers
    from . import ops
    from .ref_interp import Program, bind_dict
    from .convert import Converter

    arch = ARCHS[arch_name]
    hp = dict(arch.probe)
    hp.update(arch.layer_hparams(hp))
    kinds = arch.layer_kinds(hp)
    sym = Symbolizer(hp, arch.dim_exprs, arch.float_exprs)
    torch.manual_seed(seed)
    model = arch.build(hp)
    init_random(model, seed + 1)
    wrapper = ops.TokenBatchLM(model).eval()
    inputs = example_batch(hp["vocab"])
    tokens, positions, seq_slots, out_rows = inputs

    # 1. the model's own attention (and state modules) vs llmopt's ops' eager references
    def use_llmopt(on):
        ops.set_attn_implementation(model, ops.ATTN_IMPL_NAME if on else "eager")
        return ops.set_state_ops(model, arch.state_modules, on)

    use_llmopt(False)
    want = eager_reference(model, *inputs)
    n_state = use_llmopt(True)
    ops.CTX.calls = 0
    ops.CTX.conv_calls = 0
    with torch.no_grad():
        got = wrapper(*inputs)[0]
    problems = []
    n_calls, n_conv = ops.CTX.calls, ops.CTX.conv_calls
    log("llmopt attention ran %d times, llmopt state ops %d times (%d layers, %d state modules)" % (
        n_calls, n_conv, hp["n_layers"], n_state))
    if n_calls != hp["n_layers"] - n_state or n_conv != n_state:
        problems.append("llmopt attention ran %d times and state ops %d times for %d layers (%d with state): "
                        "the attention interface or a state module substitution was not used" % (
                            n_calls, n_conv, hp["n_layers"], n_state))
    d_op = max_rel(got, want)
    log("check eager llmopt ops vs model attention (2 sequences): max_abs=%.3g max_rel=%.3g" % d_op)
    if d_op[1] > 1e-4:
        problems.append("llmopt's ops disagree with the model's attention / state modules")

    # 2. export
    t0 = time.time()
    ep = export_program(wrapper, inputs, log)
    log("exported in %.1fs: %d fx nodes" % (time.time() - t0, len(ep.graph.nodes)))
    if debug_dir:
        dump_export(ep, os.path.join(debug_dir, "export_%s.txt" % arch_name))
    with torch.no_grad():
        got_ep = ep.module()(*inputs)[0]
    d_ep = max_rel(got_ep, want)
    log("check exported program vs model attention: max_abs=%.3g max_rel=%.3g" % d_ep)

    # 3. convert
    layers_fqn, layers = find_layer_list(wrapper)
    if len(layers) != hp["n_layers"]:
        raise ir.CaptureError("layer list %s has %d layers, probe n_layers=%d" % (layers_fqn, len(layers), hp["n_layers"]))
    conv = Converter(ep, sym, layers_fqn, type(layers[0]).__name__, len(layers), hp["rope_theta"],
                     param_prefix="hf.", log=log, root=wrapper)
    logits = conv.run()
    log("converted: %d canonical nodes; layers found by %s; %s" % (
        len(conv.b.nodes), conv.layer_method, "; ".join(sorted(set(conv.notes))) or "no notes"))
    nodes = ir.dce(conv.b.nodes, [logits.ref])
    nodes, outs = ir.fold_reshape_chains(nodes, [logits.ref])
    if debug_dir:
        with open(os.path.join(debug_dir, "ir_%s.txt" % arch_name), "w") as f:
            for n in nodes:
                f.write("%-6s L%-4s %-12s %-60s %-40s %s  <- %s\n" % (
                    n.id, n.layer, n.op, n.ins, n.shape, json.dumps(n.attrs), n.src))
    layer_prefix = layers_fqn[len("hf."):] if layers_fqn.startswith("hf.") else layers_fqn
    pre, rep, post = ir.extract_repeat(nodes, outs, len(layers), layer_prefix, kinds)
    params = []
    seen = set()
    for name in conv.b.param_order:
        dtype, shape = conv.b.params[name]
        m = re.match(r"%s\.(\d+)\.(.*)$" % re.escape(layer_prefix), name)
        if m:
            name = "%s.{i}.%s" % (layer_prefix, m.group(2))
            if name in seen:
                continue
        seen.add(name)
        params.append({"name": name, "dtype": dtype, "shape": shape})
    source = {
        "module": arch.module,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "export": "torch.export.export(strict=False), ATen pre-dispatch IR, converted by llmopt.convert",
        "command": command or "python3 -m llmopt.capture --hf-arch %s -o <dir>" % arch_name,
        "probe": hp,
    }
    graph = ir.to_graph(arch.name, source, arch.hparams, conv.inputs, params, pre, rep, post, outs,
                        layer_hparams=sorted(arch.layer_hparams(hp)) or None, kind_expr=arch.kind_hparam,
                        kind_names=arch.kind_names)
    ir.validate(graph, ir.CANONICAL_OPS)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "graph.json"), "w") as f:
        f.write(ir.dumps_graph(graph))
    with open(os.path.join(out_dir, "map.json"), "w") as f:
        f.write(json.dumps(arch.param_map, indent=2) + "\n")
    hist = ir.op_histogram(graph)
    log("graph: %d nodes (%d top level), ops: %s" % (ir.count_nodes(graph), len(graph["nodes"]), json.dumps(hist)))

    # 4. the written graph, interpreted, vs eager (different N and M too)
    sd = {k[len("hf."):]: v for k, v in wrapper.state_dict().items() if k.startswith("hf.")}
    tensors = {k: (list(v.shape), v.detach().float().reshape(-1).tolist()) for k, v in sd.items()}
    hps, bound = bind_dict(graph, hp, tensors)
    prog = Program(graph, hps, bound)
    got_i = prog.forward(tokens.tolist(), positions.tolist(), seq_slots.tolist(), out_rows.tolist())
    d_int = max_rel(torch.tensor(got_i.data).reshape(want.shape), want)
    log("check ref_interp(graph.json) vs model attention (N=%d, M=%d): max_abs=%.3g max_rel=%.3g" % (
        len(tokens), len(out_rows), *d_int))
    one = tuple(t[:4] for t in inputs[:3]) + (torch.tensor([3, 0], dtype=torch.int64),)
    use_llmopt(False)
    want1 = eager_reference(model, *one)
    prog.reset()
    got1 = prog.forward(*[t.tolist() for t in one])
    d_int1 = max_rel(torch.tensor(got1.data).reshape(want1.shape), want1)
    log("check ref_interp(graph.json) vs model attention (N=4, M=2): max_abs=%.3g max_rel=%.3g" % d_int1)
    worst = max(d_ep[1], d_int[1], d_int1[1])
    if worst > 1e-4:
        problems.append("captured graph disagrees with eager torch (max_rel %.3g)" % worst)
    try:
        check_map(graph, arch.param_map)
    except ir.CaptureError as e:
        problems.append("map: %s" % e)
    if problems:
        raise ir.CaptureError("; ".join(problems))
    return graph, {"eager_op": d_op, "export": d_ep, "interp": d_int, "interp_n4": d_int1}


def check_map(graph, pmap):
    """Every graph param and hparam has a binding in each section of the map (gguf,
    safetensors), and no section binds a param the graph does not use."""
    for section in ("gguf", "safetensors"):
        spec = pmap.get(section)
        if spec is None:
            raise ir.CaptureError("map has no %r section" % section)
        gp = {p["name"] for p in graph["params"]}
        mp = set(spec["params"])
        if gp - mp:
            raise ir.CaptureError("params without a %s binding: %s" % (section, sorted(gp - mp)))
        if mp - gp:
            raise ir.CaptureError("%s map binds params the graph does not use: %s" % (section, sorted(mp - gp)))
        gh = set(graph["hparams"]) | set(graph.get("layer_hparams", []))
        mh = set(spec["hparams"])
        if gh - mh:
            raise ir.CaptureError("hparams without a %s binding: %s" % (section, sorted(gh - mh)))
        if "max_positions" not in mh:
            raise ir.CaptureError("%s map has no max_positions rule" % section)


def main(argv=None):
    ap = argparse.ArgumentParser(description="capture a Hugging Face model into an llmopt graph file")
    ap.add_argument("--hf-arch", required=True,
                    help="architecture to capture (%s), a comma-separated list of them, or all; with a "
                         "list or all, -o is the parent folder (DIR/<arch>/)" % ", ".join(sorted(ARCHS)))
    ap.add_argument("-o", "--out", required=True, help="output folder (graph.json, map.json)")
    ap.add_argument("--debug-dir", help="write the raw exported graph and the capture IR here")
    args = ap.parse_args(argv)
    names = names_from_arg(ap, args.hf_arch)
    several = args.hf_arch == "all" or "," in args.hf_arch

    def one(name):
        out = os.path.join(args.out, name) if several else args.out
        cmd = "python3 -m llmopt.capture --hf-arch %s -o programs/%s" % (name, name)
        capture(name, out, debug_dir=args.debug_dir, command=cmd)

    return run_each("capture", names, one)


if __name__ == "__main__":
    sys.exit(main())
