"""What capture knows about each architecture: (a) how to build the Hugging Face model
from hyper-parameters, (b) the parameter map (GGUF tensor names as llama.cpp's converter
writes them, and Hugging Face safetensors names with config.json hparams), (c) probe
sizes, (d) the small golden configuration. Everything else (export, conversion, repeat
extraction, checks) is generic.

Hyper-parameter names (the graph's symbols): vocab, d_model, d_ff, n_layers, n_heads,
n_kv_heads, head_dim, rms_eps, rope_theta. Every map also binds `max_positions` (the
trained context length), which the runtime reads but no graph uses.
"""

import copy
import inspect

# Probe values: every dimension expression that can appear in a graph has a distinct
# value (none equal to 0, 1 or 2), so each concrete size seen in the exported graph
# maps back to exactly one expression. Floats likewise. The explicit head_dim (22) is not
# d_model/n_heads (7), so graphs keep the two apart (Qwen3 and Gemma need that).
PROBE = {
    "vocab": 211,
    "d_model": 105,
    "d_ff": 97,
    "n_layers": 2,
    "n_heads": 15,
    "n_kv_heads": 5,
    "head_dim": 22,
    "rms_eps": 1.2345e-5,
    "rope_theta": 12345.0,
}

# Integer expressions a concrete dimension may stand for (checked unambiguous at the probe).
DIM_EXPRS = [
    "vocab", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim", "head_dim/2",
    "n_heads*head_dim", "n_kv_heads*head_dim", "n_heads/n_kv_heads", "d_model/n_heads",
]
# Float expressions a scalar constant may stand for.
FLOAT_EXPRS = ["rms_eps", "head_dim^-0.5", "rope_theta"]

HPARAMS = ["vocab", "d_model", "d_ff", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rms_eps", "rope_theta"]


# --------------------------------------------------------------------------- configs

def _config_fields(cls):
    names = set(inspect.signature(cls.__init__).parameters)
    names |= {f.name for f in getattr(cls, "__dataclass_fields__", {}).values()}
    return names


def _rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    if getattr(cfg, "rope_theta", None) is not None:
        return float(cfg.rope_theta)
    return None


def make_config(arch, hp):
    """The transformers config of `arch` for hyper-parameters `hp` (probe or golden).

    Keys the config class does not declare are left out, except head_dim when it differs
    from d_model/n_heads (Qwen2's attention reads an undeclared head_dim attribute too)."""
    import transformers
    cls = getattr(transformers, arch.config_class)
    fields = _config_fields(cls)
    kw = dict(
        vocab_size=hp["vocab"],
        hidden_size=hp["d_model"],
        intermediate_size=hp["d_ff"],
        num_hidden_layers=hp["n_layers"],
        num_attention_heads=hp["n_heads"],
        num_key_value_heads=hp["n_kv_heads"],
        rms_norm_eps=hp["rms_eps"],
        max_position_embeddings=int(hp.get("max_positions", 4096)),
        tie_word_embeddings=bool(hp.get("tied", False)),
    )
    kw.update(arch.config_extra)
    kw.update(hp.get("tokens", {}))
    kw = {k: v for k, v in kw.items() if k in fields}
    if "head_dim" in fields or hp["head_dim"] * hp["n_heads"] != hp["d_model"]:
        kw["head_dim"] = hp["head_dim"]
    rope = {"rope_type": "default", "rope_theta": hp["rope_theta"]}
    if "rope_parameters" in fields:
        cfg = cls(rope_parameters=dict(rope), **kw)
    else:
        cfg = cls(rope_theta=hp["rope_theta"], **kw)
    if _rope_theta(cfg) != float(hp["rope_theta"]):
        for attr, val in (("rope_parameters", dict(rope)), ("rope_theta", hp["rope_theta"])):
            try:
                setattr(cfg, attr, val)
            except Exception:
                pass
    theta = _rope_theta(cfg)
    if theta != float(hp["rope_theta"]):
        raise RuntimeError("%s did not take rope_theta=%r (got %r)" % (arch.config_class, hp["rope_theta"], theta))
    got_hd = getattr(cfg, "head_dim", None) or hp["d_model"] // hp["n_heads"]
    if got_hd != hp["head_dim"]:
        raise RuntimeError("%s did not take head_dim=%r (got %r)" % (arch.config_class, hp["head_dim"], got_hd))
    return cfg


def build_model(arch, hp):
    import transformers
    cfg = make_config(arch, hp)
    model = getattr(transformers, arch.model_class)(cfg)
    return model.float().eval()


# --------------------------------------------------------------------------- maps

def _std_hparams_gguf(extra=None):
    h = {
        "vocab": {"tensor": "token_embd.weight", "dim": 0},
        "d_model": {"key": "{arch}.embedding_length"},
        "d_ff": {"key": "{arch}.feed_forward_length"},
        "n_layers": {"key": "{arch}.block_count"},
        "n_heads": {"key": "{arch}.attention.head_count"},
        "n_kv_heads": {"key": "{arch}.attention.head_count_kv", "default": "n_heads"},
        "head_dim": {"key": "{arch}.attention.key_length", "default": "d_model/n_heads"},
        "rms_eps": {"key": "{arch}.attention.layer_norm_rms_epsilon"},
        "rope_theta": {"key": "{arch}.rope.freq_base", "default": "10000"},
        "max_positions": {"key": "{arch}.context_length", "default": "2048"},
    }
    h.update(extra or {})
    return h


def _std_hparams_hf(rms_eps_default="0.000001"):
    return {
        "vocab": {"config": "vocab_size"},
        "d_model": {"config": "hidden_size"},
        "d_ff": {"config": "intermediate_size"},
        "n_layers": {"config": "num_hidden_layers"},
        "n_heads": {"config": "num_attention_heads"},
        "n_kv_heads": {"config": "num_key_value_heads", "default": "n_heads"},
        "head_dim": {"config": "head_dim", "default": "d_model/n_heads"},
        "rms_eps": {"config": "rms_norm_eps", "default": rms_eps_default},
        "rope_theta": {"config": ["rope_parameters.rope_theta", "rope_theta"], "default": "10000"},
        "max_positions": {"config": "max_position_embeddings", "default": "2048"},
    }


# Hugging Face parameter -> llama.cpp tensor, as convert_hf_to_gguf.py names them
# (gguf-py tensor_mapping) for the Llama-like architectures.
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}

