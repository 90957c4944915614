"""Pure-Python tests (no torch) of the weight-file side of capture: the safetensors
reader/writer, the dummy vocabularies, the emulation of llama.cpp's converter, and the
parameter maps of every committed program: a checkpoint written as Hugging Face
safetensors and converted to GGUF the way llama.cpp does must bind to the same values
through the map's two sections, and select exactly its own program.

    python3 -m unittest discover -s python/tests
"""

import json
import os
import random
import shutil
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from llmopt import expr as E  # noqa: E402
from llmopt import ir  # noqa: E402
from llmopt import llamacpp, vocabs  # noqa: E402
from llmopt import ref_interp as RI  # noqa: E402
from llmopt.archs import TINY, GGUF_NAMES  # noqa: E402
from llmopt.gguf_writer import GGUFFile, GGUFWriter  # noqa: E402
from llmopt.safetensors_io import (HFCheckpoint, SafetensorsError, SafetensorsFile,  # noqa: E402
                                   write_bytes)

PROGRAMS = os.path.join(ROOT, "programs")
HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma": "GemmaForCausalLM", "lfm2": "Lfm2ForCausalLM"}
TOKENIZER = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen2", "gemma": "gemma", "lfm2": "qwen2"}


class TestSafetensors(unittest.TestCase):
    def test_roundtrip(self):
        vals = [float(i) * 0.25 - 1 for i in range(12)]
        blob = write_bytes([("a.weight", [3, 4], vals), ("b", [2], [1.5, -2.0])], {"format": "pt"})
        (n,) = struct.unpack("<Q", blob[:8])
        self.assertEqual((8 + n) % 8, 0)
        st = SafetensorsFile(blob=blob)
        self.assertEqual(st.order, ["a.weight", "b"])
        self.assertEqual(st.metadata, {"format": "pt"})
        self.assertEqual(st.tensors["a.weight"]["shape"], [3, 4])
        self.assertEqual(st.tensor_values("a.weight"), vals)
        self.assertEqual(st.tensor_values("b"), [1.5, -2.0])

    def test_f16_bf16(self):
        f16 = struct.pack("<3e", 1.0, -0.5, 2.0)
        bf16 = struct.pack("<2H", *(struct.unpack("<I", struct.pack("<f", x))[0] >> 16 for x in (3.0, -0.125)))
        header = {"h": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},
                  "b": {"dtype": "BF16", "shape": [2], "data_offsets": [6, 10]}}
        h = json.dumps(header).encode()
        st = SafetensorsFile(blob=struct.pack("<Q", len(h)) + h + f16 + bf16)
        self.assertEqual(st.tensor_values("h"), [1.0, -0.5, 2.0])
        self.assertEqual(st.tensor_values("b"), [3.0, -0.125])

    def test_bad_files(self):
        good = write_bytes([("a", [2, 2], [1.0, 2.0, 3.0, 4.0])])
        (n,) = struct.unpack("<Q", good[:8])
        bad = {
            "empty": b"",
            "short length": b"\x01\x00",
            "header past end": struct.pack("<Q", 1 << 20) + good[8:],
            "truncated data": good[:-3],
            "not json": struct.pack("<Q", 4) + b"{{{{",
            "not an object": struct.pack("<Q", 2) + b"[]",
        }
        for what, blob in bad.items():
            with self.assertRaises(SafetensorsError, msg=what):
                SafetensorsFile(blob=blob)
        for tweak in ({"dtype": "I64"}, {"shape": [3, 2]}, {"data_offsets": [0, 20]}, {"shape": "x"}):
            header = {"a": dict({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, **tweak)}
            h = json.dumps(header).encode()
            with self.assertRaises(SafetensorsError, msg=str(tweak)):
                SafetensorsFile(blob=struct.pack("<Q", len(h)) + h + good[8 + n:])

    def test_sharded_checkpoint(self):
        d = tempfile.mkdtemp()
        try:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"hidden_size": 2}, f)
            with open(os.path.join(d, "model-00001-of-00002.safetensors"), "wb") as f:
                f.write(write_bytes([("x", [2], [1.0, 2.0])]))
            with open(os.path.join(d, "model-00002-of-00002.safetensors"), "wb") as f:
                f.write(write_bytes([("y", [1], [3.0])]))
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                                                          "y": "model-00002-of-00002.safetensors"}}, f)
            ck = HFCheckpoint(d)
            self.assertEqual(ck.tensor_order, ["x", "y"])
            self.assertEqual(ck.tensor_values("y"), [3.0])
            self.assertEqual(ck.config["hidden_size"], 2)
        finally:
            shutil.rmtree(d)


