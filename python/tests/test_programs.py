"""The committed artifacts agree with each other, checked with the pure-Python
interpreter (no torch): every programs/<arch> (graph.json + map.json) replays the torch
goldens of tests/golden/<arch>_tiny from both of its files (model.gguf through the map's
"gguf" section, hf/ through its "safetensors" section), each golden file selects exactly
its own program, and programs/llama reproduces stories260K's known greedy continuation
from ../shared/models when that folder is there.

    python3 -m unittest discover -s python/tests
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from llmopt import ir  # noqa: E402
from llmopt import ref_interp as RI  # noqa: E402
from llmopt.gguf_writer import GGUFFile  # noqa: E402
from llmopt.safetensors_io import HFCheckpoint  # noqa: E402

PROGRAMS = os.path.join(ROOT, "programs")
GOLDEN = os.path.join(ROOT, "tests", "golden")
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
EXPECTED = ["gemma", "lfm2", "llama", "qwen2", "qwen3"]


def load(path):
    with open(path) as f:
        return json.load(f)


def program_names():
    return sorted(n for n in os.listdir(PROGRAMS) if os.path.exists(os.path.join(PROGRAMS, n, "graph.json")))


class TestPrograms(unittest.TestCase):
    def test_expected_programs(self):
        self.assertTrue(set(EXPECTED) <= set(program_names()), program_names())
        for arch in EXPECTED:
            self.assertTrue(os.path.exists(os.path.join(GOLDEN, "%s_tiny" % arch, "golden.json")), arch)

    def test_structure(self):
        for arch in program_names():
            with self.subTest(arch=arch):
                g = load(os.path.join(PROGRAMS, arch, "graph.json"))
                pmap = load(os.path.join(PROGRAMS, arch, "map.json"))
                ir.validate(g, ir.CANONICAL_OPS)
                self.assertEqual([i["name"] for i in g["inputs"]], ["tokens", "positions", "seq_slots", "out_rows"])
                self.assertEqual(sum(1 for n in g["nodes"] if n["op"] == "repeat"), 1)
                rep = [n for n in g["nodes"] if n["op"] == "repeat"][0]
                if "bodies" in rep:  # layers of several kinds (lfm2): state ops per body
                    ops = [[n["op"] for n in b["body"]] for b in rep["bodies"].values()]
                    self.assertEqual(sorted((o.count("attention"), o.count("short_conv")) for o in ops),
                                     [(0, 1), (1, 0)])
                    self.assertEqual(g["layer_hparams"], [rep["kind"]])
                else:
                    self.assertEqual(sum(1 for n in rep["body"] if n["op"] == "attention"), 1)
                for section in ("gguf", "safetensors"):
                    self.assertEqual({p["name"] for p in g["params"]}, set(pmap[section]["params"]), section)
                    self.assertTrue(set(g["hparams"]) | {"max_positions"} <= set(pmap[section]["hparams"]), section)


class GoldenReplay:
    """Mixed into one TestCase per committed golden (below)."""
    arch = None

    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(GOLDEN, "%s_tiny" % cls.arch)
        cls.graph = load(os.path.join(PROGRAMS, cls.arch, "graph.json"))
        cls.pmap = load(os.path.join(PROGRAMS, cls.arch, "map.json"))
        cls.golden = load(os.path.join(cls.dir, "golden.json"))

    def replay(self, hp, params, unused, cases=None):
        self.assertEqual(unused, [])
        for k, v in self.golden["config"].items():
            if k in hp:
                self.assertAlmostEqual(float(hp[k]), float(v), places=6, msg=k)
        self.assertEqual(hp["max_positions"], self.golden["config"]["max_positions"])
        golden = dict(self.golden, cases=[c for c in self.golden["cases"] if cases is None or c["name"] in cases])
        res = RI.check_golden(RI.Program(self.graph, hp, params), golden, log=lambda *a: None)
        for name, st in res.items():
            self.assertLess(st.max_rel, 1e-4, name)
            self.assertEqual(st.argmax_mismatch, 0, name)
        return res

    def test_gguf(self):
        """The whole golden (prefill + 32 greedy steps; a 2-sequence batch) through model.gguf."""
        gg = GGUFFile(os.path.join(self.dir, "model.gguf"))
        res = self.replay(*RI.bind_gguf(self.graph, self.pmap, gg))
        prompt = self.golden["cases"][0]
        self.assertEqual(len(prompt["greedy"]), 32)
        self.assertEqual(sum(1 for s in prompt["steps"] if len(s["tokens"]) == 1), 32)
        self.assertGreaterEqual(len(set(prompt["greedy"])), 8)  # greedy decoding does not just repeat
        self.assertGreaterEqual(sum(st.rows for st in res.values()), 64)

    def test_safetensors(self):
        """hf/ binds to the values model.gguf binds to (up to the f32 rounding of Gemma's
        stored w + 1), and replays the batch case."""
        ck = HFCheckpoint(os.path.join(self.dir, "hf"))
        hp, params, unused = RI.bind_safetensors(self.graph, self.pmap, ck)
        _, gparams, _ = RI.bind_gguf(self.graph, self.pmap, GGUFFile(os.path.join(self.dir, "model.gguf")))
        self.assertEqual(sorted(params), sorted(gparams))
        for name, t in params.items():
            g = gparams[name].data
            worst = max(abs(a - b) for a, b in zip(t.data, g))
            self.assertLessEqual(worst, 2 ** -23 if name.endswith("norm.weight") else 0.0, name)
        self.replay(hp, params, unused, cases=["batch"])

    def test_selects_own_program(self):
        for w in (GGUFFile(os.path.join(self.dir, "model.gguf")), HFCheckpoint(os.path.join(self.dir, "hf"))):
            name, _, _, refusals = RI.select_program(PROGRAMS, w)
            self.assertEqual(name, self.arch, refusals)


for _arch in EXPECTED:
    if os.path.exists(os.path.join(GOLDEN, "%s_tiny" % _arch, "golden.json")) and \
            os.path.exists(os.path.join(PROGRAMS, _arch, "graph.json")):
        globals()["TestGolden_%s" % _arch] = type("TestGolden_%s" % _arch, (GoldenReplay, unittest.TestCase),
                                                  {"arch": _arch})


@unittest.skipUnless(os.path.exists(os.path.join(PROGRAMS, "llama", "graph.json")), "no programs/llama")
class TestLlamaRealFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.graph = load(os.path.join(PROGRAMS, "llama", "graph.json"))
        cls.pmap = load(os.path.join(PROGRAMS, "llama", "map.json"))

    @unittest.skipUnless(os.path.exists(os.path.join(SHARED, "stories260K", "expected_greedy.json")),
                         "no shared stories260K")
    def test_stories260k_greedy(self):
        d = os.path.join(SHARED, "stories260K")
        expected = load(os.path.join(d, "expected_greedy.json"))["runs"]["stories260K-F32.gguf"]["ids"]
        gg = GGUFFile(os.path.join(d, "stories260K-F32.gguf"))
        hp, params, unused = RI.bind_gguf(self.graph, self.pmap, gg)
        self.assertEqual((hp["n_layers"], hp["n_kv_heads"], hp["head_dim"]), (5, 4, 8))
        self.assertEqual(unused, [])  # tied embeddings: output.weight falls back to token_embd
        # a tied Llama has a Gemma GGUF's structure: only the llama program may take it
        name, _, _, refusals = RI.select_program(PROGRAMS, gg)
        self.assertEqual(name, "llama", refusals)
        prog = RI.Program(self.graph, hp, params)
        prog.check_shapes = False
        tok, got = 1, []
        n = 48
        for pos in range(n):
            out = prog.forward([tok], [pos], [0], [0])
            tok = RI._argmax(out.data)
            got.append(tok)
        self.assertEqual(got, expected[:n])

    @unittest.skipUnless(os.path.exists(os.path.join(SHARED, "llama-2-tiny-random", "llama-2-tiny-random.gguf")),
                         "no shared llama-2-tiny-random")
    def test_binds_f16_llama2(self):
        gg = GGUFFile(os.path.join(SHARED, "llama-2-tiny-random", "llama-2-tiny-random.gguf"))
        hp, params, unused = RI.bind_gguf(self.graph, self.pmap, gg)
        self.assertEqual((hp["vocab"], hp["d_model"], hp["head_dim"], hp["n_kv_heads"]), (32000, 8, 4, 2))
        self.assertEqual(unused, [])
        out = RI.Program(self.graph, hp, params).forward([1, 450, 4996], [0, 1, 2], [0, 0, 0], [2])
        self.assertEqual(out.shape, (1, 1, 32000))


if __name__ == "__main__":
    unittest.main()
