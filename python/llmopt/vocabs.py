"""Small dummy vocabularies for golden GGUF files (pure Python), shaped like the ones
llama.cpp's converter writes: SentencePiece-style ("llama": Llama 2, Gemma) and
byte-level BPE ("gpt2": Qwen2/Qwen3, with merges). They only have to be well-formed and
as long as the model's vocab; no text is tokenized with them in the parity tests.
"""

from .gguf_writer import (FLOAT32, INT32, STRING, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL,
                          TOKEN_UNKNOWN)

_LETTERS = "etaoinshrdlucmfwypvbgkjqxz"


def spm_vocab(n, specials):
    """`specials`: list of (piece, token type) placed first (e.g. <unk>, <s>, </s>), then the
    256 byte tokens <0xXX>, then filler pieces. Returns tokens, scores, types."""
    tokens = [p for p, _ in specials]
    types = [t for _, t in specials]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(TOKEN_BYTE)
    k = 0
    seen = set(tokens)
    while len(tokens) < n:
        a, b = divmod(k, len(_LETTERS))
        piece = ("\u2581" if a % 2 == 0 else "") + _LETTERS[b] + (_LETTERS[a // 2 % len(_LETTERS)] if a >= 2 else "")
        k += 1
        if piece in seen:
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(TOKEN_NORMAL)
    if len(tokens) > n:
        raise ValueError("vocab of %d is too small for %d specials + 256 bytes" % (n, len(specials)))
    n_fixed = len(specials) + 256
    scores = [0.0] * n_fixed + [-float(i) for i in range(n - n_fixed)]
    return tokens, scores, types


def bytes_to_unicode():
    """The byte -> printable character table of byte-level BPE (GPT-2): printable Latin-1
    bytes map to themselves, the others to code points 256, 257, ... in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def bpe_vocab(n, specials):
    """Byte-level BPE: the 256 byte symbols (in byte order), merged tokens, then the
    `specials` (control tokens) at the end. Returns tokens, types, merges."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [TOKEN_NORMAL] * 256
    merges = []
    n_merged = n - 256 - len(specials)
    if n_merged < 0:
        raise ValueError("vocab of %d is too small for 256 bytes + %d specials" % (n, len(specials)))
    space = b2u[ord(" ")]
    seen = set(tokens)
    cands = [(space, c) for c in _LETTERS] + [(a, b) for a in "thaeion" for b in _LETTERS]
    for a, b in cands:
        if len(merges) >= n_merged:
            break
        if a + b in seen:
            continue
        seen.add(a + b)
        merges.append("%s %s" % (a, b))
        tokens.append(a + b)
        types.append(TOKEN_NORMAL)
    if len(merges) < n_merged:
        raise ValueError("not enough merge candidates for a vocab of %d" % n)
    for piece in specials:
        tokens.append(piece)
        types.append(TOKEN_CONTROL)
    return tokens, types, merges


def add_tokenizer(w, kind, n, ids):
    """Writes tokenizer.ggml.* keys of a dummy vocab of `n` tokens to GGUFWriter `w`.
    kind: "llama" (Llama 2 layout), "gemma" (SentencePiece, Gemma's special ids) or
    "qwen2" (byte-level BPE with Qwen's specials). `ids`: bos/eos/pad token ids."""
    if kind == "llama":
        tokens, scores, types = spm_vocab(n, [("<unk>", TOKEN_UNKNOWN), ("<s>", TOKEN_CONTROL),
                                              ("</s>", TOKEN_CONTROL)])
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", STRING, tokens)
        w.add_array("tokenizer.ggml.scores", FLOAT32, scores)
        w.add_array("tokenizer.ggml.token_type", INT32, types)
        w.add_u32("tokenizer.ggml.bos_token_id", ids.get("bos_token_id", 1))
        w.add_u32("tokenizer.ggml.eos_token_id", ids.get("eos_token_id", 2))
        w.add_u32("tokenizer.ggml.unknown_token_id", 0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_bool("tokenizer.ggml.add_eos_token", False)
    elif kind == "gemma":
        tokens, scores, types = spm_vocab(n, [("<pad>", TOKEN_CONTROL), ("<eos>", TOKEN_CONTROL),
                                              ("<bos>", TOKEN_CONTROL), ("<unk>", TOKEN_UNKNOWN)])
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", STRING, tokens)
        w.add_array("tokenizer.ggml.scores", FLOAT32, scores)
        w.add_array("tokenizer.ggml.token_type", INT32, types)
        w.add_u32("tokenizer.ggml.bos_token_id", ids.get("bos_token_id", 2))
        w.add_u32("tokenizer.ggml.eos_token_id", ids.get("eos_token_id", 1))
        w.add_u32("tokenizer.ggml.unknown_token_id", 3)
        w.add_u32("tokenizer.ggml.padding_token_id", ids.get("pad_token_id", 0))
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_bool("tokenizer.ggml.add_eos_token", False)
        w.add_bool("tokenizer.ggml.add_space_prefix", False)
    elif kind == "qwen2":
        tokens, types, merges = bpe_vocab(n, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_string("tokenizer.ggml.pre", "qwen2")
        w.add_array("tokenizer.ggml.tokens", STRING, tokens)
        w.add_array("tokenizer.ggml.token_type", INT32, types)
        w.add_array("tokenizer.ggml.merges", STRING, merges)
        w.add_u32("tokenizer.ggml.bos_token_id", ids.get("bos_token_id", n - 3))
        w.add_u32("tokenizer.ggml.eos_token_id", ids.get("eos_token_id", n - 1))
        w.add_u32("tokenizer.ggml.padding_token_id", ids.get("bos_token_id", n - 3))
        w.add_bool("tokenizer.ggml.add_bos_token", False)
    else:
        raise ValueError("unknown tokenizer kind %r" % kind)
