#!/usr/bin/env python3
"""Reference token ids for llmopt's tokenizer tests, from real implementations.

Writes tests/golden/tokenizers/<name>.json, each {"reference", "source", "vectors":
[{"text", "ids", "ids_no_special"}]}: `ids` with special tokens parsed (control and
added tokens written in the text become their ids), `ids_no_special` with control
tokens kept as text (user-defined added tokens are still recognised, as in Hugging
Face's encode_special_tokens and llama.cpp's parse_special=false). No BOS/EOS added.

References, built from the SAME files the C tests load (under --shared, default
../shared):
  qwen3-hf       models/qwen3-tokenizer (vocab.json + merges.txt +
                 tokenizer_config.json) through transformers' AutoTokenizer, checked
                 against a `tokenizers` BPE built by hand from the same files
  qwen2-gguf     tokenizers/ggml-vocab-qwen2.gguf: tokens, types and merges read from
                 the GGUF here (no `gguf` package), a `tokenizers` BPE with the
                 tokenizer's NFC normalizer and its Split regex + ByteLevel
  llama-bpe-gguf tokenizers/ggml-vocab-llama-bpe.gguf: same, Llama 3's regex and
                 ignore_merges
  llama-spm      models/llama2-tokenizer/tokenizer.model through sentencepiece;
                 the vocab of tokenizers/ggml-vocab-llama-spm.gguf is checked to be
                 the same model. sentencepiece has no special-token parsing: with
                 specials parsed, the text is cut at control/unknown pieces and each
                 fragment encoded alone (what llama.cpp does).

With --nfc-tables FILE it instead writes the Unicode tables of src/tokenizer/nfc.c
(canonical combining classes, canonical decompositions, primary compositions) from
this Python's unicodedata, and needs nothing else.

Needs `tokenizers`, `sentencepiece` and `transformers` (the GPU machine has them; CI
does not run this script, it reads the committed vectors). Run:
  python3 scripts/tokenizer_vectors.py [--shared ../shared] [--out tests/golden/tokenizers]
"""

import argparse
import json
import os
import random
import struct
import sys
import traceback

# Split regexes, as in the models' tokenizer.json files (and src/tokenizer/pretok.c).
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GGUF pre-tokenizer name -> (regex, NFC normalizer, ignore_merges)
PRE = {
    "qwen2": (QWEN2_RE, True, False),
    "llama-bpe": (LLAMA3_RE, False, True),
    "gpt2": (GPT2_RE, False, False),
}

DEBUG_WORDS = {}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

# ---- corpus ------------------------------------------------------------------------

FIXED = [
    "",
    "Hello world",
    "Hello, my dog is cute",
    " leading space and  double  spaces",
    "trailing spaces   ",
    " ",
    "  ",
    "      ",
    "\n",
    "\n\n\n",
    "\t",
    " \t\n ",
    "a  b   c    d",
    "    indented code",
    "line1\r\nline2\r\n",
    "\r",
    "tabs\tand\nnewlines\n\n",
    "word\n  next\n\n  \nend",
    "1", "12", "123", "1234", "12345678901234567890",
    "numbers 1234567 and 3.14159",
    "1,000,000.50 and -42 and +7",
    "v2.0.1 on 2024-06-01 at 12:30:45",
    "\u0663\u0664\u0665 and \u2460\u2461 and x\u00b2",
    "日本語のテキスト",
    "中文分词测试，你好世界！",
    "한국어 텍스트입니다",
    "カタカナとひらがな",
    "Hello世界123abc",
    "emoji 😀👍🏽",
    "😀",
    "👨‍👩‍👧‍👦 family",
    "flags 🇫🇷🇯🇵",
    "café naïve résumé",
    "Zürich Straße ñandú",
    "Ελληνικά κείμενα",
    "Русский текст, ёлка",
    "עברית ועוד",
    "العربية هنا",
    "हिन्दी पाठ",
    "ภาษาไทย",
    "cafe\u0301 (decomposed)",
    "A\u030angstr\u00f6m",
    "\u1100\u1161\u11a8 jamo",
    "e\u0301\u0301 double",
    "can't won't I'm you're",
    "I'LL WE'VE THEY'D SHE'S",
    "it's 'quoted' rock 'n' roll O'Neil's",
    "don't\nstop",
    "def f(x):\n    return x**2\n",
    "<html><body class=\"x\">hi</body></html>",
    "a+b=c; x->y && z||w",
    "!!!???...---",
    "path/to/file.txt https://example.com/a?b=c&d=e#f",
    "email@example.com",
    "\"quoted\" and 'single'",
    "(parens) [brackets] {braces}",
    "$100 €50 ¥1000 £5",
    "\u00a0nbsp\u00a0here",
    "ideographic\u3000space",
    "line\u2028separator",
    "vt\x0bff\x0c",
    "nel\u0085next",
    "zero\u200bwidth",
    "soft\u00adhyphen",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    " <|im_end|> ",
    "<<|im_end|>>",
    "<|im_start",
    "<think>\n\n</think>\n\n",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|begin_of_text|>Hi<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<|reserved_special_token_5|>",
    "[PAD151650] pad",
    "<s>Hi</s>",
    "<s> Hi </s>",
    "<unk>",
    "a<s>b",
    ("Once upon a time, there was a little girl named Lily. She loved to play outside "
     "in the sunshine. One day, she saw a big, red ball in the park! \"Can I play?\" "
     "she asked.\n\nThe boy said, \"Yes, let's play together.\" They played until "
     "6:30 pm, then went home   happy."),
]

