/* Scalar reference kernels of the state ops other than attention (whose kernel lives
 * with the executor in ref_ops.c): short_conv over the conv state of the KV cache
 * module. Plain loops, f32 accumulation in the order written: the oracle for fast and
 * device kernels. */
#include "backend/kv_cache.h"

#include "base/fp16.h"
#include "ir/ir.h"

#include <string.h>

#define SHORT_CONV_MAX_KERNEL 64

/* Element (c, j) of a [C, L] (or [C, 1, L]) kernel stored as f32, f16 or bf16. */
static float kernel_at(const void *data, enum ir_dtype t, int64_t idx) {
    switch (t) {
    case IR_DTYPE_F16: return fp16_to_f32(((const uint16_t *)data)[idx]);
    case IR_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)data)[idx]);
    default: return ((const float *)data)[idx];
    }
}

/* y[t, c] = sum_j w[c, j] * u(pos_t - (L-1) + j)[c]: u(q) is the input row of token t's
 * sequence at position q, from this batch when the sequence's token at q is in it
 * (tokens of one sequence come in position order), else from the conv state; 0 for
 * q < 0. Then each token's input is written to the state (the last L-1 of each
 * sequence remain). */
enum llmopt_status ref_short_conv(const struct ir_graph *g, int32_t i, const struct ir_extent *extent,
                                  uint8_t *arena, const int64_t *offset, struct kv_cache *kv,
                                  struct llmopt_err *err) {
    const struct ir_node *n = &g->nodes[i];
    const struct ir_extent *ex = &extent[n->in[0]];
    int64_t n_tok = ex->dims[ex->rank - 2], ch = ex->dims[ex->rank - 1];
    const struct ir_shape *ws = &g->nodes[n->in[1]].shape; /* [C, L] or [C, 1, L] */
    int64_t klen = ws->dims[ws->rank - 1].coef;
    /* the kernel: a parameter (through any reshapes: views keep its rows) or an activation */
    int32_t wi = n->in[1];
    while (g->nodes[wi].op == IR_OP_RESHAPE) wi = g->nodes[wi].in[0];
    const struct ir_node *wn = &g->nodes[wi];
    const void *w = wn->op == IR_OP_PARAM ? wn->weight.data : (const void *)(arena + offset[wi]);
    enum ir_dtype wt = wn->op == IR_OP_PARAM ? wn->weight.dtype : IR_DTYPE_F32;
    if (wt != IR_DTYPE_F32 && wt != IR_DTYPE_F16 && wt != IR_DTYPE_BF16)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "short_conv: kernel '%s' is %s (f32, f16, bf16 only)",
                       wn->name ? wn->name : "?", ir_dtype_name(wt));
    const float *x = (const float *)(arena + offset[n->in[0]]);
    const int32_t *pos = (const int32_t *)(arena + offset[n->in[2]]);
    const int32_t *slot = (const int32_t *)(arena + offset[n->in[3]]);
    float *y = (float *)(arena + offset[i]);
    int32_t layer = n->attrs.kv_layer;
    if (klen > SHORT_CONV_MAX_KERNEL)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "short_conv: kernel size %lld above %d", (long long)klen,
                       SHORT_CONV_MAX_KERNEL);
    if (!kv || layer < 0 || layer >= kv->n_conv_layers || kv->conv_channels[layer] != ch ||
        kv->conv_rows[layer] != klen - 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "short_conv layer %d: conv state does not match (C %lld, kernel %lld)", layer,
                       (long long)ch, (long long)klen);
    for (int64_t t = 0; t < n_tok; t++)
        if (slot[t] < 0 || slot[t] >= kv->n_slots || pos[t] < 0)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "short_conv: token %lld has slot %d position %d",
                           (long long)t, slot[t], pos[t]);
    /* 1. outputs, reading the state before this batch's inputs replace it */
    for (int64_t t = 0; t < n_tok; t++) {
        const float *src[SHORT_CONV_MAX_KERNEL];
        int64_t found = 1; /* src[klen-1-k] is position pos[t] - k */
        src[klen - 1] = x + t * ch;
        for (int64_t s = t - 1; s >= 0 && found < klen; s--) {
            if (slot[s] != slot[t]) continue;
            if (pos[s] != pos[t] - found)
                return err_set(err, LLMOPT_ERR_INVALID_ARG,
                               "short_conv: slot %d has position %d before position %d in one batch", slot[t],
                               pos[s], pos[t]);
            src[klen - 1 - found] = x + s * ch;
            found++;
        }
        for (int64_t k = found; k < klen; k++) {
            int32_t q = pos[t] - (int32_t)k;
            src[klen - 1 - k] = q >= 0 ? kv_cache_conv_row(kv, layer, slot[t], q) : NULL;
        }
        float *yt = y + t * ch;
        for (int64_t c = 0; c < ch; c++) {
            float acc = 0;
            for (int64_t j = 0; j < klen; j++)
                if (src[j]) acc += kernel_at(w, wt, c * klen + j) * src[j][c];
            yt[c] = acc;
        }
    }
    /* 2. the state keeps each sequence's last L-1 inputs */
    if (klen > 1)
        for (int64_t t = 0; t < n_tok; t++)
            memcpy(kv_cache_conv_row(kv, layer, slot[t], pos[t]), x + t * ch, (size_t)ch * sizeof(float));
    return LLMOPT_OK;
}
