"""The nodes every emulated capture in these tests starts with, and the two blocks each
one repeats per layer: what `llmopt.capture` emits for a HF decoder's rotary tables,
token embedding, RMSNorm and rotate-half RoPE (layer-tagged), so test_pure.py (Llama) and
test_lfm2.py (LFM2) build their graphs from one definition of those patterns."""

from llmopt import ir

INPUTS = ("tokens", "positions", "seq_slots", "out_rows")


class EmulatedCapture:
    """An ir.Builder holding the prologue: `h` the embedded tokens [1, N, d_model] and
    `cos`/`sin` the rotary tables [1, N, head_dim]. Parameters are f32."""

    def __init__(self):
        self.b = ir.Builder()
        self.inp = {n: ("input", n) for n in INPUTS}
        add, P = self.add, self.param
        freqs = add("rope_freqs", [], {"dim": "head_dim", "theta": "rope_theta"}, ["head_dim/2"])
        ids = add("reshape", [self.inp["tokens"]], {"shape": ["1", "N"]}, ["1", "N"], dtype="i32")
        self.h = add("embedding", [P("model.embed_tokens.weight", ["vocab", "d_model"]), ids], {},
                     ["1", "N", "d_model"])
        f3 = add("reshape", [freqs], {"shape": ["1", "head_dim/2", "1"]}, ["1", "head_dim/2", "1"])
        pf = add("cast", [self.inp["positions"]], {"dtype": "f32"}, ["N"])
        p3 = add("reshape", [pf], {"shape": ["1", "1", "N"]}, ["1", "1", "N"])
        fr = add("matmul", [f3, p3], {}, ["1", "head_dim/2", "N"])
        frt = add("permute", [fr], {"perm": [0, 2, 1]}, ["1", "N", "head_dim/2"])
        emb = add("concat", [frt, frt], {"dim": -1}, ["1", "N", "head_dim"])
        self.cos = add("cos", [emb], {}, ["1", "N", "head_dim"])
        self.sin = add("sin", [emb], {}, ["1", "N", "head_dim"])

    def param(self, name, shape):
        return self.b.param(name, "f32", shape)

    def add(self, op, ins, attrs, shape, layer=None, dtype="f32"):
        return self.b.add(op, ins, attrs, dtype, shape, layer)

    def rms(self, x, w, shape, layer):
        """HF RMSNorm over the last axis of `x` (shape `shape`), times weight `w`."""
        add = self.add
        red = shape[:-1] + ["1"]
        sq = add("pow", [x, add("const", [], {"value": 2}, [], layer)], {}, shape, layer)
        m = add("mean", [sq], {"dims": [-1], "keepdim": 1}, red, layer)
        e = add("add", [m, add("const", [], {"value": "rms_eps"}, [], layer)], {}, red, layer)
        r = add("rsqrt", [e], {}, red, layer)
        y = add("mul", [x, r], {}, shape, layer)
        return add("mul", [w, y], {}, shape, layer)

    def rope(self, x, heads, layer):
        """Rotate-half RoPE of `x` [1, heads, N, head_dim] with the prologue's tables."""
        add = self.add
        S = ["1", heads, "N", "head_dim"]
        c4 = add("reshape", [self.cos], {"shape": ["1", "1", "N", "head_dim"]}, ["1", "1", "N", "head_dim"], layer)
        s4 = add("reshape", [self.sin], {"shape": ["1", "1", "N", "head_dim"]}, ["1", "1", "N", "head_dim"], layer)
        xc = add("mul", [x, c4], {}, S, layer)
        H2 = ["1", heads, "N", "head_dim/2"]
        x1 = add("slice", [x], {"dim": -1, "start": 0, "end": "head_dim/2", "step": 1}, H2, layer)
        x2 = add("slice", [x], {"dim": -1, "start": "head_dim/2", "end": "head_dim", "step": 1}, H2, layer)
        nx2 = add("neg", [x2], {}, H2, layer)
        rot = add("concat", [nx2, x1], {"dim": -1}, S, layer)
        rs = add("mul", [rot, s4], {}, S, layer)
        return add("add", [xc, rs], {}, S, layer)