# Pieces the random strings are built from: every class the regexes treat apart.
ALPHABET = [
    "a", "b", "Z", "the", "ing", " ", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "0", "7",
    "42", "1234", ".", ",", "!", "?", "'", "'s", "'t", "'LL", "-", "_", "(", ")", "\"", "/",
    "é", "ü", "ß", "ñ", "e\u0301", "\u0301", "日", "本", "語", "中", "文", "한", "ア", "😀",
    "👍🏽", "🇫🇷", "\u200d", "\u00a0", "\u3000", "Ω", "Ж", "ع", "\u0663", "²", "$", "€",
    "<", ">", "|", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|eot_id|>", "<think>",
]


def corpus():
    rng = random.Random(20240601)
    texts = list(FIXED)
    for _ in range(300):
        n = rng.randint(1, 24)
        texts.append("".join(rng.choice(ALPHABET) for _ in range(n)))
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


# ---- GGUF metadata (pure Python) ------------------------------------------------------

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
        10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path):
    """The metadata key/values of a GGUF v2/v3 file (tensor infos are not read)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", errors="surrogateescape")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            at, n = take("<I"), take("<Q")
            return [value(at) for _ in range(n)]
        return take(_FMT[t])

    version = take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    take("<Q")  # tensors
    n_kv = take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    return kv


# ---- references ------------------------------------------------------------------------

def encode_pair(enc_special, enc_plain, texts):
    return [{"text": t, "ids": list(enc_special(t)), "ids_no_special": list(enc_plain(t))}
            for t in texts]


def bpe_tokenizer(vocab, merges, pattern, nfc, ignore_merges, control, user_defined):
    """A `tokenizers` byte-level BPE: Split(regex, isolated) + ByteLevel, as the
    models' tokenizer.json files declare."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    tok = Tokenizer(model)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
    return tok


def tokenizers_encoders(tok):
    """Encoders with and without special-token parsing for a tokenizers.Tokenizer."""
    def special(t):
        tok.encode_special_tokens = False
        return tok.encode(t, add_special_tokens=False).ids

    def plain(t):
        tok.encode_special_tokens = True
        try:
            return tok.encode(t, add_special_tokens=False).ids
        finally:
            tok.encode_special_tokens = False
    return special, plain


