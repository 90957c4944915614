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
    # hparam-dependent keys are passed even when the signature does not list them (a
    # config takes unknown keys as attributes); checked below to have been taken
    required = arch.config_fn(hp) if arch.config_fn else {}
    kw.update(required)
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
    for k, v in required.items():
        if getattr(cfg, k, None) != v:
            raise RuntimeError("%s did not take %s=%r (got %r)" % (arch.config_class, k, v, getattr(cfg, k, None)))
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

# The Llama program is the generic one: a Gemma file has its exact tensors, so it names
# the families whose math it is (structure decides everything else).
LLAMA_MAP = make_map(LLAMA_PARAMS, LLAMA_TRANSFORMS, hf_hparams=_std_hparams_hf("0.000001"),
                     match={"gguf": {"general.architecture": ["llama", "mistral"]},
                            "safetensors": {"model_type": ["llama", "mistral"]}})
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


# --------------------------------------------------------------------------- LFM2

# LFM2 (Lfm2ForCausalLM): hybrid layers. layer_types mixes "conv" (a gated short
# convolution, llmopt::short_conv) and "full_attention" layers; the graph has one
# repeat with a body per kind, chosen by the per-layer hparam layer_kind (0 conv,
# 1 attention). Every layer: operator_norm -> operator -> residual, ffn_norm -> SwiGLU
# (w1 gate, w3 up, w2 down) -> residual; embedding_norm is the final norm. head_dim is
# always d_model / n_heads (the probe makes them equal, so the graph spells the q/k/v
# and out widths "d_model").
LFM2_KINDS = {"conv": 0, "full_attention": 1}
LFM2_KIND_NAMES = {0: "conv", 1: "attention"}
LFM2_PROBE = dict(PROBE, d_model=120, head_dim=8, n_layers=5, conv_L=6,
                  layer_types=["conv", "conv", "full_attention", "full_attention", "conv"])
LFM2_DIM_EXPRS = ["vocab", "d_model", "2*d_model", "3*d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim",
                  "head_dim/2", "n_kv_heads*head_dim", "n_heads/n_kv_heads", "conv_L"]
LFM2_HPARAMS = HPARAMS + ["conv_L"]

LFM2_ATTN = [
    "model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight", "model.layers.{i}.self_attn.out_proj.weight",
    "model.layers.{i}.self_attn.q_layernorm.weight", "model.layers.{i}.self_attn.k_layernorm.weight",
]
LFM2_CONV = [
    "model.layers.{i}.conv.in_proj.weight", "model.layers.{i}.conv.conv.weight",
    "model.layers.{i}.conv.out_proj.weight",
]
LFM2_PARAMS = [
    "model.embed_tokens.weight", "model.embedding_norm.weight", "lm_head.weight",
    "model.layers.{i}.operator_norm.weight", "model.layers.{i}.ffn_norm.weight",
    "model.layers.{i}.feed_forward.w1.weight", "model.layers.{i}.feed_forward.w3.weight",
    "model.layers.{i}.feed_forward.w2.weight",
] + LFM2_ATTN + LFM2_CONV

# llama.cpp's names (gguf-py tensor_mapping for MODEL_ARCH.LFM2). The final norm is
# embedding_norm -> token_embd_norm in the llama.cpp versions that added LFM2; output_norm
# is accepted as a fallback in case a later converter renames it.
LFM2_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.embedding_norm.weight": "token_embd_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.operator_norm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.ffn_norm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.feed_forward.w1.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.feed_forward.w3.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.feed_forward.w2.weight": "blk.{i}.ffn_down.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.out_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.self_attn.q_layernorm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_layernorm.weight": "blk.{i}.attn_k_norm.weight",
    "model.layers.{i}.conv.in_proj.weight": "blk.{i}.shortconv.in_proj.weight",
    "model.layers.{i}.conv.conv.weight": "blk.{i}.shortconv.conv.weight",
    "model.layers.{i}.conv.out_proj.weight": "blk.{i}.shortconv.out_proj.weight",
}


def _lfm2_map():
    gp, sp = {}, {}
    for name in LFM2_PARAMS:
        e = {"tensor": LFM2_GGUF_NAMES[name]}
        s = {"tensor": name}
        if name == "lm_head.weight":
            e["fallback"] = TIED_FALLBACK_GGUF
            s["fallback"] = TIED_FALLBACK_HF
        if name == "model.embedding_norm.weight":
            e["fallback"] = "output_norm.weight"
        if name == "model.layers.{i}.conv.conv.weight":
            # the converter squeezes the [C, 1, L] Conv1d kernel to [C, L]
            e["transform"] = {"op": "reshape", "shape": ["d_model", "conv_L"]}
        gp[name] = e
        sp[name] = s
    gh = _std_hparams_gguf({
        # head_count_kv is per layer in LFM2 GGUFs (0 on conv layers): the attention
        # layers' value, and the layer kinds
        "n_kv_heads": {"key": "{arch}.attention.head_count_kv", "reduce": "max", "default": "n_heads"},
        "layer_kind": {"key": "{arch}.attention.head_count_kv", "values": {"0": 0, "*": 1}},
        "conv_L": {"key": "{arch}.shortconv.l_cache", "default": "3"},
        # the converter writes the auto-adjusted width (the tensors' rows)
        "d_ff": {"key": "{arch}.feed_forward_length", "tensor": "blk.0.ffn_gate.weight", "dim": 0},
    })
    hh = _std_hparams_hf("0.00001")
    hh.update({
        "rms_eps": {"config": "norm_eps", "default": "0.00001"},
        # config.json's intermediate_size is the width before block_auto_adjust_ff_dim:
        # read the tensors' rows instead
        "d_ff": {"tensor": "model.layers.0.feed_forward.w1.weight", "dim": 0},
        "layer_kind": {"config": "layer_types", "values": {k: v for k, v in LFM2_KINDS.items()}},
        "conv_L": {"config": "conv_L_cache", "default": "3"},
    })
    # An LFM2 file whose layers are all attention layers has the tensors of a Qwen3-like
    # file; the map says which family it is (like gemma's), so the choice never depends
    # on the order programs are tried in.
    return {"format": "llmopt-param-map", "version": 1,
            "gguf": {"match": dict(DEFAULT_ROPE_GGUF, **{"general.architecture": ["lfm2"]}),
                     "hparams": gh, "params": gp},
            "safetensors": {"match": dict(DEFAULT_ROPE_HF, **{"model_type": ["lfm2"]}),
                            "hparams": hh, "params": sp}}


