"""LFM2 without torch: layers of two kinds in one `repeat` (extract_repeat with kinds,
the graph file's "bodies"), per-layer hparams from GGUF arrays and config.json lists,
the `short_conv` state op in the reference interpreter, the "reshape" map transform and
llamacpp.py's LFM2 layout, all checked against a plain-Python LFM2 forward.

    python3 -m unittest discover -s python/tests
"""

import json
import math
import os
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from llmopt import archs, ir, llamacpp, vocabs  # noqa: E402
from llmopt import ref_interp as RI  # noqa: E402
from capture_emulation import EmulatedCapture  # noqa: E402
from llmopt.gguf_writer import GGUFFile  # noqa: E402
from llmopt.safetensors_io import HFCheckpoint, write_bytes  # noqa: E402

KIND = {"conv": 0, "full_attention": 1}


def emulate_lfm2_capture(layer_types):
    """The canonical nodes capture emits for HF Lfm2ForCausalLM with llmopt's short_conv
    forward (ops.lfm2_short_conv_forward), layer-tagged."""
    e = EmulatedCapture()
    b, inp, h, add, P, rms, rope = e.b, e.inp, e.h, e.add, e.param, e.rms, e.rope
    D = ["1", "N", "d_model"]

    for i, kind in enumerate(layer_types):
        pre = "model.layers.%d." % i
        x = rms(h, P(pre + "operator_norm.weight", ["d_model"]), D, i)
        if kind == "conv":
            T = ["1", "N", "3*d_model"]
            bcx = add("linear", [x, P(pre + "conv.in_proj.weight", ["3*d_model", "d_model"])], {}, T, i)
            bb = add("slice", [bcx], {"dim": 2, "start": 0, "end": "d_model", "step": 1}, D, i)
            cc = add("slice", [bcx], {"dim": 2, "start": "d_model", "end": "2*d_model", "step": 1}, D, i)
            xx = add("slice", [bcx], {"dim": 2, "start": "2*d_model", "end": "3*d_model", "step": 1}, D, i)
            w = P(pre + "conv.conv.weight", ["d_model", "1", "conv_L"])
            bx = add("mul", [bb, xx], {}, D, i)
            y = add("short_conv", [bx, w, inp["positions"], inp["seq_slots"]], {}, D, i)
            o = add("linear", [add("mul", [cc, y], {}, D, i), P(pre + "conv.out_proj.weight", ["d_model", "d_model"])],
                    {}, D, i)
        else:
            heads = {}
            for nm, hh, dims in (("q", "n_heads", "d_model"), ("k", "n_kv_heads", "n_kv_heads*head_dim"),
                                 ("v", "n_kv_heads", "n_kv_heads*head_dim")):
                y = add("linear", [x, P(pre + "self_attn.%s_proj.weight" % nm, [dims, "d_model"])], {},
                        ["1", "N", dims], i)
                S = ["1", "N", hh, "head_dim"]
                y = add("reshape", [y], {"shape": S}, S, i)
                if nm != "v":
                    y = rms(y, P(pre + "self_attn.%s_layernorm.weight" % nm, ["head_dim"]), S, i)
                heads[nm] = add("permute", [y], {"perm": [0, 2, 1, 3]}, ["1", hh, "N", "head_dim"], i)
            q = rope(heads["q"], "n_heads", i)
            k = rope(heads["k"], "n_kv_heads", i)
            a = add("attention", [q, k, heads["v"], inp["positions"], inp["seq_slots"]],
                    {"scale": "head_dim^-0.5", "window": 0}, ["1", "N", "n_heads", "head_dim"], i)
            a = add("reshape", [a], {"shape": D}, D, i)
            o = add("linear", [a, P(pre + "self_attn.out_proj.weight", ["d_model", "d_model"])], {}, D, i)
        h = add("add", [o, h], {}, D, i)
        x = rms(h, P(pre + "ffn_norm.weight", ["d_model"]), D, i)
        FF = ["1", "N", "d_ff"]
        gt = add("linear", [x, P(pre + "feed_forward.w1.weight", ["d_ff", "d_model"])], {}, FF, i)
        up = add("linear", [x, P(pre + "feed_forward.w3.weight", ["d_ff", "d_model"])], {}, FF, i)
        mm = add("mul", [add("silu", [gt], {}, FF, i), up], {}, FF, i)
        dn = add("linear", [mm, P(pre + "feed_forward.w2.weight", ["d_model", "d_ff"])], {}, D, i)
        h = add("add", [h, dn], {}, D, i)
    x = rms(h, P("model.embedding_norm.weight", ["d_model"]), D, None)
    x = add("select_rows", [x, inp["out_rows"]], {}, ["1", "M", "d_model"])
    logits = add("linear", [x, P("lm_head.weight", ["vocab", "d_model"])], {}, ["1", "M", "vocab"])
    return b, logits