BASE_PARAMS = [
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.{i}.input_layernorm.weight",
    "model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight", "model.layers.{i}.self_attn.o_proj.weight",
    "model.layers.{i}.post_attention_layernorm.weight",
    "model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight",
    "model.layers.{i}.mlp.down_proj.weight",
]
QKV_BIASES = ["model.layers.{i}.self_attn.%s_proj.bias" % x for x in "qkv"]
QK_NORMS = ["model.layers.{i}.self_attn.q_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"]

# These programs compute RoPE with the plain frequencies theta^(-2j/d): a checkpoint with
# scaled RoPE (Llama 3.1/3.2 "llama3", YaRN, linear, dynamic) must be refused, not run with
# the wrong frequencies. null: the key may be absent (or null).
DEFAULT_ROPE_GGUF = {"{arch}.rope.scaling.type": [None, "none"]}
DEFAULT_ROPE_HF = {"rope_parameters.rope_type": [None, "default"], "rope_scaling": [None]}

TIED_FALLBACK_GGUF = "token_embd.weight"
TIED_FALLBACK_HF = "model.embed_tokens.weight"


def make_map(params, gguf_transforms=None, gguf_hparams=None, hf_hparams=None, match=None):
    """map.json for graph params `params`: a "gguf" section (llama.cpp names, with the
    converter's row permutations / value shifts undone by transforms) and a "safetensors"
    section (Hugging Face names: identity; lm_head falls back to the embedding)."""
    gguf_transforms = gguf_transforms or {}
    gp, sp = {}, {}
    for name in params:
        e = {"tensor": GGUF_NAMES[name]}
        if name == "lm_head.weight":
            e["fallback"] = TIED_FALLBACK_GGUF
        if name in gguf_transforms:
            e["transform"] = copy.deepcopy(gguf_transforms[name])
        gp[name] = e
        s = {"tensor": name}
        if name == "lm_head.weight":
            s["fallback"] = TIED_FALLBACK_HF
        sp[name] = s
    g = {"match": dict(DEFAULT_ROPE_GGUF)}
    s = {"match": dict(DEFAULT_ROPE_HF)}
    if match:
        g["match"].update(match["gguf"])
        s["match"].update(match["safetensors"])
    g["hparams"] = gguf_hparams or _std_hparams_gguf()
    g["params"] = gp
    s["hparams"] = hf_hparams or _std_hparams_hf()
    s["params"] = sp
    return {"format": "llmopt-param-map", "version": 1, "gguf": g, "safetensors": s}


LLAMA_PARAMS = list(BASE_PARAMS)
QWEN2_PARAMS = BASE_PARAMS[:5] + QKV_BIASES + BASE_PARAMS[5:]
QWEN3_PARAMS = BASE_PARAMS[:5] + QK_NORMS + BASE_PARAMS[5:]
GEMMA_PARAMS = list(BASE_PARAMS)

