"""Tests of the pure-Python parts of llmopt's capture package (no torch needed):
expressions, the GGUF writer/reader, repeat extraction and serialization, the
parameter map binding (with the RoPE row permutation) and the reference interpreter,
checked against an independent straightforward Llama forward.

    python3 -m unittest discover -s python/tests -t python
"""

import json
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from llmopt import expr as E  # noqa: E402
from llmopt import ir  # noqa: E402
from llmopt.archs import LLAMA_GGUF_MAP, PROBE, DIM_EXPRS, FLOAT_EXPRS  # noqa: E402
from llmopt.gguf_writer import GGUFWriter, GGUFFile, STRING, FLOAT32, INT32, UINT8, GGML_F32, GGML_F16, f16_bytes  # noqa: E402
from llmopt import ref_interp as RI  # noqa: E402
from capture_emulation import EmulatedCapture  # noqa: E402


class TestExpr(unittest.TestCase):
    def test_eval(self):
        env = {"head_dim": 26, "n_heads": 21, "N": 5, "rms_eps": 1e-5}
        self.assertEqual(E.eval_int("n_heads*head_dim", env), 546)
        self.assertEqual(E.eval_int("head_dim/2", env), 13)
        self.assertEqual(E.eval_int("2*N-1", env), 9)
        self.assertEqual(E.eval_int("(1+2)*3", env), 9)
        self.assertEqual(E.eval_int("2^3^2", env), 512)
        self.assertAlmostEqual(E.eval_float("head_dim^-0.5", env), 26 ** -0.5, places=15)
        self.assertEqual(E.eval_float("rms_eps", env), 1e-5)
        self.assertEqual(E.eval_int(7, env), 7)
        with self.assertRaises(E.ExprError):
            E.eval_int("n_heads/2", env)
        with self.assertRaises(E.ExprError):
            E.evaluate("foo", env)
        with self.assertRaises(E.ExprError):
            E.parse("1 +")
        self.assertEqual(E.symbols("n_heads*head_dim+N"), {"n_heads", "head_dim", "N"})

    def test_probe_unambiguous(self):
        s = E.Symbolizer(PROBE, DIM_EXPRS, FLOAT_EXPRS)
        self.assertEqual(s.dim(330), "n_heads*head_dim")
        self.assertEqual(s.dim(110), "n_kv_heads*head_dim")
        self.assertEqual(s.dim(11), "head_dim/2")
        self.assertEqual(s.dim(7), "d_model/n_heads")
        self.assertEqual(s.dim(1), "1")
        with self.assertRaises(E.ExprError):
            s.dim(99)
        self.assertEqual(s.float_value(PROBE["rms_eps"]), "rms_eps")
        self.assertEqual(s.float_value(22 ** -0.5), "head_dim^-0.5")
        self.assertEqual(s.float_value(1.0), 1)
        self.assertEqual(s.float_value(0.5), 0.5)
        with self.assertRaises(E.ExprError):
            E.Symbolizer({"a": 4, "b": 2}, ["a", "b*2"])