def build_graph(layer_types):
    b, logits = emulate_lfm2_capture(layer_types)
    nodes = ir.dce(b.nodes, [logits])
    nodes, outs = ir.fold_reshape_chains(nodes, [logits])
    kinds = [KIND[t] for t in layer_types]
    pre, rep, post = ir.extract_repeat(nodes, outs, len(layer_types), "model.layers", kinds)
    params, seen = [], set()
    for name in b.param_order:
        dtype, shape = b.params[name]
        if name.startswith("model.layers."):
            name = "model.layers.{i}." + name.split(".", 3)[3]
            if name in seen:
                continue
        seen.add(name)
        params.append({"name": name, "dtype": dtype, "shape": shape})
    inputs = [{"name": n, "dtype": "i32", "shape": ["M" if n == "out_rows" else "N"]}
              for n in ("tokens", "positions", "seq_slots", "out_rows")]
    g = ir.to_graph("lfm2", {"module": "test"}, archs.LFM2_HPARAMS, inputs, params, pre, rep, post, outs,
                    layer_hparams=["layer_kind"], kind_expr="layer_kind", kind_names=archs.LFM2_KIND_NAMES)
    ir.validate(g, ir.CANONICAL_OPS)
    return json.loads(ir.dumps_graph(g))


TINY = {"vocab": 272, "d_model": 16, "d_ff": 24, "n_heads": 4, "n_kv_heads": 2, "conv_L": 3, "rms_eps": 1e-5,
        "rope_theta": 10000.0, "layer_types": ["conv", "conv", "full_attention", "conv", "full_attention"]}


def hf_weights(hp, seed=3):
    rnd = random.Random(seed)
    D, F, V, L = hp["d_model"], hp["d_ff"], hp["vocab"], hp["conv_L"]
    Dh = D // hp["n_heads"]
    kd = hp["n_kv_heads"] * Dh

    def mat(*shape, s=None):
        s = s if s is not None else 1.0 / math.sqrt(shape[-1])
        n = 1
        for d in shape:
            n *= d
        return (list(shape), [rnd.gauss(0, s) for _ in range(n)])

    def vec(n):
        return ([n], [1.0 + 0.1 * rnd.gauss(0, 1) for _ in range(n)])

    w = {"model.embed_tokens.weight": mat(V, D, s=1.0), "model.embedding_norm.weight": vec(D)}
    for i, kind in enumerate(hp["layer_types"]):
        p = "model.layers.%d." % i
        w[p + "operator_norm.weight"] = vec(D)
        w[p + "ffn_norm.weight"] = vec(D)
        w[p + "feed_forward.w1.weight"] = mat(F, D)
        w[p + "feed_forward.w3.weight"] = mat(F, D)
        w[p + "feed_forward.w2.weight"] = mat(D, F)
        if kind == "conv":
            w[p + "conv.in_proj.weight"] = mat(3 * D, D)
            w[p + "conv.conv.weight"] = mat(D, 1, L, s=0.7)
            w[p + "conv.out_proj.weight"] = mat(D, D)
        else:
            w[p + "self_attn.q_proj.weight"] = mat(D, D)
            w[p + "self_attn.k_proj.weight"] = mat(kd, D)
            w[p + "self_attn.v_proj.weight"] = mat(kd, D)
            w[p + "self_attn.out_proj.weight"] = mat(D, D)
            w[p + "self_attn.q_layernorm.weight"] = vec(Dh)
            w[p + "self_attn.k_layernorm.weight"] = vec(Dh)
    return w