# llama.cpp's LlamaModel converter permutes Q/K rows for its interleaved RoPE; Qwen2,
# Qwen3 and Gemma use NEOX-style RoPE in llama.cpp and are written unpermuted.
LLAMA_TRANSFORMS = {
    "model.layers.{i}.self_attn.q_proj.weight": {"op": "unpermute_rope_rows", "heads": "n_heads"},
    "model.layers.{i}.self_attn.k_proj.weight": {"op": "unpermute_rope_rows", "heads": "n_kv_heads"},
}
# llama.cpp's GemmaModel converter stores every "*norm.weight" as (w + 1) (Gemma's RMSNorm
# multiplies by 1 + w); the graph wants w.
GEMMA_TRANSFORMS = {
    name: {"op": "add_scalar", "value": -1}
    for name in GEMMA_PARAMS if name.endswith("norm.weight")
}

LLAMA_MAP = make_map(LLAMA_PARAMS, LLAMA_TRANSFORMS, hf_hparams=_std_hparams_hf("0.000001"))
QWEN2_MAP = make_map(QWEN2_PARAMS)
QWEN3_MAP = make_map(QWEN3_PARAMS)
# A Gemma GGUF holds exactly the tensor names and shapes of a tied Llama GGUF: structure
# cannot tell them apart, so the Gemma program also requires its metadata (data, checked
# generically by the binder; see docs/formats/graph.md "match").
GEMMA_MAP = make_map(GEMMA_PARAMS, GEMMA_TRANSFORMS,
                     match={"gguf": {"general.architecture": ["gemma"]},
                            "safetensors": {"model_type": ["gemma"]}})

# Kept for existing callers: the Llama map's GGUF part.
LLAMA_GGUF_MAP = LLAMA_MAP


# --------------------------------------------------------------------------- golden configs

# Small random-weight configurations for the CI goldens: GQA everywhere, a head_dim that
# differs from d_model/n_heads where the family allows it, tied embeddings where the
# family's small checkpoints tie them.
TINY = {
    "llama": {"vocab": 384, "d_model": 64, "d_ff": 160, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4,
              "head_dim": 8, "rms_eps": 1e-5, "rope_theta": 10000.0, "max_positions": 2048, "tied": False,
              "tokens": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}},
    "qwen2": {"vocab": 320, "d_model": 64, "d_ff": 128, "n_layers": 2, "n_heads": 8, "n_kv_heads": 2,
              "head_dim": 8, "rms_eps": 1e-6, "rope_theta": 1000000.0, "max_positions": 4096, "tied": False,
              "tokens": {"bos_token_id": 317, "eos_token_id": 319, "pad_token_id": None}},
    "qwen3": {"vocab": 320, "d_model": 64, "d_ff": 128, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4,
              "head_dim": 16, "rms_eps": 1e-6, "rope_theta": 1000000.0, "max_positions": 4096, "tied": True,
              "tokens": {"bos_token_id": 317, "eos_token_id": 319, "pad_token_id": None}},
    "gemma": {"vocab": 320, "d_model": 64, "d_ff": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
              "head_dim": 24, "rms_eps": 1e-6, "rope_theta": 10000.0, "max_positions": 8192, "tied": True,
              "tokens": {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}},
}


class Arch:
    def __init__(self, name, config_class, model_class, param_map, hparams=HPARAMS, config_extra=None,
                 probe=PROBE, dim_exprs=DIM_EXPRS, float_exprs=FLOAT_EXPRS, notes=""):
        self.name = name
        self.config_class = config_class
        self.model_class = model_class
        self.module = "transformers." + model_class
        self.param_map = param_map
        self.hparams = list(hparams)
        self.config_extra = dict(config_extra or {})
        self.probe = dict(probe)
        self.dim_exprs = list(dim_exprs)
        self.float_exprs = list(float_exprs)
        self.tiny = TINY[name]
        self.notes = notes

    def build(self, hp):
        return build_model(self, hp)


ARCHS = {
    "llama": Arch(
        "llama", "LlamaConfig", "LlamaForCausalLM", LLAMA_MAP,
        config_extra={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
        notes="Llama 2/3, Llama-3.2, SmolLM2, TinyLlama, Mistral (no sliding window) shapes; "
              "tied or untied lm_head"),
    "qwen2": Arch(
        "qwen2", "Qwen2Config", "Qwen2ForCausalLM", QWEN2_MAP,
        config_extra={"hidden_act": "silu", "use_sliding_window": False},
        notes="Qwen2 / Qwen2.5 (q/k/v biases); tied or untied lm_head"),
    "qwen3": Arch(
        "qwen3", "Qwen3Config", "Qwen3ForCausalLM", QWEN3_MAP,
        config_extra={"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False},
        notes="Qwen3 dense (per-head QK RMSNorm, explicit head_dim); tied or untied lm_head"),
    "gemma": Arch(
        "gemma", "GemmaConfig", "GemmaForCausalLM", GEMMA_MAP,
        config_extra={"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                      "attention_bias": False},
        float_exprs=FLOAT_EXPRS + ["d_model^0.5"],
        notes="Gemma 1 (gelu_tanh MLP, embeddings scaled by sqrt(d_model), RMSNorm with 1 + w)"),
}