class TestGGUF(unittest.TestCase):
    def test_roundtrip(self):
        w = GGUFWriter()
        w.add_string("general.architecture", "llama")
        w.add_u32("llama.block_count", 2)
        w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        w.add_bool("flag", True)
        w.add_array("tokenizer.ggml.tokens", STRING, ["<unk>", "a", "\u2581b"])
        w.add_array("tokenizer.ggml.scores", FLOAT32, [0.0, -1.0, -2.5])
        w.add_array("tokenizer.ggml.token_type", INT32, [2, 1, 1])
        w.add_array("bytes", UINT8, [1, 2, 255])
        vals = [float(i) * 0.5 for i in range(15)]
        w.add_tensor_f32("a.weight", [3, 5], vals)
        w.add_tensor_f32("b", [7], vals[:7])
        w.add_tensor("h", [2, 2], GGML_F16, f16_bytes([1.0, -2.0, 0.5, 3.0]))
        blob = w.to_bytes()
        g = GGUFFile(blob=blob)
        self.assertEqual(g.version, 3)
        self.assertEqual(g.kv["general.architecture"], "llama")
        self.assertEqual(g.kv["llama.block_count"], 2)
        self.assertAlmostEqual(g.kv["llama.attention.layer_norm_rms_epsilon"], 1e-5, places=10)
        self.assertIs(g.kv["flag"], True)
        self.assertEqual(g.kv["tokenizer.ggml.tokens"], ["<unk>", "a", "\u2581b"])
        self.assertEqual(g.kv["tokenizer.ggml.scores"], [0.0, -1.0, -2.5])
        self.assertEqual(g.kv["bytes"], [1, 2, 255])
        self.assertEqual(g.tensors["a.weight"]["shape"], [3, 5])
        self.assertEqual(g.tensor_values("a.weight"), vals)
        self.assertEqual(g.tensor_values("b"), vals[:7])
        self.assertEqual(g.tensor_values("h"), [1.0, -2.0, 0.5, 3.0])
        for t in g.tensors.values():
            self.assertEqual(t["offset"] % 32, 0)
        self.assertEqual(g.data_start % 32, 0)
        # ne is stored innermost first
        import struct
        name = b"a.weight"
        i = blob.index(struct.pack("<Q", len(name)) + name)
        off = i + 8 + len(name)
        self.assertEqual(struct.unpack("<IQQ", blob[off:off + 20]), (2, 5, 3))

    def test_errors(self):
        w = GGUFWriter()
        with self.assertRaises(ValueError):
            w.add_tensor("x", [2], GGML_F32, b"\0" * 4)
        w.add_u32("k", 1)
        with self.assertRaises(ValueError):
            w.add_u32("k", 2)
        with self.assertRaises(ValueError):
            GGUFFile(blob=b"GGUX" + b"\0" * 20)