def naive_lfm2(hp, w, seq):
    """HF Lfm2ForCausalLM semantics (tied lm_head) for one sequence: logits per position."""
    H, Hk = hp["n_heads"], hp["n_kv_heads"]
    D = hp["d_model"]
    Dh, L = D // H, hp["conv_L"]

    def W(name):
        shape, data = w[name]
        return [data[r * shape[-1]:(r + 1) * shape[-1]] for r in range(len(data) // shape[-1])]

    def mv(m, x):
        return [sum(a * b for a, b in zip(row, x)) for row in m]

    def rms(x, g):
        s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + hp["rms_eps"])
        return [v * s * gg for v, gg in zip(x, g)]

    def rope(v, pos):
        out = list(v)
        half = Dh // 2
        for j in range(half):
            f = hp["rope_theta"] ** (-2.0 * j / Dh)
            c, s = math.cos(pos * f), math.sin(pos * f)
            out[j] = v[j] * c - v[j + half] * s
            out[j + half] = v[j + half] * c + v[j] * s
        return out

    hs = [list(W("model.embed_tokens.weight")[t]) for t in seq]
    T = len(seq)
    for i, kind in enumerate(hp["layer_types"]):
        p = "model.layers.%d." % i
        xs = [rms(x, w[p + "operator_norm.weight"][1]) for x in hs]
        if kind == "conv":
            bcx = [mv(W(p + "conv.in_proj.weight"), x) for x in xs]
            bx = [[a * b for a, b in zip(r[:D], r[2 * D:])] for r in bcx]
            k = W(p + "conv.conv.weight")  # [C, L] rows
            ys = []
            for t in range(T):
                y = [0.0] * D
                for j in range(L):
                    s = t - (L - 1) + j
                    if s >= 0:
                        for c in range(D):
                            y[c] += k[c][j] * bx[s][c]
                ys.append([cg * yy for cg, yy in zip(bcx[t][D:2 * D], y)])
            outs = [mv(W(p + "conv.out_proj.weight"), y) for y in ys]
        else:
            def heads(name, n, norm):
                out = []
                for x in xs:
                    v = mv(W(p + name), x)
                    hv = [v[h * Dh:(h + 1) * Dh] for h in range(n)]
                    if norm:
                        hv = [rms(r, w[p + norm][1]) for r in hv]
                    out.append(hv)
                return out
            Q = heads("self_attn.q_proj.weight", H, "self_attn.q_layernorm.weight")
            K = heads("self_attn.k_proj.weight", Hk, "self_attn.k_layernorm.weight")
            V = heads("self_attn.v_proj.weight", Hk, None)
            outs = []
            for t in range(T):
                row = []
                for h in range(H):
                    kh = h // (H // Hk)
                    q = rope(Q[t][h], t)
                    sc = [sum(a * b for a, b in zip(q, rope(K[s][kh], s))) / math.sqrt(Dh) for s in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(x - m) for x in sc]
                    z = sum(e)
                    row.extend(sum(e[s] / z * V[s][kh][d] for s in range(t + 1)) for d in range(Dh))
                outs.append(mv(W(p + "self_attn.out_proj.weight"), row))
        hs = [[a + b for a, b in zip(h_, o)] for h_, o in zip(hs, outs)]
        xs = [rms(x, w[p + "ffn_norm.weight"][1]) for x in hs]
        for t in range(T):
            g = mv(W(p + "feed_forward.w1.weight"), xs[t])
            u = mv(W(p + "feed_forward.w3.weight"), xs[t])
            d = mv(W(p + "feed_forward.w2.weight"), [gg / (1 + math.exp(-gg)) * uu for gg, uu in zip(g, u)])
            hs[t] = [a + b for a, b in zip(hs[t], d)]
    emb = W("model.embed_tokens.weight")
    return [mv(emb, rms(x, w["model.embedding_norm.weight"][1])) for x in hs]


def hf_config(hp):
    return {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": hp["vocab"],
            "hidden_size": hp["d_model"], "intermediate_size": hp["d_ff"], "block_auto_adjust_ff_dim": False,
            "num_hidden_layers": len(hp["layer_types"]), "num_attention_heads": hp["n_heads"],
            "num_key_value_heads": hp["n_kv_heads"], "norm_eps": hp["rms_eps"], "conv_L_cache": hp["conv_L"],
            "conv_bias": False, "layer_types": list(hp["layer_types"]), "max_position_embeddings": 4096,
            "rope_parameters": {"rope_theta": hp["rope_theta"], "rope_type": "default"},
            "tie_word_embeddings": True}


def write_files(hp, w, out_dir):
    """hf/ (config.json + model.safetensors) and model.gguf through llamacpp.py."""
    hf = os.path.join(out_dir, "hf")
    os.makedirs(hf, exist_ok=True)
    cfg = hf_config(hp)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(hf, "model.safetensors"), "wb") as f:
        f.write(write_bytes([(k, v[0], v[1]) for k, v in sorted(w.items())]))
    blob = llamacpp.write_gguf(cfg, w, "lfm2 test", lambda g, a: vocabs.add_tokenizer(
        g, "qwen2", hp["vocab"], {"bos_token_id": hp["vocab"] - 3, "eos_token_id": hp["vocab"] - 1}),
        os.path.join(out_dir, "model.gguf"))
    return GGUFFile(blob=blob), HFCheckpoint(hf)