class TestVocabs(unittest.TestCase):
    def test_bytes_to_unicode(self):
        t = vocabs.bytes_to_unicode()
        self.assertEqual(len(set(t.values())), 256)
        self.assertEqual(t[ord(" ")], "\u0120")
        self.assertEqual(t[ord("A")], "A")
        self.assertEqual(t[0], "\u0100")
        self.assertEqual(t[0x0A], "\u010a")

    def test_bpe(self):
        tokens, types, merges = vocabs.bpe_vocab(320, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        self.assertEqual(len(tokens), 320)
        self.assertEqual(len(set(tokens)), 320)
        self.assertEqual(len(merges), 320 - 256 - 3)
        seen = set(tokens[:256])
        for m, tok in zip(merges, tokens[256:]):
            a, b = m.split(" ")
            self.assertIn(a, seen)
            self.assertIn(b, seen)
            self.assertEqual(a + b, tok)
            seen.add(tok)
        self.assertEqual(tokens[-1], "<|im_end|>")

    def test_spm(self):
        tokens, scores, types = vocabs.spm_vocab(300, [("<unk>", 2), ("<s>", 3), ("</s>", 3)])
        self.assertEqual((len(tokens), len(scores), len(types)), (300, 300, 300))
        self.assertEqual(len(set(tokens)), 300)
        self.assertEqual(tokens[3], "<0x00>")

    def test_gguf_tokenizers(self):
        for kind, model in (("llama", "llama"), ("gemma", "llama"), ("qwen2", "gpt2")):
            w = GGUFWriter()
            vocabs.add_tokenizer(w, kind, 320, {})
            g = GGUFFile(blob=w.to_bytes())
            self.assertEqual(g.kv["tokenizer.ggml.model"], model)
            self.assertEqual(len(g.kv["tokenizer.ggml.tokens"]), 320)
            self.assertEqual(len(g.kv["tokenizer.ggml.token_type"]), 320)


class TestConverterEmulation(unittest.TestCase):
    def test_llama_permute_is_rope_permutation(self):
        rows, k = 4 * 6, 3
        data = [float(i) for i in range(rows * k)]
        self.assertEqual(llamacpp.llama_permute([rows, k], data, 4), RI.permute_rope_rows([rows, k], data, 4))
        # n_head_kv replaces n_head when they differ (K rows)
        self.assertEqual(llamacpp.llama_permute([rows, k], data, 8, 4), RI.permute_rope_rows([rows, k], data, 4))

    def test_names(self):
        self.assertEqual(llamacpp.gguf_tensor_name("model.layers.3.self_attn.q_proj.bias"), "blk.3.attn_q.bias")
        self.assertEqual(llamacpp.gguf_tensor_name("model.layers.0.self_attn.k_norm.weight"),
                         "blk.0.attn_k_norm.weight")
        self.assertEqual(llamacpp.gguf_tensor_name("lm_head.weight"), "output.weight")
        # the emulation's table agrees with the maps' table
        for hf, gg in GGUF_NAMES.items():
            self.assertEqual(llamacpp.gguf_tensor_name(hf.replace("{i}", "5")), gg.replace("{i}", "5"))


# ----------------------------------------------------------------- maps of the committed programs

def hf_config(arch, hp):
    """config.json as transformers writes it for these families (the keys the maps read)."""
    c = {"architectures": [HF_CLASS[arch]], "model_type": arch, "vocab_size": hp["vocab"],
         "hidden_size": hp["d_model"], "intermediate_size": hp["d_ff"], "num_hidden_layers": hp["n_layers"],
         "num_attention_heads": hp["n_heads"], "num_key_value_heads": hp["n_kv_heads"],
         "rms_norm_eps": hp["rms_eps"], "max_position_embeddings": hp["max_positions"],
         "rope_parameters": {"rope_theta": hp["rope_theta"], "rope_type": "default"},
         "tie_word_embeddings": hp["tied"], "torch_dtype": "float32"}
    if arch == "lfm2":  # LFM2's own keys; head_dim is always d_model / n_heads
        c.update(norm_eps=c.pop("rms_norm_eps"), layer_types=list(hp["layer_types"]), conv_L_cache=hp["conv_L"],
                 block_auto_adjust_ff_dim=False, conv_bias=False)
    elif arch != "qwen2":
        c["head_dim"] = hp["head_dim"]
    return c


def random_checkpoint(graph, hp, seed):
    """HF-named tensors for every param of `graph` at sizes `hp` (tied: no lm_head)."""
    rnd = random.Random(seed)
    env = {k: v for k, v in hp.items() if not isinstance(v, list)}
    out = {}
    kinds = {"layer_kind": [{"conv": 0, "full_attention": 1}[t] for t in hp["layer_types"]]} if "layer_types" in hp else {}
    players = ir.param_layers(graph, dict(env, **kinds))  # layer kinds: a param on its kind's layers only
    for p in graph["params"]:
        layers = players[p["name"]] if "{i}" in p["name"] else [None]
        for i in layers:
            name = p["name"] if i is None else p["name"].replace("{i}", str(i))
            if name == "lm_head.weight" and hp["tied"]:
                continue
            e = dict(env, i=i or 0)
            shape = [E.eval_int(d, e) for d in p["shape"]]
            n = 1
            for d in shape:
                n *= d
            out[name] = (shape, [round(rnd.random() * 4 - 2, 4) for _ in range(n)])
    return out


def small(arch, **over):
    """The golden config of `arch`, smaller (the maps, not the numerics, are tested here)."""
    hp = dict(TINY[arch], vocab=272, d_model=32, d_ff=48)
    if arch in ("llama", "qwen2", "lfm2"):
        hp["head_dim"] = hp["d_model"] // hp["n_heads"]
    hp.pop("tokens")
    hp.update(over)
    return hp


def load_program(name):
    with open(os.path.join(PROGRAMS, name, "graph.json")) as f:
        graph = json.load(f)
    with open(os.path.join(PROGRAMS, name, "map.json")) as f:
        pmap = json.load(f)
    return graph, pmap


class TestProgramMaps(unittest.TestCase):
    """For each program: HF checkpoint -> (safetensors, converter-emulated GGUF) -> map."""

    def _checkpoint(self, arch, hp, seed=11):
        graph, pmap = load_program(arch)
        tensors = random_checkpoint(graph, hp, seed)
        cfg = hf_config(arch, hp)
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(write_bytes([(n, s, v) for n, (s, v) in sorted(tensors.items())], {"format": "pt"}))
        blob = llamacpp.write_gguf(cfg, tensors, "test",
                                   lambda w, a: vocabs.add_tokenizer(w, TOKENIZER[arch], hp["vocab"], {}))
        return graph, pmap, tensors, HFCheckpoint(d), GGUFFile(blob=blob)

    def _check_arch(self, arch, **over):
        hp = small(arch, **over)
        graph, pmap, tensors, ck, gg = self._checkpoint(arch, hp)
        hp_g, par_g, unused_g = RI.bind_gguf(graph, pmap, gg)
        hp_s, par_s, unused_s = RI.bind_safetensors(graph, pmap, ck)
        self.assertEqual(unused_g, [])
        self.assertEqual(unused_s, [])
        for k in list(graph["hparams"]) + ["max_positions"]:
            want = hp[k] if k != "max_positions" else hp["max_positions"]
            self.assertAlmostEqual(float(hp_g[k]), float(want), places=6, msg="gguf " + k)
            self.assertAlmostEqual(float(hp_s[k]), float(want), places=6, msg="safetensors " + k)
        self.assertEqual(sorted(par_g), sorted(par_s))
        def f32(xs):
            return list(struct.unpack("<%df" % len(xs), struct.pack("<%df" % len(xs), *xs)))

        for name in par_s:
            src = name if name in tensors else "model.embed_tokens.weight"  # tied lm_head
            x = tensors[src][1]
            self.assertTrue(par_s[name].data == f32(x), "safetensors " + name)
            tmpl = name
            for i in range(hp["n_layers"]):
                tmpl = tmpl.replace("layers.%d." % i, "layers.{i}.")
            tr = pmap["gguf"]["params"][tmpl].get("transform", {})
            if tr.get("op") == "add_scalar":
                # the file holds f32(w - c); undoing it is exact, and the graph adds -c back:
                # compare w - c, which is what the model computes with
                c = float(tr["value"])
                self.assertTrue([g - c for g in par_g[name].data] == f32([v - c for v in x]), "gguf " + name)
            else:
                # row permutations move whole f32 values: exact
                self.assertTrue(par_g[name].data == f32(x), "gguf " + name)
        for w in (gg, ck):
            name, _, _, refusals = RI.select_program(PROGRAMS, w)
            self.assertEqual(name, arch, refusals)

    def test_all_programs(self):
        names = sorted(n for n in os.listdir(PROGRAMS) if os.path.exists(os.path.join(PROGRAMS, n, "map.json")))
        self.assertTrue({"llama", "qwen2", "qwen3", "gemma"} <= set(names), names)
        for arch in names:
            with self.subTest(arch=arch):
                self._check_arch(arch)
            if arch in ("llama", "qwen2", "qwen3"):
                with self.subTest(arch=arch, tied=not TINY[arch]["tied"]):
                    self._check_arch(arch, tied=not TINY[arch]["tied"])

    def test_gemma_needs_its_metadata(self):
        """A tied Llama GGUF has exactly a Gemma GGUF's tensors: only `match` tells them apart."""
        graph, pmap, tensors, ck, gg = self._checkpoint("llama", small("llama", tied=True))
        g_graph, g_map = load_program("gemma")
        with self.assertRaises(RI.BindError):
            RI.bind_gguf(g_graph, g_map, gg)
        with self.assertRaises(RI.BindError):
            RI.bind_safetensors(g_graph, g_map, ck)
        # without the clause the Gemma program would take the Llama file
        loose = json.loads(json.dumps(g_map))
        del loose["gguf"]["match"]
        _, _, unused = RI.bind_gguf(g_graph, loose, gg)
        self.assertEqual(unused, [])

    def test_scaled_rope_refused(self):
        """These programs compute plain RoPE frequencies: Llama 3.1/3.2 ("llama3"), YaRN,
        linear scaling must refuse to bind rather than run with the wrong frequencies."""
        graph, pmap, tensors, ck, gg = self._checkpoint("llama", small("llama"))
        RI.bind_safetensors(graph, pmap, ck)
        ck.config["rope_parameters"]["rope_type"] = "llama3"
        with self.assertRaises(RI.BindError):
            RI.bind_safetensors(graph, pmap, ck)
        ck.config["rope_parameters"]["rope_type"] = "default"
        ck.config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
        with self.assertRaises(RI.BindError):
            RI.bind_safetensors(graph, pmap, ck)
        ck.config["rope_scaling"] = None
        RI.bind_safetensors(graph, pmap, ck)
        RI.bind_gguf(graph, pmap, gg)
        gg.kv["llama.rope.scaling.type"] = "yarn"
        with self.assertRaises(RI.BindError):
            RI.bind_gguf(graph, pmap, gg)
        gg.kv["llama.rope.scaling.type"] = "none"
        RI.bind_gguf(graph, pmap, gg)

    def test_hparam_rules(self):
        graph, pmap = load_program("qwen3")
        spec = pmap["safetensors"]
        self.assertEqual(spec["hparams"]["rope_theta"]["config"], ["rope_parameters.rope_theta", "rope_theta"])
        _, _, _, ck, _ = self._checkpoint("qwen3", small("qwen3"))
        src = RI._HFSource(ck)
        hps = RI.resolve_hparams(graph, spec, src)
        self.assertEqual((hps["rope_theta"], hps["head_dim"], hps["max_positions"]), (1e6, 16, 4096))
        # older config.json spellings: top-level rope_theta; nulls; keys left out
        del ck.config["rope_parameters"]
        ck.config["rope_theta"] = 5000.0
        ck.config["num_key_value_heads"] = None
        del ck.config["head_dim"]
        del ck.config["max_position_embeddings"]
        hps = RI.resolve_hparams(graph, spec, src)
        self.assertEqual(hps["rope_theta"], 5000.0)
        self.assertEqual(hps["n_kv_heads"], hps["n_heads"])
        self.assertEqual(hps["head_dim"], hps["d_model"] // hps["n_heads"])
        self.assertEqual(hps["max_positions"], 2048)
        ck.config["hidden_size"] = "64"
        with self.assertRaises(RI.BindError):
            RI.resolve_hparams(graph, spec, src)
        del ck.config["hidden_size"]
        with self.assertRaises(RI.BindError):
            RI.resolve_hparams(graph, spec, src)

    def test_transforms(self):
        self.assertEqual(RI.apply_transform({"op": "add_scalar", "value": -1}, [3], [2.0, 1.5, 0.25], {}),
                         [1.0, 0.5, -0.75])
        self.assertEqual(RI.apply_transform({"op": "add_scalar", "value": "rms_eps"}, [1], [1.0], {"rms_eps": 0.5}),
                         [1.5])
        with self.assertRaises(RI.BindError):
            RI.apply_transform({"op": "frobnicate"}, [1], [1.0], {})


if __name__ == "__main__":
    unittest.main()