class TestPermute(unittest.TestCase):
    def test_rope_rows(self):
        heads, dh, k = 3, 8, 2
        rows = heads * dh
        data = [float(r * 10 + c) for r in range(rows) for c in range(k)]
        f = RI.permute_rope_rows([rows, k], data, heads)
        # HF row half*(Dh/2)+j of a head is file row 2*j+half
        for h in range(heads):
            for half in range(2):
                for j in range(dh // 2):
                    hf_row = h * dh + half * (dh // 2) + j
                    file_row = h * dh + 2 * j + half
                    self.assertEqual(f[file_row * k:(file_row + 1) * k], data[hf_row * k:(hf_row + 1) * k])
        self.assertEqual(RI.unpermute_rope_rows([rows, k], f, heads), data)


# ----------------------------------------------------------------- a Llama, by hand

def emulate_llama_capture(n_layers=2):
    """The canonical nodes capture is expected to emit for HF Llama (layer-tagged)."""
    e = EmulatedCapture()
    b, inp, h, add, P = e.b, e.inp, e.h, e.add, e.param
    D = ["1", "N", "d_model"]

    def rms(x, w, layer):
        return e.rms(x, w, D, layer)

    rope = e.rope

    for i in range(n_layers):
        pre = "model.layers.%d." % i
        x = rms(h, P(pre + "input_layernorm.weight", ["d_model"]), i)
        heads = {}
        for nm, hh, dims in (("q", "n_heads", "n_heads*head_dim"), ("k", "n_kv_heads", "n_kv_heads*head_dim"),
                             ("v", "n_kv_heads", "n_kv_heads*head_dim")):
            y = add("linear", [x, P(pre + "self_attn.%s_proj.weight" % nm, [dims, "d_model"])], {}, ["1", "N", dims], i)
            y = add("reshape", [y], {"shape": ["1", "N", hh, "head_dim"]}, ["1", "N", hh, "head_dim"], i)
            heads[nm] = add("permute", [y], {"perm": [0, 2, 1, 3]}, ["1", hh, "N", "head_dim"], i)
        q = rope(heads["q"], "n_heads", i)
        k = rope(heads["k"], "n_kv_heads", i)
        a = add("attention", [q, k, heads["v"], inp["positions"], inp["seq_slots"]],
                {"scale": "head_dim^-0.5", "window": 0}, ["1", "N", "n_heads", "head_dim"], i)
        a = add("reshape", [a], {"shape": ["1", "N", "n_heads*head_dim"]}, ["1", "N", "n_heads*head_dim"], i)
        o = add("linear", [a, P(pre + "self_attn.o_proj.weight", ["d_model", "n_heads*head_dim"])], {}, D, i)
        h = add("add", [h, o], {}, D, i)
        x = rms(h, P(pre + "post_attention_layernorm.weight", ["d_model"]), i)
        FF = ["1", "N", "d_ff"]
        gt = add("linear", [x, P(pre + "mlp.gate_proj.weight", ["d_ff", "d_model"])], {}, FF, i)
        up = add("linear", [x, P(pre + "mlp.up_proj.weight", ["d_ff", "d_model"])], {}, FF, i)
        sg = add("silu", [gt], {}, FF, i)
        mm = add("mul", [sg, up], {}, FF, i)
        dn = add("linear", [mm, P(pre + "mlp.down_proj.weight", ["d_model", "d_ff"])], {}, D, i)
        h = add("add", [h, dn], {}, D, i)
    x = rms(h, P("model.norm.weight", ["d_model"]), None)
    x = add("select_rows", [x, inp["out_rows"]], {}, ["1", "M", "d_model"])
    logits = add("linear", [x, P("lm_head.weight", ["vocab", "d_model"])], {}, ["1", "M", "vocab"])
    return b, logits


def build_graph(n_layers=2):
    b, logits = emulate_llama_capture(n_layers)
    nodes = ir.dce(b.nodes, [logits])
    nodes, outs = ir.fold_reshape_chains(nodes, [logits])
    pre, rep, post = ir.extract_repeat(nodes, outs, n_layers, "model.layers")
    params = []
    for name in b.param_order:
        dtype, shape = b.params[name]
        if name.startswith("model.layers."):
            if not name.startswith("model.layers.0."):
                continue
            name = "model.layers.{i}." + name[len("model.layers.0."):]
        params.append({"name": name, "dtype": dtype, "shape": shape})
    inputs = [{"name": "tokens", "dtype": "i32", "shape": ["N"]},
              {"name": "positions", "dtype": "i32", "shape": ["N"]},
              {"name": "seq_slots", "dtype": "i32", "shape": ["N"]},
              {"name": "out_rows", "dtype": "i32", "shape": ["M"]}]
    hps = ["vocab", "d_model", "d_ff", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rms_eps", "rope_theta"]
    g = ir.to_graph("llama", {"module": "test"}, hps, inputs, params, pre, rep, post, outs)
    ir.validate(g, ir.CANONICAL_OPS)
    return json.loads(ir.dumps_graph(g))


TINY = {"vocab": 40, "d_model": 16, "d_ff": 24, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "head_dim": 6, "rms_eps": 1e-5, "rope_theta": 10000.0}


def random_weights(hp, seed=3):
    rnd = random.Random(seed)
    D, F, V = hp["d_model"], hp["d_ff"], hp["vocab"]
    qd, kd = hp["n_heads"] * hp["head_dim"], hp["n_kv_heads"] * hp["head_dim"]

    def mat(r, c, s=None):
        s = s if s is not None else 1.0 / math.sqrt(c)
        return ([r, c], [rnd.gauss(0, s) for _ in range(r * c)])

    def vec(n):
        return ([n], [1.0 + 0.1 * rnd.gauss(0, 1) for _ in range(n)])

    w = {"model.embed_tokens.weight": mat(V, D, 1.0), "model.norm.weight": vec(D), "lm_head.weight": mat(V, D)}
    for i in range(hp["n_layers"]):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = vec(D)
        w[p + "post_attention_layernorm.weight"] = vec(D)
        w[p + "self_attn.q_proj.weight"] = mat(qd, D)
        w[p + "self_attn.k_proj.weight"] = mat(kd, D)
        w[p + "self_attn.v_proj.weight"] = mat(kd, D)
        w[p + "self_attn.o_proj.weight"] = mat(D, qd)
        w[p + "mlp.gate_proj.weight"] = mat(F, D)
        w[p + "mlp.up_proj.weight"] = mat(F, D)
        w[p + "mlp.down_proj.weight"] = mat(D, F)
    return w


def naive_llama(hp, w, seq):
    """Straightforward HF-semantics Llama forward of one sequence: logits per position."""
    H, Hk, Dh = hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]

    def W(name):
        shape, data = w[name]
        return [data[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]

    def mv(m, x):
        return [sum(a * b for a, b in zip(row, x)) for row in m]

    def rms(x, g):
        s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + hp["rms_eps"])
        return [v * s * gg for v, gg in zip(x, g[1])]

    def rope(v, pos):
        out = list(v)
        half = Dh // 2
        for j in range(half):
            f = hp["rope_theta"] ** (-2.0 * j / Dh)
            c, s = math.cos(pos * f), math.sin(pos * f)
            a, b = v[j], v[j + half]
            out[j] = a * c - b * s
            out[j + half] = b * c + a * s
        return out

    emb = W("model.embed_tokens.weight")
    hs = [list(emb[t]) for t in seq]
    T = len(seq)
    for i in range(hp["n_layers"]):
        p = "model.layers.%d." % i
        xs = [rms(x, w[p + "input_layernorm.weight"]) for x in hs]
        Q = [mv(W(p + "self_attn.q_proj.weight"), x) for x in xs]
        K = [mv(W(p + "self_attn.k_proj.weight"), x) for x in xs]
        Vv = [mv(W(p + "self_attn.v_proj.weight"), x) for x in xs]
        att = []
        for t in range(T):
            row = []
            for h in range(H):
                kh = h // (H // Hk)
                q = rope(Q[t][h * Dh:(h + 1) * Dh], t)
                sc = [sum(a * b for a, b in zip(q, rope(K[s][kh * Dh:(kh + 1) * Dh], s))) / math.sqrt(Dh)
                      for s in range(t + 1)]
                m = max(sc)
                e = [math.exp(x - m) for x in sc]
                z = sum(e)
                o = [sum(e[s] / z * Vv[s][kh * Dh + d] for s in range(t + 1)) for d in range(Dh)]
                row.extend(o)
            att.append(row)
        hs = [[a + b for a, b in zip(h_, mv(W(p + "self_attn.o_proj.weight"), a_))] for h_, a_ in zip(hs, att)]
        xs = [rms(x, w[p + "post_attention_layernorm.weight"]) for x in hs]
        for t in range(T):
            g = mv(W(p + "mlp.gate_proj.weight"), xs[t])
            u = mv(W(p + "mlp.up_proj.weight"), xs[t])
            m = [gg / (1 + math.exp(-gg)) * uu for gg, uu in zip(g, u)]
            d = mv(W(p + "mlp.down_proj.weight"), m)
            hs[t] = [a + b for a, b in zip(hs[t], d)]
    return [mv(W("lm_head.weight"), rms(x, w["model.norm.weight"])) for x in hs]


def write_gguf(hp, w, tied=False):
    g = GGUFWriter()
    g.add_string("general.architecture", "llama")
    g.add_u32("llama.embedding_length", hp["d_model"])
    g.add_u32("llama.feed_forward_length", hp["d_ff"])
    g.add_u32("llama.block_count", hp["n_layers"])
    g.add_u32("llama.attention.head_count", hp["n_heads"])
    g.add_u32("llama.attention.head_count_kv", hp["n_kv_heads"])
    if hp["head_dim"] != hp["d_model"] // hp["n_heads"]:
        g.add_u32("llama.attention.key_length", hp["head_dim"])
    g.add_f32("llama.attention.layer_norm_rms_epsilon", hp["rms_eps"])

    def put(name, t, heads=None):
        shape, data = t
        if heads:
            data = RI.permute_rope_rows(shape, data, heads)
        g.add_tensor_f32(name, shape, data)

    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    if not tied:
        put("output.weight", w["lm_head.weight"])
    for i in range(hp["n_layers"]):
        p, b = "model.layers.%d." % i, "blk.%d." % i
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", w[p + "self_attn.q_proj.weight"], hp["n_heads"])
        put(b + "attn_k.weight", w[p + "self_attn.k_proj.weight"], hp["n_kv_heads"])
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", w[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
    return GGUFFile(blob=g.to_bytes())


def close(a, b, tol=1e-4):
    m = max(abs(x) for x in b)
    return max(abs(x - y) for x, y in zip(a, b)) <= tol * m


class TestPipeline(unittest.TestCase):
    def test_repeat_structure(self):
        g = build_graph(3)
        reps = [n for n in g["nodes"] if n["op"] == "repeat"]
        self.assertEqual(len(reps), 1)
        r = reps[0]
        self.assertEqual(list(r["carry"]), ["h"])
        self.assertEqual(r["count"], "n_layers")
        names = {p["name"] for p in g["params"]}
        self.assertIn("model.layers.{i}.self_attn.q_proj.weight", names)
        self.assertFalse(any(".1." in n for n in names))
        self.assertEqual(sum(1 for n in r["body"] if n["op"] == "attention"), 1)
        # rope cos/sin are outer values read by the body
        outer = {n["id"] for n in g["nodes"] if n["op"] in ("cos", "sin")}
        body_reads = {x for n in r["body"] for x in n["in"]}
        self.assertTrue(outer <= body_reads)

    def test_layers_must_match(self):
        b, logits = emulate_llama_capture(2)
        for n in b.nodes:
            if n.layer == 1 and n.op == "silu":
                n.op = "gelu"
        with self.assertRaises(ir.CaptureError):
            ir.extract_repeat(b.nodes, [logits], 2, "model.layers")

    def test_gguf_binding_matches_naive(self):
        hp = dict(TINY)
        w = random_weights(hp)
        g = build_graph()
        gg = write_gguf(hp, w)
        bhp, params, unused = RI.bind_gguf(g, LLAMA_GGUF_MAP, gg)
        self.assertEqual(bhp["head_dim"], 6)
        self.assertEqual(bhp["rope_theta"], 10000)
        self.assertEqual(unused, [])
        prog = RI.Program(g, bhp, params)
        seq = [1, 5, 9, 33, 2, 17, 4]
        want = naive_llama(hp, w, seq)
        out = prog.forward(seq, list(range(len(seq))), [0] * len(seq), list(range(len(seq))))
        rows = RI._logit_rows(out)
        for r, wr in zip(rows, want):
            self.assertTrue(close(r, wr), (r[:4], wr[:4]))
        # decode through the KV cache gives the full re-run logits
        seq2 = seq + [11, 3]
        want2 = naive_llama(hp, w, seq2)
        for t in (7, 8):
            out = prog.forward([seq2[t]], [t], [0], [0])
            self.assertTrue(close(out.data, want2[t]))

    def test_batch_slots_isolated(self):
        hp = dict(TINY)
        w = random_weights(hp, seed=5)
        g = build_graph()
        bhp, params, _ = RI.bind_gguf(g, LLAMA_GGUF_MAP, write_gguf(hp, w))
        prog = RI.Program(g, bhp, params)
        a, b = [1, 7, 8, 9], [1, 30, 31]
        toks = a + b
        pos = [0, 1, 2, 3, 0, 1, 2]
        slots = [1, 1, 1, 1, 0, 0, 0]
        out = prog.forward(toks, pos, slots, [3, 6, 1])
        rows = RI._logit_rows(out)
        wa, wb = naive_llama(hp, w, a), naive_llama(hp, w, b)
        self.assertTrue(close(rows[0], wa[3]))
        self.assertTrue(close(rows[1], wb[2]))
        self.assertTrue(close(rows[2], wa[1]))
        out = prog.forward([5, 6], [4, 3], [1, 0], [0, 1])
        rows = RI._logit_rows(out)
        self.assertTrue(close(rows[0], naive_llama(hp, w, a + [5])[4]))
        self.assertTrue(close(rows[1], naive_llama(hp, w, b + [6])[3]))

    def test_tied_fallback_and_default_head_dim(self):
        hp = dict(TINY, d_model=24, head_dim=6)  # head_dim == d_model / n_heads: key absent
        w = random_weights(hp)
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
        g = build_graph()
        gg = write_gguf(hp, w, tied=True)
        self.assertNotIn("llama.attention.key_length", gg.kv)
        bhp, params, _ = RI.bind_gguf(g, LLAMA_GGUF_MAP, gg)
        self.assertEqual(bhp["head_dim"], 6)
        prog = RI.Program(g, bhp, params)
        seq = [1, 2, 3]
        out = prog.forward(seq, [0, 1, 2], [0, 0, 0], [2])
        self.assertTrue(close(out.data, naive_llama(hp, w, seq)[2]))

    def test_shape_mismatch_rejected(self):
        hp = dict(TINY)
        w = random_weights(hp)
        g = build_graph()
        gg = write_gguf(hp, w)
        gg.kv["llama.feed_forward_length"] = 25
        with self.assertRaises(RI.InterpError):
            RI.bind_gguf(g, LLAMA_GGUF_MAP, gg)


if __name__ == "__main__":
    unittest.main()
