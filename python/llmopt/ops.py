"""Runtime-owned ops as torch custom ops, and the transformers attention function
that routes a model's attention through them (DESIGN.md decisions 1-2).

`llmopt::short_conv(x, w, positions, seq_slots)`: x [1,N,C], w [C,L] (or PyTorch's
depthwise Conv1d weight [C,1,L]) -> [1,N,C], the
causal depthwise convolution of each sequence of the token batch:
y[t, c] = sum_j w[c, j] * u(pos_t - (L-1) + j)[c], u(q) the input row of the same
sequence at position q, 0 where there is none (q < 0). The runtime keeps each sequence's
last L-1 inputs (its conv state) between batches. `STATE_FORWARDS` holds forwards that
replace a model module owning such state (LFM2's short convolution), switched on and off
with `set_state_ops`.

`llmopt::attention(q, k, v, positions, seq_slots, scale, window)`:
q [1,H,N,Dh], k/v [1,Hkv,N,Dh], positions/seq_slots [N] -> [1,N,H,Dh]. The eager
reference is causal attention among the batch's tokens of the same sequence slot,
by position (within `window` when non-zero); query head h reads KV head h // (H/Hkv).
torch.export keeps it as one node; the runtime implements it over its KV cache.
"""

import contextlib
import threading

import torch

ATTN_IMPL_NAME = "llmopt"


def _attention_reference(q, k, v, positions, seq_slots, scale, window):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("llmopt::attention wants 4-d q, k, v; got %s %s %s" % (q.shape, k.shape, v.shape))
    B, H, N, Dh = q.shape
    Hkv = k.shape[1]
    if H % Hkv:
        raise ValueError("llmopt::attention: %d query heads, %d kv heads" % (H, Hkv))
    rep = H // Hkv
    kk = k.float().repeat_interleave(rep, dim=1)
    vv = v.float().repeat_interleave(rep, dim=1)
    scores = torch.matmul(q.float(), kk.transpose(-1, -2)) * scale  # [B,H,N,N]
    pos = positions.reshape(-1).to(torch.int64)
    slot = seq_slots.reshape(-1).to(torch.int64)
    allowed = (slot[:, None] == slot[None, :]) & (pos[None, :] <= pos[:, None])
    if window > 0:
        allowed = allowed & ((pos[:, None] - pos[None, :]) < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vv)  # [B,H,N,Dh]
    return out.transpose(1, 2).contiguous().to(q.dtype)


@torch.library.custom_op("llmopt::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              seq_slots: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    return _attention_reference(q, k, v, positions, seq_slots, scale, window)


@attention.register_fake
def _attention_fake(q, k, v, positions, seq_slots, scale, window):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]))


def _short_conv_reference(x, w, positions, seq_slots):
    if w.dim() == 3 and w.shape[1] == 1:  # PyTorch's depthwise Conv1d weight [C, 1, L]
        w = w.reshape(w.shape[0], w.shape[2])
    if x.dim() != 3 or x.shape[0] != 1 or w.dim() != 2 or w.shape[0] != x.shape[2]:
        raise ValueError("llmopt::short_conv wants x [1,N,C], w [C,L] or [C,1,L]; got %s %s" % (
            tuple(x.shape), tuple(w.shape)))
    L = w.shape[1]
    pos = positions.reshape(-1).to(torch.int64)
    slot = seq_slots.reshape(-1).to(torch.int64)
    same = slot[:, None] == slot[None, :]
    xf = x[0].float()
    out = torch.zeros_like(xf)
    for j in range(L):
        back = L - 1 - j
        # row t reads the token of its own sequence at position pos_t - back (if any)
        pick = (same & (pos[None, :] == pos[:, None] - back)).to(xf.dtype)  # [N, N]
        out = out + (pick @ xf) * w[:, j].float()
    return out.unsqueeze(0).to(x.dtype)


@torch.library.custom_op("llmopt::short_conv", mutates_args=())
def short_conv(x: torch.Tensor, w: torch.Tensor, positions: torch.Tensor, seq_slots: torch.Tensor) -> torch.Tensor:
    return _short_conv_reference(x, w, positions, seq_slots)


@short_conv.register_fake
def _short_conv_fake(x, w, positions, seq_slots):
    return x.new_empty(x.shape)


class _Context(threading.local):
    positions = None
    seq_slots = None
    calls = 0
    conv_calls = 0


CTX = _Context()


@contextlib.contextmanager
def token_batch(positions, seq_slots):
    """Makes positions/seq_slots visible to the attention function during a forward."""
    old = (CTX.positions, CTX.seq_slots)
    CTX.positions, CTX.seq_slots = positions, seq_slots
    try:
        yield
    finally:
        CTX.positions, CTX.seq_slots = old


def hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface function: query [1,H,N,Dh], key/value
    [1,Hkv,N,Dh] -> ([1,N,H,Dh], None)."""
    if CTX.positions is None:
        raise RuntimeError("llmopt attention called outside llmopt.ops.token_batch()")
    if query.shape[0] != 1:
        raise RuntimeError("llmopt attention wants batch 1 (the token batch), got %d" % query.shape[0])
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # Attention variants the canonical op cannot express yet: refuse rather than drop them
    # silently (docs/capture.md lists what each needs).
    if kwargs.get("softcap"):
        raise RuntimeError("llmopt attention: attention logit softcapping (softcap=%r) is not an attribute of "
                           "the canonical attention op yet" % kwargs["softcap"])
    for k in ("s_aux", "sinks"):
        if kwargs.get(k) is not None:
            raise RuntimeError("llmopt attention: attention sinks (%s) are not supported by the canonical "
                               "attention op yet" % k)
    if dropout:
        raise RuntimeError("llmopt attention: dropout %r at inference" % dropout)
    window = kwargs.get("sliding_window") or 0
    CTX.calls += 1
    out = torch.ops.llmopt.attention(query, key, value, CTX.positions, CTX.seq_slots, float(scaling), int(window))
    return out, None


_registered = False


def register_hf_attention():
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_IMPL_NAME, hf_attention)
    _registered = True


def set_attn_implementation(model, name):
    """Selects a transformers attention implementation on a built model."""
    if name == ATTN_IMPL_NAME:
        register_hf_attention()
    done = False
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(name)
            done = True
        except Exception as e:  # older/newer API differences: fall back to the config
            print("note: set_attn_implementation(%r) failed (%s); setting config._attn_implementation" % (name, e))
    if not done:
        model.config._attn_implementation = name
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", name) != name:
            try:
                cfg._attn_implementation = name
            except Exception:
                pass
    got = getattr(model.config, "_attn_implementation", None)
    if got != name:
        raise RuntimeError("could not select attention implementation %r (config says %r)" % (name, got))


def lfm2_short_conv_forward(self, hidden_states, *args, **kwargs):
    """Replaces transformers' Lfm2ShortConv.forward: in_proj to 3C channels split into
    B, C, x (thirds, in that order); y = C * conv(B * x) with the depthwise causal
    convolution as llmopt::short_conv over the token batch; out_proj. (HF's slow path
    convolves along the batch axis, which would mix the sequences of a token batch.)"""
    if CTX.positions is None:
        raise RuntimeError("llmopt short_conv called outside llmopt.ops.token_batch()")
    if hidden_states.shape[0] != 1:
        raise RuntimeError("llmopt short_conv wants batch 1 (the token batch), got %d" % hidden_states.shape[0])
    conv = self.conv
    ch = conv.weight.shape[0]
    if conv.weight.dim() != 3 or conv.weight.shape[1] != 1 or conv.groups != ch:
        raise RuntimeError("llmopt short_conv: %s is not a depthwise convolution" % (tuple(conv.weight.shape),))
    bcx = self.in_proj(hidden_states)  # [1, N, 3C]
    b = bcx[..., 0:ch]
    c = bcx[..., ch:2 * ch]
    x = bcx[..., 2 * ch:3 * ch]
    CTX.conv_calls += 1
    # the kernel as the module stores it, [C, 1, L] (no reshape node on a parameter)
    y = torch.ops.llmopt.short_conv(b * x, conv.weight, CTX.positions, CTX.seq_slots)
    if conv.bias is not None:
        y = y + conv.bias
    return self.out_proj(c * y)


# module class name -> forward using llmopt state ops (archs.Arch.state_modules names them)
STATE_FORWARDS = {"lfm2_short_conv": lfm2_short_conv_forward}


_ORIGINAL_FORWARDS = {}


def set_state_ops(model, state_modules, on):
    """Routes (on) or un-routes (off) the modules that own recurrent state through the
    llmopt state ops: state_modules maps a module class name to a STATE_FORWARDS key; the
    class's forward is replaced (and restored). Returns how many modules there are."""
    classes = {}
    n = 0
    for m in model.modules():
        key = state_modules.get(type(m).__name__)
        if key is not None:
            classes[type(m)] = key
            n += 1
    for cls, key in classes.items():
        if on:
            if cls not in _ORIGINAL_FORWARDS:
                _ORIGINAL_FORWARDS[cls] = cls.__dict__.get("forward")
            cls.forward = STATE_FORWARDS[key]
        elif cls in _ORIGINAL_FORWARDS:
            orig = _ORIGINAL_FORWARDS.pop(cls)
            if orig is None:
                del cls.forward
            else:
                cls.forward = orig
    return n


class TokenBatchLM(torch.nn.Module):
    """forward(tokens[N], positions[N], seq_slots[N], out_rows[M]) -> logits [1, M, vocab].

    Wraps a transformers *ForCausalLM: batch 1 holds the N tokens of any number of
    sequences; only the out_rows rows reach the lm_head (logits_to_keep as a tensor)."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model

    def forward(self, tokens, positions, seq_slots, out_rows):
        with token_batch(positions, seq_slots):
            out = self.hf(input_ids=tokens.unsqueeze(0), position_ids=positions.unsqueeze(0),
                          use_cache=False, logits_to_keep=out_rows)
        return out.logits