def close(a, b, tol=1e-4):
    m = max(abs(x) for x in b)
    return max(abs(x - y) for x, y in zip(a, b)) <= tol * m


class TestLfm2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.hp = dict(TINY)
        cls.w = hf_weights(cls.hp)
        cls.graph = build_graph(cls.hp["layer_types"])
        cls.tmp = tempfile.TemporaryDirectory()
        cls.gg, cls.ck = write_files(cls.hp, cls.w, cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_repeat_bodies(self):
        g = self.graph
        self.assertEqual(g["layer_hparams"], ["layer_kind"])
        rep = ir.find_repeat(g)
        self.assertEqual(rep["kind"], "layer_kind")
        self.assertEqual(list(rep["carry"]), ["h"])
        self.assertEqual(sorted(rep["bodies"]), ["0", "1"])
        self.assertEqual([rep["bodies"][k]["name"] for k in ("0", "1")], ["conv", "attention"])
        ops0 = [n["op"] for n in rep["bodies"]["0"]["body"]]
        ops1 = [n["op"] for n in rep["bodies"]["1"]["body"]]
        self.assertEqual((ops0.count("short_conv"), ops0.count("attention")), (1, 0))
        self.assertEqual((ops1.count("short_conv"), ops1.count("attention")), (0, 1))
        pl = ir.param_layers(g, {"n_layers": 5, "layer_kind": [0, 0, 1, 0, 1]})
        self.assertEqual(pl["model.layers.{i}.conv.in_proj.weight"], [0, 1, 3])
        self.assertEqual(pl["model.layers.{i}.self_attn.q_proj.weight"], [2, 4])
        self.assertEqual(pl["model.layers.{i}.ffn_norm.weight"], [0, 1, 2, 3, 4])

    def test_kinds_must_match_within_kind(self):
        b, logits = emulate_lfm2_capture(TINY["layer_types"])
        for n in b.nodes:
            if n.layer == 3 and n.op == "silu":
                n.op = "gelu"
        with self.assertRaises(ir.CaptureError):
            ir.extract_repeat(b.nodes, [logits], 5, "model.layers", [0, 0, 1, 0, 1])
        # the last layer's kind must also be followed by a layer somewhere
        b, logits = emulate_lfm2_capture(["conv", "conv", "full_attention"])
        with self.assertRaises(ir.CaptureError):
            ir.extract_repeat(b.nodes, [logits], 3, "model.layers", [0, 0, 1])

    def test_converter_layout(self):
        self.assertEqual(self.gg.kv["lfm2.attention.head_count_kv"], [0, 0, 2, 0, 2])
        self.assertEqual(self.gg.kv["lfm2.shortconv.l_cache"], 3)
        self.assertEqual(self.gg.tensors["blk.0.shortconv.conv.weight"]["shape"], [16, 3])
        self.assertIn("token_embd_norm.weight", self.gg.tensors)
        self.assertNotIn("blk.0.attn_q.weight", self.gg.tensors)
        self.assertNotIn("output.weight", self.gg.tensors)

    def test_bind_both_sections(self):
        hg, pg, ug = RI.bind_gguf(self.graph, archs.LFM2_MAP, self.gg)
        hs, ps, us = RI.bind_safetensors(self.graph, archs.LFM2_MAP, self.ck)
        self.assertEqual((ug, us), ([], []))
        for hp in (hg, hs):
            self.assertEqual(hp["layer_kind"], [0, 0, 1, 0, 1])
            self.assertEqual((hp["n_kv_heads"], hp["head_dim"], hp["conv_L"], hp["d_ff"]), (2, 4, 3, 24))
        self.assertEqual(sorted(pg), sorted(ps))
        for name in pg:
            self.assertEqual(pg[name].shape, ps[name].shape, name)
            self.assertEqual(pg[name].data, ps[name].data, name)
        self.assertNotIn("model.layers.0.self_attn.q_proj.weight", pg)
        self.assertIn("model.layers.2.self_attn.q_proj.weight", pg)

    def test_forward_matches_naive(self):
        hp, params, _ = RI.bind_gguf(self.graph, archs.LFM2_MAP, self.gg)
        prog = RI.Program(self.graph, hp, params)
        seq = [1, 5, 9, 33, 2, 17, 4]
        want = naive_lfm2(self.hp, self.w, seq + [11, 3])
        out = prog.forward(seq, list(range(7)), [0] * 7, list(range(7)))
        for r, wr in zip(RI._logit_rows(out), want):
            self.assertTrue(close(r, wr), (r[:4], wr[:4]))
        for t, tok in ((7, 11), (8, 3)):  # decode: conv state and KV cache carry over
            out = prog.forward([tok], [t], [0], [0])
            self.assertTrue(close(out.data, want[t]))

    def test_batch_slots_isolated(self):
        hp, params, _ = RI.bind_safetensors(self.graph, archs.LFM2_MAP, self.ck)
        prog = RI.Program(self.graph, hp, params)
        a, b = [1, 7, 8, 9], [2, 30, 31]
        out = prog.forward(a + b, [0, 1, 2, 3, 0, 1, 2], [1, 1, 1, 1, 0, 0, 0], [3, 6, 1])
        rows = RI._logit_rows(out)
        wa, wb = naive_lfm2(self.hp, self.w, a), naive_lfm2(self.hp, self.w, b)
        self.assertTrue(close(rows[0], wa[3]))
        self.assertTrue(close(rows[1], wb[2]))
        self.assertTrue(close(rows[2], wa[1]))
        out = prog.forward([5, 6], [4, 3], [1, 0], [0, 1])
        rows = RI._logit_rows(out)
        self.assertTrue(close(rows[0], naive_lfm2(self.hp, self.w, a + [5])[4]))
        self.assertTrue(close(rows[1], naive_lfm2(self.hp, self.w, b + [6])[3]))

    def test_per_layer_rules_refuse(self):
        cfg = dict(self.ck.config, layer_types=["conv", "sliding_attention", "full_attention", "conv",
                                                "full_attention"])
        src = RI._HFSource(self.ck)
        src.ck = type("C", (), {"config": cfg, "tensors": self.ck.tensors, "tensor_order": self.ck.tensor_order})()
        with self.assertRaisesRegex(RI.BindError, "sliding_attention"):
            RI.resolve_hparams(self.graph, archs.LFM2_MAP["safetensors"], src)
        cfg["layer_types"] = ["conv", "full_attention"]
        with self.assertRaisesRegex(RI.BindError, "2 entries for 5 layers"):
            RI.resolve_hparams(self.graph, archs.LFM2_MAP["safetensors"], src)
        # a scalar hparam from a per-layer GGUF array needs "reduce"
        gspec = json.loads(json.dumps(archs.LFM2_MAP["gguf"]))
        del gspec["hparams"]["n_kv_heads"]["reduce"]
        with self.assertRaisesRegex(RI.BindError, "is a list"):
            RI.resolve_hparams(self.graph, gspec, RI._GGUFSource(self.gg))

    def test_other_programs_refuse(self):
        root = os.path.join(HERE, "..", "..", "programs")
        for w in (self.gg, self.ck):
            name, _, _, refusals = RI.select_program(root, w)
            if os.path.exists(os.path.join(root, "lfm2", "graph.json")):
                self.assertEqual(name, "lfm2", refusals)
            else:
                self.assertIsNone(name, refusals)


if __name__ == "__main__":
    unittest.main()