def ref_bpe_gguf(path, texts):
    kv = read_gguf_kv(path)
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    pre = kv.get("tokenizer.ggml.pre", "gpt2")
    pattern, nfc, ignore_merges = PRE[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    control = [t for t, ty in zip(tokens, types) if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
    user = [t for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tok = bpe_tokenizer(vocab, merges, pattern, nfc, ignore_merges, control, user)
    for t in FIXED:  # the words, for debugging a mismatch (log.txt, not committed)
        DEBUG_WORDS.setdefault(os.path.basename(path), []).append(
            [t, [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(
                tok.normalizer.normalize_str(t) if tok.normalizer else t)]])
    import tokenizers
    desc = (f"tokenizers {tokenizers.__version__}: BPE(vocab, merges from the GGUF, "
            f"ignore_merges={ignore_merges}), normalizer {'NFC' if nfc else 'none'}, "
            f"Split(regex of tokenizer.ggml.pre '{pre}', isolated) + ByteLevel; "
            f"{len(control)} control and {len(user)} user-defined tokens added")
    return desc, encode_pair(*tokenizers_encoders(tok), texts)


def ref_qwen3_dir(d, texts, log):
    """transformers' own Qwen2Tokenizer on the directory, checked against a
    tokenizers BPE built from vocab.json + merges.txt + added_tokens_decoder."""
    with open(os.path.join(d, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    merges = []
    with open(os.path.join(d, "merges.txt"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.rstrip("\r\n")
            if (i == 0 and line.startswith("#version")) or not line:
                continue
            a, b = line.split(" ", 1)
            merges.append((a, b))
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    added = sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    tok = bpe_tokenizer(vocab, merges, QWEN2_RE, True, False, [], [])
    from tokenizers import AddedToken
    for id_, t in added:  # in id order: tokenizers appends them after the vocab
        at = AddedToken(t["content"], special=t["special"], normalized=False)
        if t["special"]:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        assert tok.token_to_id(t["content"]) == int(id_), f"added token {t['content']} id"
    manual = encode_pair(*tokenizers_encoders(tok), texts)

    try:
        import transformers
        hf = transformers.AutoTokenizer.from_pretrained(d)
        backend = hf.backend_tokenizer
        special, plain = tokenizers_encoders(backend)

        def hf_special(t):
            return hf.encode(t, add_special_tokens=False)
        auto = encode_pair(hf_special, plain, texts)
        for t in texts:  # the backend and the wrapper agree
            assert hf_special(t) == special(t), f"transformers wrapper vs backend on {t!r}"
        diff = [a["text"] for a, m in zip(auto, manual) if a != m]
        log(f"qwen3-hf: transformers {transformers.__version__} ({type(hf).__name__}) vs "
            f"hand-built tokenizers BPE: {len(diff)} of {len(texts)} texts differ")
        for t in diff[:20]:
            log(f"  differs: {t!r}")
        desc = (f"transformers {transformers.__version__} AutoTokenizer ({type(hf).__name__}) "
                f"on the directory; encode(add_special_tokens=False); no-special ids with "
                f"the backend's encode_special_tokens; agrees with a hand-built tokenizers "
                f"BPE on {len(texts) - len(diff)} of {len(texts)} texts")
        return desc, auto
    except Exception:  # transformers missing or failing: the hand-built reference
        log("qwen3-hf: transformers failed, using the hand-built tokenizers BPE:\n"
            + traceback.format_exc())
        import tokenizers
        return (f"tokenizers {tokenizers.__version__}: BPE from vocab.json + merges.txt, "
                f"NFC, Split(Qwen2 regex, isolated) + ByteLevel, added_tokens_decoder"), manual


def ref_spm(model_path, gguf_path, texts, log):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = sp.get_piece_size()
    specials = [sp.id_to_piece(i) for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
    specials.sort(key=len, reverse=True)

    def plain(t):
        return sp.encode(t) if t else []

    def special(t):
        ids, frag, i = [], "", 0
        while i < len(t):
            for s in specials:  # longest first, at the leftmost position
                if t.startswith(s, i):
                    if frag:
                        ids += plain(frag)
                        frag = ""
                    ids.append(sp.piece_to_id(s))
                    i += len(s)
                    break
            else:
                frag += t[i]
                i += 1
        return ids + plain(frag) if frag else ids

    same = None
    if gguf_path and os.path.exists(gguf_path):
        kv = read_gguf_kv(gguf_path)
        toks, scores = kv["tokenizer.ggml.tokens"], kv.get("tokenizer.ggml.scores")
        same = (len(toks) == n and all(toks[i] == sp.id_to_piece(i) for i in range(n)) and
                scores is not None and all(abs(scores[i] - sp.get_score(i)) < 1e-6 for i in range(n)))
        log(f"llama-spm: the GGUF vocab {'equals' if same else 'DIFFERS FROM'} tokenizer.model")
    desc = (f"sentencepiece {spm.__version__} on tokenizer.model, encode(text) (no BOS); "
            f"with specials parsed, the text cut at control/unknown pieces and each fragment "
            f"encoded alone (llama.cpp's rule). ggml-vocab-llama-spm.gguf holds the same "
            f"pieces and scores: {same}")
    return desc, encode_pair(special, plain, texts)


def write_vectors(path, desc, source, vectors):
    """One vector per line; text escaped to ASCII so no editor can alter it."""
    with open(path, "w", encoding="ascii") as f:
        f.write("{\n")
        f.write(f' "generator": {json.dumps("scripts/tokenizer_vectors.py")},\n')
        f.write(f' "reference": {json.dumps(desc)},\n')
        f.write(f' "source": {json.dumps(source)},\n')
        f.write(' "vectors": [\n')
        for i, v in enumerate(vectors):
            sep = "," if i + 1 < len(vectors) else ""
            f.write("  " + json.dumps(v, separators=(",", ":")) + sep + "\n")
        f.write(" ]\n}\n")


def check_shared_reference(shared, name, vectors, log):
    """Logs agreement with the reference_encodings.json shipped beside the files."""
    rel = {"qwen3-hf": "models/qwen3-tokenizer/reference_encodings.json",
           "llama-spm": "models/llama2-tokenizer/reference_encodings.json"}.get(name)
    path = rel and os.path.join(shared, rel)
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        ref = {e["text"]: e["ids"] for e in json.load(f)["encodings"]}
    ours = {v["text"]: v["ids"] for v in vectors}
    common = [t for t in ref if t in ours]
    bad = [t for t in common if ref[t] != ours[t]]
    log(f"{name}: {len(common) - len(bad)} of {len(common)} texts agree with {rel}")
    for t in bad:
        log(f"  {t!r}: {ours[t]} vs {ref[t]}")


def versions():
    out = [f"python {sys.version.split()[0]}"]
    for mod in ("tokenizers", "sentencepiece", "transformers"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except Exception as e:  # noqa: BLE001 - reported, not fatal here
            out.append(f"{mod} missing ({e.__class__.__name__})")
    return ", ".join(out)


def write_nfc_tables(path):
    """Tables for NFC (UAX #15): ccc ranges, canonical decompositions (one level, so
    the C code recurses), primary composites (pairs whose composite NFC keeps)."""
    import unicodedata as ud
    ccc, dec = {}, {}
    for cp in range(0x110000):
        c = chr(cp)
        if ud.combining(c):
            ccc[cp] = ud.combining(c)
        d = ud.decomposition(c)
        if d and not d.startswith("<"):
            dec[cp] = [int(x, 16) for x in d.split()]
    ranges = []
    for cp in sorted(ccc):
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == ccc[cp]:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, ccc[cp]])
    comp = sorted((v[0], v[1], cp) for cp, v in dec.items()
                  if len(v) == 2 and ud.normalize("NFC", chr(cp)) == chr(cp))
    # every code point below U+0300 is a starter that nothing combines onto: the
    # fast path of nfc.c relies on it
    assert min(ccc) >= 0x300 and min(b for _, b, _ in comp) >= 0x300
    with open(path, "w", encoding="ascii") as f:
        f.write(f"/* Generated by scripts/tokenizer_vectors.py --nfc-tables from Python's "
                f"unicodedata\n * (Unicode {ud.unidata_version}). Do not edit. */\n")
        f.write(f"#define NFC_UNICODE_VERSION \"{ud.unidata_version}\"\n\n")
        f.write("/* (first, last, canonical combining class), ascending */\n")
        f.write(f"static const uint32_t nfc_ccc[{len(ranges)}][3] = {{\n")
        for a, b, c in ranges:
            f.write(f"    {{0x{a:x}, 0x{b:x}, {c}}},\n")
        f.write("};\n\n/* (code point, first, second or 0): canonical decomposition, "
                "ascending */\n")
        f.write(f"static const uint32_t nfc_decomp[{len(dec)}][3] = {{\n")
        for cp in sorted(dec):
            v = dec[cp] + [0]
            f.write(f"    {{0x{cp:x}, 0x{v[0]:x}, 0x{v[1]:x}}},\n")
        f.write("};\n\n/* (first, second, composite): primary composites, ascending */\n")
        f.write(f"static const uint32_t nfc_comp[{len(comp)}][3] = {{\n")
        for a, b, c in comp:
            f.write(f"    {{0x{a:x}, 0x{b:x}, 0x{c:x}}},\n")
        f.write("};\n")


# ---- main ------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--out", default="tests/golden/tokenizers")
    ap.add_argument("--only", default="", help="comma-separated names to build")
    ap.add_argument("--nfc-tables", metavar="FILE", help="write src/tokenizer/nfc_tables.h")
    args = ap.parse_args()
    if args.nfc_tables:
        write_nfc_tables(args.nfc_tables)
        return 0
    os.makedirs(args.out, exist_ok=True)
    texts = corpus()
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    log(versions())
    log(f"{len(texts)} texts")

    jobs = {
        "qwen3-hf": ("models/qwen3-tokenizer",
                     lambda p: ref_qwen3_dir(p, texts, log)),
        "qwen2-gguf": ("tokenizers/ggml-vocab-qwen2.gguf", lambda p: ref_bpe_gguf(p, texts)),
        "llama-bpe-gguf": ("tokenizers/ggml-vocab-llama-bpe.gguf",
                           lambda p: ref_bpe_gguf(p, texts)),
        "llama-spm": ("models/llama2-tokenizer/tokenizer.model",
                      lambda p: ref_spm(p, os.path.join(args.shared,
                                                        "tokenizers/ggml-vocab-llama-spm.gguf"),
                                        texts, log)),
    }
    only = [s for s in args.only.split(",") if s]
    failed = 0
    for name, (rel, fn) in jobs.items():
        if only and name not in only:
            continue
        try:
            desc, vectors = fn(os.path.join(args.shared, rel))
        except Exception:
            log(f"{name}: FAILED\n" + traceback.format_exc())
            failed += 1
            continue
        check_shared_reference(args.shared, name, vectors, log)
        path = os.path.join(args.out, name + ".json")
        write_vectors(path, desc, "../shared/" + rel, vectors)
        log(f"{name}: {len(vectors)} vectors -> {path}")
    with open(os.path.join(args.out, "log.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "words.json"), "w", encoding="ascii") as f:
        json.dump(DEBUG_WORDS, f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
