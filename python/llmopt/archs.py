"""What capture knows about each architecture: (a) how to build the Hugging Face model
from hyper-parameters, (b) the parameter map to GGUF. Everything else is generic.

Hyper-parameter names (the graph's symbols): vocab, d_model, d_ff, n_layers, n_heads,
n_kv_heads, head_dim, rms_eps, rope_theta.
"""

import inspect

# Probe values: every dimension expression that can appear in a graph has a distinct
# value (none equal to 0, 1 or 2), so each concrete size seen in the exported graph
# maps back to exactly one expression. Floats likewise.
# transformers requires d_model % n_heads == 0 (even with an explicit head_dim).
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


def _llama_config(hp):
    from transformers import LlamaConfig
    kw = dict(
        vocab_size=hp["vocab"],
        hidden_size=hp["d_model"],
        intermediate_size=hp["d_ff"],
        num_hidden_layers=hp["n_layers"],
        num_attention_heads=hp["n_heads"],
        num_key_value_heads=hp["n_kv_heads"],
        head_dim=hp["head_dim"],
        rms_norm_eps=hp["rms_eps"],
        max_position_embeddings=4096,
        hidden_act="silu",
        tie_word_embeddings=bool(hp.get("tied", False)),
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
    )
    names = set(inspect.signature(LlamaConfig.__init__).parameters)
    names |= {f.name for f in getattr(LlamaConfig, "__dataclass_fields__", {}).values()}
    rope = {"rope_type": "default", "rope_theta": hp["rope_theta"]}
    if "rope_parameters" in names:
        cfg = LlamaConfig(rope_parameters=dict(rope), **kw)
    else:
        cfg = LlamaConfig(rope_theta=hp["rope_theta"], **kw)
    if _rope_theta(cfg) != float(hp["rope_theta"]):
        # older/newer spellings: set both, then check again
        try:
            cfg.rope_parameters = dict(rope)
        except Exception:
            pass
        try:
            cfg.rope_theta = hp["rope_theta"]
        except Exception:
            pass
    theta = _rope_theta(cfg)
    if theta != float(hp["rope_theta"]):
        raise RuntimeError("LlamaConfig did not take rope_theta=%r (got %r)" % (hp["rope_theta"], theta))
    if getattr(cfg, "head_dim", hp["head_dim"]) != hp["head_dim"]:
        raise RuntimeError("LlamaConfig did not take head_dim")
    return cfg


def _rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    if getattr(cfg, "rope_theta", None) is not None:
        return float(cfg.rope_theta)
    return None


def build_llama(hp):
    from transformers import LlamaForCausalLM
    cfg = _llama_config(hp)
    model = LlamaForCausalLM(cfg)
    return model.float().eval()


LLAMA_GGUF_MAP = {
    "format": "llmopt-param-map",
    "version": 1,
    "gguf": {
        "hparams": {
            "vocab": {"tensor": "token_embd.weight", "dim": 0},
            "d_model": {"key": "{arch}.embedding_length"},
            "d_ff": {"key": "{arch}.feed_forward_length"},
            "n_layers": {"key": "{arch}.block_count"},
            "n_heads": {"key": "{arch}.attention.head_count"},
            "n_kv_heads": {"key": "{arch}.attention.head_count_kv", "default": "n_heads"},
            "head_dim": {"key": "{arch}.attention.key_length", "default": "d_model/n_heads"},
            "rms_eps": {"key": "{arch}.attention.layer_norm_rms_epsilon"},
            "rope_theta": {"key": "{arch}.rope.freq_base", "default": "10000"},
        },
        "params": {
            "model.embed_tokens.weight": {"tensor": "token_embd.weight"},
            "model.norm.weight": {"tensor": "output_norm.weight"},
            "lm_head.weight": {"tensor": "output.weight", "fallback": "token_embd.weight"},
            "model.layers.{i}.input_layernorm.weight": {"tensor": "blk.{i}.attn_norm.weight"},
            "model.layers.{i}.self_attn.q_proj.weight": {
                "tensor": "blk.{i}.attn_q.weight",
                "transform": {"op": "unpermute_rope_rows", "heads": "n_heads"}},
            "model.layers.{i}.self_attn.k_proj.weight": {
                "tensor": "blk.{i}.attn_k.weight",
                "transform": {"op": "unpermute_rope_rows", "heads": "n_kv_heads"}},
            "model.layers.{i}.self_attn.v_proj.weight": {"tensor": "blk.{i}.attn_v.weight"},
            "model.layers.{i}.self_attn.o_proj.weight": {"tensor": "blk.{i}.attn_output.weight"},
            "model.layers.{i}.post_attention_layernorm.weight": {"tensor": "blk.{i}.ffn_norm.weight"},
            "model.layers.{i}.mlp.gate_proj.weight": {"tensor": "blk.{i}.ffn_gate.weight"},
            "model.layers.{i}.mlp.up_proj.weight": {"tensor": "blk.{i}.ffn_up.weight"},
            "model.layers.{i}.mlp.down_proj.weight": {"tensor": "blk.{i}.ffn_down.weight"},
        },
    },
}


class Arch:
    def __init__(self, name, module, build, hparams, param_map, probe=PROBE,
                 dim_exprs=DIM_EXPRS, float_exprs=FLOAT_EXPRS):
        self.name = name
        self.module = module
        self.build = build
        self.hparams = hparams
        self.param_map = param_map
        self.probe = dict(probe)
        self.dim_exprs = list(dim_exprs)
        self.float_exprs = list(float_exprs)


ARCHS = {
    "llama": Arch(
        name="llama",
        module="transformers.LlamaForCausalLM",
        build=build_llama,
        hparams=["vocab", "d_model", "d_ff", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                 "rms_eps", "rope_theta"],
        param_map=LLAMA_GGUF_MAP,
    ),
}