LFM2_MAP = _lfm2_map()


def _lfm2_config(hp):
    # intermediate_size is taken as the MLP width only without block_auto_adjust_ff_dim
    return {"layer_types": list(hp["layer_types"]), "conv_L_cache": hp["conv_L"], "norm_eps": hp["rms_eps"],
            "block_auto_adjust_ff_dim": False, "conv_bias": False, "intermediate_size": hp["d_ff"]}


def _lfm2_layer_hparams(hp):
    return {"layer_kind": [LFM2_KINDS[t] for t in hp["layer_types"]]}


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
    # LFM2-shaped: conv layers first (as in LFM2-350M/1.2B), kernel 3, tied embeddings
    "lfm2": {"vocab": 320, "d_model": 64, "d_ff": 128, "n_layers": 5, "n_heads": 4, "n_kv_heads": 2,
             "head_dim": 16, "rms_eps": 1e-5, "rope_theta": 1000000.0, "max_positions": 4096, "tied": True,
             "conv_L": 3, "layer_types": ["conv", "conv", "full_attention", "conv", "full_attention"],
             "tokens": {"bos_token_id": 317, "eos_token_id": 319, "pad_token_id": None}},
}


class Arch:
    """config_fn(hp): config kwargs that depend on the hparams (and must be taken as given);
    layer_hparams_fn(hp): per-layer hparams (name -> one value per layer); kind_hparam:
    the per-layer hparam choosing each layer's body (layers of different kinds);
    state_modules: module class name -> llmopt.ops.STATE_FORWARDS key (modules owning
    recurrent state, replaced by llmopt state ops during capture)."""

    def __init__(self, name, config_class, model_class, param_map, hparams=HPARAMS, config_extra=None,
                 probe=PROBE, dim_exprs=DIM_EXPRS, float_exprs=FLOAT_EXPRS, notes="", config_fn=None,
                 layer_hparams_fn=None, kind_hparam=None, kind_names=None, state_modules=None):
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
        self.config_fn = config_fn
        self.layer_hparams_fn = layer_hparams_fn
        self.kind_hparam = kind_hparam
        self.kind_names = dict(kind_names or {})
        self.state_modules = dict(state_modules or {})

    def layer_hparams(self, hp):
        """Per-layer hparams of hp (name -> list), {} for uniform layers."""
        return self.layer_hparams_fn(hp) if self.layer_hparams_fn else {}

    def layer_kinds(self, hp):
        """One body key per layer, or None when every layer has the same body."""
        if not self.kind_hparam:
            return None
        return list(self.layer_hparams(hp)[self.kind_hparam])

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
    "lfm2": Arch(
        "lfm2", "Lfm2Config", "Lfm2ForCausalLM", LFM2_MAP, hparams=LFM2_HPARAMS,
        config_extra={"hidden_act": "silu"}, probe=LFM2_PROBE, dim_exprs=LFM2_DIM_EXPRS,
        config_fn=_lfm2_config, layer_hparams_fn=_lfm2_layer_hparams, kind_hparam="layer_kind",
        kind_names=LFM2_KIND_NAMES, state_modules={"Lfm2ShortConv": "lfm2_short_conv"},
        notes="LFM2 hybrid (gated short-convolution layers beside GQA attention with QK RMSNorm); tied or "
              "untied lm_head"),
}


# --------------------------------------------------------------- command-line helpers

def names_from_arg(ap, value):
    """The architectures an --arch style argument names: one, a comma-separated list, or
    `all`; an unknown name is an argparse error naming the known ones."""
    names = sorted(ARCHS) if value == "all" else [a for a in value.split(",") if a]
    unknown = [a for a in names if a not in ARCHS]
    if unknown or not names:
        ap.error("unknown architecture(s) %s; known: %s" % (unknown, ", ".join(sorted(ARCHS))))
    return names


def run_each(label, names, one):
    """one(name) for every architecture, each under a banner; one failure must not hide
    the others, so each is caught, printed and listed. Returns the exit status."""
    import sys
    import traceback
    failed = []
    for name in names:
        print("==================== %s %s ====================" % (label, name), flush=True)
        try:
            one(name)
            print("%s %s: OK" % (label, name), flush=True)
        except Exception as e:
            traceback.print_exc()
            print("%s %s failed: %s: %s" % (label, name, type(e).__name__, e), file=sys.stderr, flush=True)
            failed.append(name)
    if failed:
        print("%s failed for: %s" % (label, " ".join(failed)), file=sys.stderr)
        return 1
    return 0
