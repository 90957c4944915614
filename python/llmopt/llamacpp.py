"""How llama.cpp's convert_hf_to_gguf.py lays a Hugging Face checkpoint out as GGUF, for
the architectures llmopt ships programs for. An emulation written from the converter's
behaviour, independent of programs/*/map.json: goldens written with it test the maps.

Pure Python: tensors are (row-major shape, flat list of floats); the output is F32.

What the converter does, per architecture (HF class -> GGUF general.architecture):
- LlamaForCausalLM -> "llama" (LlamaModel): Q and K weight rows (and biases) permuted
  for llama.cpp's interleaved RoPE (`LlamaModel.permute`); writes vocab_size and
  rope.dimension_count.
- Qwen2ForCausalLM -> "qwen2", Qwen3ForCausalLM -> "qwen3" (Qwen2Model / Qwen3Model):
  no permutation (llama.cpp runs them with NEOX RoPE, HF's split-halves order).
- GemmaForCausalLM -> "gemma" (GemmaModel): no permutation (NEOX RoPE); every tensor
  whose name ends in "norm.weight" is stored as w + 1; lm_head.weight is skipped; key
  and value length always written, rope.freq_base never.
- Lfm2ForCausalLM -> "lfm2" (LFM2Model): per-layer attention.head_count_kv, an INT32 array
  (num_key_value_heads on full_attention layers, 0 on conv layers: set_gguf_parameters
  rewrites hparams["num_key_value_heads"] from layer_types before the generic keys);
  shortconv.l_cache (conv_L_cache); vocab_size; layer_norm_rms_epsilon from norm_eps;
  feed_forward_length after LFM2's auto-adjustment (block_auto_adjust_ff_dim: 2/3 of
  block_ff_dim, times block_ffn_dim_multiplier, rounded up to block_multiple_of); the
  "conv.conv" kernel squeezed from [C, 1, L] to [C, L]; no permutation (NEOX RoPE).
  Names: operator_norm -> attn_norm, feed_forward.w1/w3/w2 -> ffn_gate/up/down,
  self_attn.out_proj -> attn_output, q_layernorm/k_layernorm -> attn_q_norm/attn_k_norm,
  conv.{conv,in_proj,out_proj} -> shortconv.{conv,in_proj,out_proj}, embedding_norm ->
  token_embd_norm.
- Tied checkpoints have no lm_head.weight in their safetensors: no output.weight.
Metadata from TextModel.set_gguf_parameters: context_length, embedding_length,
feed_forward_length, head_count, head_count_kv, rope.freq_base (if rope_theta),
layer_norm_rms_epsilon, key_length/value_length (if config.json has head_dim),
block_count, general.file_type.
"""

import re

from .gguf_writer import GGUFWriter

GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "GemmaForCausalLM": "gemma", "Lfm2ForCausalLM": "lfm2"}

# gguf-py tensor_mapping, the Llama-like block layout: HF module path -> GGUF base name.
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
        "model.embedding_norm": "token_embd_norm"}
_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    # LFM2
    "operator_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down",
    "self_attn.out_proj": "attn_output",
    "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm",
    "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj",
    "conv.out_proj": "shortconv.out_proj",
}


def gguf_tensor_name(hf_name):
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if m:
        return "blk.%s.%s.%s" % (m.group(1), _BLOCK[m.group(2)], m.group(3))
    m = re.fullmatch(r"(.+)\.(weight|bias)", hf_name)
    if m and m.group(1) in _TOP:
        return "%s.%s" % (_TOP[m.group(1)], m.group(2))
    raise KeyError("no GGUF name for %r" % hf_name)


