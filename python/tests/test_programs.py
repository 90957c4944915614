"""The committed artifacts agree with each other, checked with the pure-Python
interpreter (no torch): programs/llama (graph.json + map.json) replays the torch
goldens of tests/golden/llama_tiny, and reproduces stories260K's known greedy
continuation from ../shared/models when that folder is there.

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

PROGRAM = os.path.join(ROOT, "programs", "llama")
GOLDEN = os.path.join(ROOT, "tests", "golden", "llama_tiny")
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))


def load(path):
    with open(path) as f:
        return json.load(f)


@unittest.skipUnless(os.path.exists(os.path.join(PROGRAM, "graph.json")), "no programs/llama")
class TestLlamaProgram(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.graph = load(os.path.join(PROGRAM, "graph.json"))
        cls.pmap = load(os.path.join(PROGRAM, "map.json"))

    def test_structure(self):
        g = self.graph
        ir.validate(g, ir.CANONICAL_OPS)
        self.assertEqual([i["name"] for i in g["inputs"]], ["tokens", "positions", "seq_slots", "out_rows"])
        self.assertEqual(sum(1 for n in g["nodes"] if n["op"] == "repeat"), 1)
        self.assertEqual({p["name"] for p in g["params"]}, set(self.pmap["gguf"]["params"]))
        self.assertTrue(set(g["hparams"]) <= set(self.pmap["gguf"]["hparams"]))

    @unittest.skipUnless(os.path.exists(os.path.join(GOLDEN, "golden.json")), "no llama_tiny golden")
    def test_golden_replay(self):
        golden = load(os.path.join(GOLDEN, "golden.json"))
        hp, params, unused = RI.bind_gguf(self.graph, self.pmap, GGUFFile(os.path.join(GOLDEN, "model.gguf")))
        self.assertEqual(unused, [])
        res = RI.check_golden(RI.Program(self.graph, hp, params), golden, log=lambda *a: None)
        for name, st in res.items():
            self.assertLess(st.max_rel, 1e-4, name)
            self.assertEqual(st.argmax_mismatch, 0, name)
        self.assertGreaterEqual(sum(st.rows for st in res.values()), 32)

    @unittest.skipUnless(os.path.exists(os.path.join(SHARED, "stories260K", "expected_greedy.json")),
                         "no shared stories260K")
    def test_stories260k_greedy(self):
        d = os.path.join(SHARED, "stories260K")
        expected = load(os.path.join(d, "expected_greedy.json"))["runs"]["stories260K-F32.gguf"]["ids"]
        gg = GGUFFile(os.path.join(d, "stories260K-F32.gguf"))
        hp, params, unused = RI.bind_gguf(self.graph, self.pmap, gg)
        self.assertEqual((hp["n_layers"], hp["n_kv_heads"], hp["head_dim"]), (5, 4, 8))
        self.assertEqual(unused, [])  # tied embeddings: output.weight falls back to token_embd
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