def llama_permute(shape, data, n_head, n_head_kv=None):
    """LlamaModel.permute: w.reshape(n_head, 2, rows/n_head/2, *rest).swapaxes(1, 2)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    rows = shape[0]
    k = 1
    for d in shape[1:]:
        k *= d
    half = rows // n_head // 2
    out = [None] * len(data)
    for h in range(n_head):
        for two in range(2):
            for j in range(half):
                src = (h * 2 + two) * half + j          # index in [n_head, 2, half]
                dst = (h * half + j) * 2 + two          # index in [n_head, half, 2]
                out[dst * k:(dst + 1) * k] = data[src * k:(src + 1) * k]
    return out


def _cfg(config, *paths, default=None):
    for p in paths:
        v = config
        for part in p.split("."):
            if not isinstance(v, dict) or part not in v:
                v = None
                break
            v = v[part]
        if v is not None:
            return v
    return default


def convert(config, tensors):
    """config: config.json as a dict; tensors: the checkpoint's safetensors content,
    name -> (shape, flat data). Returns (arch, [(key, kind, value)], [(name, shape, data)])."""
    archs = config.get("architectures") or []
    if len(archs) != 1 or archs[0] not in GGUF_ARCH:
        raise ValueError("architectures %r: not one this emulation knows" % (archs,))
    hf_arch = archs[0]
    arch = GGUF_ARCH[hf_arch]
    n_head = config["num_attention_heads"]
    n_kv = _cfg(config, "num_key_value_heads", default=n_head)
    ff = config.get("intermediate_size")
    if arch == "lfm2":
        n_kv = [n_kv if t == "full_attention" else 0 for t in config["layer_types"]]
        ff = _cfg(config, "block_ff_dim", "intermediate_size")
        if config.get("block_auto_adjust_ff_dim"):
            ff = int(2 * ff / 3)
            if config.get("block_ffn_dim_multiplier") is not None:
                ff = int(config["block_ffn_dim_multiplier"] * ff)
            mult = config.get("block_multiple_of", 256)
            ff = mult * ((ff + mult - 1) // mult)
    kv = [
        ("general.architecture", "str", arch),
        ("general.file_type", "u32", 0),  # ALL_F32
        ("%s.context_length" % arch, "u32", config["max_position_embeddings"]),
        ("%s.embedding_length" % arch, "u32", config["hidden_size"]),
        ("%s.block_count" % arch, "u32", config["num_hidden_layers"]),
        ("%s.feed_forward_length" % arch, "u32", ff),
        ("%s.attention.head_count" % arch, "u32", n_head),
        ("%s.attention.head_count_kv" % arch, "i32[]" if isinstance(n_kv, list) else "u32", n_kv),
    ]
    theta = _cfg(config, "rope_theta", "rope_parameters.rope_theta")
    if theta is not None and arch != "gemma":
        kv.append(("%s.rope.freq_base" % arch, "f32", float(theta)))
    kv.append(("%s.attention.layer_norm_rms_epsilon" % arch, "f32",
               float(config["norm_eps"] if arch == "lfm2" else config["rms_norm_eps"])))
    head_dim = config.get("head_dim")
    if head_dim is not None:
        kv.append(("%s.attention.key_length" % arch, "u32", head_dim))
        kv.append(("%s.attention.value_length" % arch, "u32", head_dim))
    if arch == "lfm2":
        kv.append(("lfm2.vocab_size", "u32", config["vocab_size"]))
        kv.append(("lfm2.shortconv.l_cache", "u32", config["conv_L_cache"]))
    if arch == "llama":
        kv.append(("llama.vocab_size", "u32", config["vocab_size"]))
        kv.append(("llama.rope.dimension_count", "u32", head_dim or config["hidden_size"] // n_head))
    out = []
    for name in sorted(tensors):
        shape, data = tensors[name]
        if name == "lm_head.weight" and arch == "gemma":
            continue
        if arch == "llama":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = llama_permute(shape, data, n_head, n_head)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                data = llama_permute(shape, data, n_head, n_kv)
        if arch == "gemma" and name.endswith("norm.weight"):
            data = [x + 1.0 for x in data]
        if arch == "lfm2" and "conv.conv" in name and len(shape) == 3 and shape[1] == 1:
            shape = [shape[0], shape[2]]  # data_torch.squeeze(1)
        out.append((gguf_tensor_name(name), list(shape), data))
    return arch, kv, out


def write_gguf(config, tensors, name, tokenizer, path=None):
    """GGUF bytes (and the file at `path`) of a checkpoint as the converter writes it, with
    a dummy vocab: tokenizer(w, arch) adds the tokenizer.ggml.* keys."""
    arch, kv, out = convert(config, tensors)
    w = GGUFWriter()
    for key, kind, value in kv[:1]:
        w.add_string(key, value)
    w.add_string("general.name", name)
    for key, kind, value in kv[1:]:
        if kind == "u32":
            w.add_u32(key, int(value))
        elif kind == "f32":
            w.add_f32(key, value)
        elif kind == "i32[]":
            from .gguf_writer import INT32
            w.add_array(key, INT32, [int(v) for v in value])
        else:
            w.add_string(key, value)
    tokenizer(w, arch)
    for tname, shape, data in out:
        w.add_tensor_f32(tname, shape, data)
    blob = w.to_bytes()
    if path:
        with open(path, "wb") as f:
            f.write(blob)
    return blob
