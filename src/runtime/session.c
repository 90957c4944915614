/* Sessions: a backend's compiled plan plus the paged KV cache, and token-batch
 * forwards over them. A forward validates its batch, reserves KV blocks from the
 * preallocated pool and runs the plan: no heap allocation per step. */
#include "runtime/model.h"
#include "runtime/op_profile.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

#include "backend/backend.h"
#ifdef LLMOPT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include "base/clock.h"
#include "base/cpu_features.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_BLOCK_SIZE 16
/* n_threads 0 ("every CPU") gives a CPU session at most one thread per this many bytes
 * of weights read per token. A tiny model's forward is tens of microseconds over ~85
 * kernels, and a pool thread woken for each of them costs more than it saves: on
 * stories260K (1 MiB) one thread decodes faster than two, alone (llmopt bench) and
 * in the server's 32-row batches, where spinning pool workers also take the cores the
 * HTTP threads need (docs/server.md, "Performance"). Models of tens of MiB and up keep
 * every CPU. */
#define SESSION_BYTES_PER_THREAD (16ull << 20)
#define SESSION_MAX_CTX (1 << 20)
/* Sampling on the device (backend run_sample) from this vocabulary size up: its
 * kernels cost ~30-45 us a step, while copying a short row back and sampling it on the
 * host costs less. H200, decode tok/s, logits back against the device: stories260K
 * (512 ids) 8,723 against 6,484 with top-k 40; llama-2-tiny-random (32000 ids) 7,052
 * against 10,960 with top-k 40, 4,224 against 13,412 drawing from the whole row;
 * Qwen3-0.6B-shaped (151936) 765 against 1,393 and 410 against 1,405. The crossover
 * lies between 512 and 32000 and was not measured; the host's cost grows ~3-6 us a
 * 1000 ids, so it is put here. */
#define SESSION_DEVICE_SAMPLE_MIN_VOCAB 16384

struct llmopt_session {
    const struct llmopt_model *model;
    enum llmopt_kv_type kv_type; /* what the KV cache stores (never DEFAULT) */
    const struct backend_ops *backend;
    void *plan;               /* backend state */
    struct kv_cache *kv;
    int32_t n_ctx, n_batch, n_slots;
    int32_t n_threads;        /* the CPU backend's kernel threads; 0 on other backends */
    int32_t *next_pos;        /* (n_slots) scratch for batch validation */
    int32_t *chunk_pos;       /* (n_batch) */
    int32_t *chunk_slot;      /* (n_batch) */
    struct op_profile *profile; /* per-node timing, or NULL: off */
    bool device_sampling;     /* sampled rows may take backend->run_sample: from SESSION_DEVICE_SAMPLE_MIN_VOCAB
                               * ids, or as $LLMOPT_DEVICE_SAMPLING=0|1 says (A/B, tests) */
    /* llmopt_session_forward_sample's scratch, made on first use for smp_rows rows */
    int32_t smp_rows;
    struct backend_row_sample *smp_rows_spec; /* (smp_rows) */
    int32_t *smp_pen_ids, *smp_pen_counts; /* (smp_rows, BACKEND_PENALTY_MAX) */
    struct backend_cand *smp_cands;   /* (smp_rows, BACKEND_TOP_K_MAX) */
    double *smp_sums;                 /* (smp_rows) top-p's z of each row */
    int32_t *smp_cid;                 /* (BACKEND_TOP_K_MAX) one row's candidates, split */
    float *smp_clogit;
    float *smp_row;                   /* (n_vocab) a logits row the sampler may modify */
};

/* The options as a session uses them: defaults filled in, the batch capped. */
static enum llmopt_status resolve_opts(const struct llmopt_model *m, const struct llmopt_session_opts *opts,
                                       struct llmopt_session_opts *out, struct llmopt_err *err) {
    if (!m->ir.arena)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "session: the model was loaded vocab-only");
    struct llmopt_session_opts o = opts ? *opts : (struct llmopt_session_opts){0};
    if (o.n_ctx < 0 || o.n_batch < 0 || o.n_slots < 0 || o.n_ctx > SESSION_MAX_CTX ||
        o.n_slots > 4096 || o.n_threads < 0 || o.n_threads > 1024)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "session: n_ctx %d / n_batch %d / n_slots %d / n_threads %d out of range",
                       o.n_ctx, o.n_batch, o.n_slots, o.n_threads);
    if (!o.n_ctx) o.n_ctx = m->ctx_train < 4096 ? m->ctx_train : 4096;
    if (!o.n_batch) o.n_batch = 256;
    if (!o.n_slots) o.n_slots = 1;
    if ((unsigned)o.kv_type >= LLMOPT_KV_TYPE_COUNT)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "session: unknown KV type %d", (int)o.kv_type);
    if (o.kv_type == LLMOPT_KV_DEFAULT) o.kv_type = m->kv_type != LLMOPT_KV_DEFAULT ? m->kv_type : LLMOPT_KV_F16;
    /* cuda (docs/cuda.md): the device holds the cache in this type too (q8_0: head sizes
     * that are multiples of 32 up to 128); the host cache only holds metadata */
    if (o.n_batch > o.n_ctx * o.n_slots) o.n_batch = o.n_ctx * o.n_slots;
    *out = o;
    return LLMOPT_OK;
}

/* Blocks of the KV pool: every slot can hold n_ctx positions. */
static int32_t kv_pool_blocks(const struct llmopt_session_opts *o) {
    return (o->n_ctx + SESSION_BLOCK_SIZE - 1) / SESSION_BLOCK_SIZE * o->n_slots;
}

static enum kv_dtype kv_dtype_of(enum llmopt_kv_type t) {
    return t == LLMOPT_KV_Q8_0 ? KV_DTYPE_Q8_0 : t == LLMOPT_KV_F16 ? KV_DTYPE_F16 : KV_DTYPE_F32;
}

/* KV row width of each attention layer: Hkv * Dh of its K operand [1, Hkv, N, Dh];
 * q8_0 rows need every head to start on a block. */
static enum llmopt_status kv_row_elems(const struct ir_graph *g, enum llmopt_kv_type t, int32_t *row_elems,
                                       struct llmopt_err *err) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_ATTENTION) continue;
        const struct ir_shape *k = &g->nodes[n->in[1]].shape;
        row_elems[n->attrs.kv_layer] = (int32_t)(k->dims[1].coef * k->dims[3].coef);
        if (t == LLMOPT_KV_Q8_0 && k->dims[3].coef % KV_Q8_0_BLOCK)
            return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                           "session: --kv-type q8_0 needs a head size that is a multiple of %d, attention "
                           "layer %d has %lld (use f16 or f32)",
                           KV_Q8_0_BLOCK, n->attrs.kv_layer, (long long)k->dims[3].coef);
    }
    return LLMOPT_OK;
}

/* Conv state of each short_conv layer: L - 1 rows (rows[l]) of C floats (channels[l])
 * per slot, from its kernel w [C, L] (or [C, 1, L]). */
static void conv_state_dims(const struct ir_graph *g, int32_t n_conv, int32_t *rows, int32_t *channels) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_SHORT_CONV || n->attrs.kv_layer < 0 || n->attrs.kv_layer >= n_conv) continue;
        const struct ir_shape *w = &g->nodes[n->in[1]].shape;
        rows[n->attrs.kv_layer] = (int32_t)(w->dims[w->rank - 1].coef - 1);
        channels[n->attrs.kv_layer] = (int32_t)w->dims[0].coef;
    }
}

int32_t llmopt_model_cpu_threads(const struct llmopt_model *m) {
    uint64_t enough = ir_weight_bytes_per_token(&m->ir) / SESSION_BYTES_PER_THREAD;
    int cpus = cpu_features_get()->usable_cpus;
    return enough < 1 ? 1 : enough < (uint64_t)cpus ? (int32_t)enough : cpus;
}

enum llmopt_status llmopt_session_create(const struct llmopt_model *m,
                                         const struct llmopt_session_opts *opts,
                                         struct llmopt_session **out, struct llmopt_err *err) {
    struct llmopt_session_opts o;
    enum llmopt_status st = resolve_opts(m, opts, &o, err);
    if (st) return st;

    const struct backend_ops *backend = NULL;
    if (!o.backend || !*o.backend || !strcmp(o.backend, "cpu")) {
        backend = &cpu_backend_ops;
    } else if (!strcmp(o.backend, "cpu-ref")) {
        backend = &cpu_ref_backend_ops;
    } else if (!strcmp(o.backend, "cuda")) {
#ifdef LLMOPT_HAVE_CUDA
        char why[256];
        if (!cuda_device_available(why, sizeof why))
            return err_set(err, LLMOPT_ERR_UNSUPPORTED, "session: backend 'cuda': no usable device (%s)", why);
        backend = &cuda_backend_ops;
#else
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "session: backend 'cuda' is not compiled in (this build found no nvcc)");
#endif
    } else {
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "session: unknown backend '%s' (cpu, cpu-ref, cuda)",
                       o.backend);
    }

    struct llmopt_session *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "session: out of memory");
    s->model = m;
    s->backend = backend;
    s->n_ctx = o.n_ctx;
    s->n_batch = o.n_batch;
    s->n_slots = o.n_slots;
    s->kv_type = o.kv_type;
    const char *dsm = getenv("LLMOPT_DEVICE_SAMPLING");
    s->device_sampling = dsm && (!strcmp(dsm, "0") || !strcmp(dsm, "1")) ? dsm[0] == '1'
                                                                         : m->n_vocab >= SESSION_DEVICE_SAMPLE_MIN_VOCAB;
    int32_t n_layers = m->ir.n_kv_layers;
    int32_t *row_elems = calloc((size_t)(n_layers ? n_layers : 1), sizeof *row_elems);
    s->next_pos = calloc((size_t)o.n_slots, sizeof *s->next_pos);
    s->chunk_pos = calloc((size_t)o.n_batch, sizeof *s->chunk_pos);
    s->chunk_slot = calloc((size_t)o.n_batch, sizeof *s->chunk_slot);
    if (!row_elems || !s->next_pos || !s->chunk_pos || !s->chunk_slot) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "session: out of memory");
        goto fail;
    }
    if ((st = kv_row_elems(&m->ir, o.kv_type, row_elems, err))) goto fail;
    st = kv_cache_create(n_layers, row_elems, kv_dtype_of(o.kv_type), o.n_slots, o.n_ctx, kv_pool_blocks(&o),
                         SESSION_BLOCK_SIZE, &s->kv, err);
    if (st) goto fail;
    int32_t n_conv = ir_count_conv_layers(&m->ir);
    if (n_conv) {
        int32_t *conv_dims = calloc((size_t)n_conv * 2, sizeof *conv_dims);
        if (!conv_dims) {
            st = err_set(err, LLMOPT_ERR_NOMEM, "session: out of memory");
            goto fail;
        }
        conv_state_dims(&m->ir, n_conv, conv_dims, conv_dims + n_conv);
        st = kv_cache_add_conv_state(s->kv, n_conv, conv_dims, conv_dims + n_conv, err);
        free(conv_dims);
        if (st) goto fail;
    }
    if (o.prefix_cache && !n_conv && (st = kv_cache_prefix_enable(s->kv, err))) goto fail;
    if (!o.n_threads && backend == &cpu_backend_ops) o.n_threads = llmopt_model_cpu_threads(m);
    s->n_threads = backend == &cpu_backend_ops ? o.n_threads : 0;
    /* A Model Program carries the plan for its batch size; other sizes plan again. */
    const struct mem_plan *plan = m->plan && m->plan->n_max == o.n_batch ? m->plan : NULL;
    st = s->backend->prepare(&m->ir, o.n_batch, o.n_ctx, plan, o.n_threads, &s->plan, err);
    if (st) goto fail;
    free(row_elems);
    *out = s;
    return LLMOPT_OK;
fail:
    free(row_elems);
    llmopt_session_free(s);
    return st;
}

void llmopt_session_free(struct llmopt_session *s) {
    if (!s) return;
    if (s->plan) s->backend->release(s->plan);
    op_profile_free(s->profile);
    kv_cache_free(s->kv);
    free(s->next_pos);
    free(s->chunk_pos);
    free(s->chunk_slot);
    free(s->smp_rows_spec);
    free(s->smp_pen_ids);
    free(s->smp_pen_counts);
    free(s->smp_cands);
    free(s->smp_sums);
    free(s->smp_cid);
    free(s->smp_clogit);
    free(s->smp_row);
    free(s);
}

/* One forward: logits back (ids NULL), or only each output row's greedy id (ids set;
 * the backend offers run_argmax). */
static enum llmopt_status session_forward(struct llmopt_session *s, int32_t n, const int32_t *tokens,
                                          const int32_t *positions, const int32_t *slots, int32_t n_out,
                                          const int32_t *out_rows, struct backend_out out,
                                          struct llmopt_err *err) {
    if (n < 1 || n > s->n_batch)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward: %d tokens, batch holds 1..%d", n,
                       s->n_batch);
    if (n_out < 1 || n_out > n)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward: %d output rows for %d tokens", n_out, n);
    for (int32_t j = 0; j < n_out; j++)
        if (out_rows[j] < 0 || out_rows[j] >= n)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward: out_rows[%d] = %d not in [0, %d)", j,
                           out_rows[j], n);
    /* Every token must continue its sequence: position == tokens already there. */
    for (int32_t t = 0; t < n; t++)
        if (slots[t] < 0 || slots[t] >= s->n_slots)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward: token %d slot %d not in [0, %d)", t,
                           slots[t], s->n_slots);
    for (int32_t t = 0; t < n; t++) s->next_pos[slots[t]] = s->kv->slot_len[slots[t]];
    for (int32_t t = 0; t < n; t++) {
        int32_t *next = &s->next_pos[slots[t]];
        if (positions[t] != *next)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "forward: token %d of slot %d has position %d, the sequence continues at %d",
                           t, slots[t], positions[t], *next);
        if (*next >= s->n_ctx)
            return err_set(err, LLMOPT_ERR_LIMIT, "forward: slot %d is full (context %d)", slots[t],
                           s->n_ctx);
        (*next)++;
    }
    for (int32_t t = 0; t < n; t++) {
        enum llmopt_status st = kv_cache_reserve(s->kv, slots[t], s->next_pos[slots[t]], err);
        if (st) return st;
    }
    struct exec_batch b = {n, tokens, positions, slots, n_out, out_rows};
    const double t0 = s->profile ? clock_now_s() : 0.0;
    enum llmopt_status st =
        out.cands || out.draws
            ? s->backend->run_sample(s->plan, &b, s->kv, out.rows, out.k, out.cands, out.sums, out.draws, err)
        : out.argmax ? s->backend->run_argmax(s->plan, &b, s->kv, out.argmax, err)
                     : s->backend->run(s->plan, &b, s->kv, out.logits, err);
    if (st) return st;
    if (s->profile) op_profile_add_forward(s->profile, &s->model->ir, &b, s->kv, clock_now_s() - t0);
    for (int32_t t = 0; t < n; t++) s->kv->slot_len[slots[t]] = s->next_pos[slots[t]];
    return LLMOPT_OK;
}

enum llmopt_status llmopt_session_forward(struct llmopt_session *s, int32_t n,
                                          const int32_t *tokens, const int32_t *positions,
                                          const int32_t *slots, int32_t n_out,
                                          const int32_t *out_rows, const float **logits,
                                          struct llmopt_err *err) {
    if (!logits) return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward: no place for the logits (NULL)");
    return session_forward(s, n, tokens, positions, slots, n_out, out_rows, (struct backend_out){.logits = logits},
                           err);
}

/* The sampling scratch for rows output rows (grown, never shrunk: a steady decode loop
 * allocates nothing). */
static enum llmopt_status sample_scratch(struct llmopt_session *s, int32_t rows, struct llmopt_err *err) {
    if (rows <= s->smp_rows) return LLMOPT_OK;
    free(s->smp_rows_spec);
    free(s->smp_pen_ids);
    free(s->smp_pen_counts);
    free(s->smp_cands);
    free(s->smp_sums);
    s->smp_rows_spec = calloc((size_t)rows, sizeof *s->smp_rows_spec);
    s->smp_pen_ids = malloc((size_t)rows * BACKEND_PENALTY_MAX * sizeof *s->smp_pen_ids);
    s->smp_pen_counts = malloc((size_t)rows * BACKEND_PENALTY_MAX * sizeof *s->smp_pen_counts);
    s->smp_cands = malloc((size_t)rows * BACKEND_TOP_K_MAX * sizeof *s->smp_cands);
    s->smp_sums = malloc((size_t)rows * sizeof *s->smp_sums);
    if (!s->smp_cid) s->smp_cid = malloc(BACKEND_TOP_K_MAX * sizeof *s->smp_cid);
    if (!s->smp_clogit) s->smp_clogit = malloc(BACKEND_TOP_K_MAX * sizeof *s->smp_clogit);
    if (!s->smp_row) s->smp_row = malloc((size_t)s->model->n_vocab * sizeof *s->smp_row);
    s->smp_rows = rows;
    if (!s->smp_rows_spec || !s->smp_pen_ids || !s->smp_pen_counts || !s->smp_cands || !s->smp_sums || !s->smp_cid ||
        !s->smp_clogit || !s->smp_row) {
        s->smp_rows = 0;
        return err_set(err, LLMOPT_ERR_NOMEM, "sample: out of memory for %d rows of scratch", rows);
    }
    return LLMOPT_OK;
}

/* Samples output row j of a forward into ids[j] (llmopt_session_forward_sample's
 * contract). The backend samples where it can (run_sample), when every row's
 * penalty list fits and every sampler needs the same kind of help: the best
 * candidates (greedy, or 1 <= top_k <= BACKEND_TOP_K_MAX: sampler_device_k; greedy
 * rows without penalties only the argmax; top-p without top-k: the best
 * BACKEND_TOP_K_MAX and the row's z, sampler_sample_nucleus, and where those are not
 * enough the penalized row fetched back), or a whole-row draw (sampler_device_full:
 * the next uniform goes down with the row and is taken once the id comes back).
 * Otherwise the logits come back and each row is sampled whole. */
static enum llmopt_status forward_sample(struct llmopt_session *s, int32_t n, const int32_t *tokens,
                                         const int32_t *positions, const int32_t *slots, int32_t n_out,
                                         const int32_t *out_rows, struct llmopt_sampler *const *samplers,
                                         const int32_t *const *histories, const size_t *n_history, int32_t *ids,
                                         struct llmopt_err *err) {
    if (!samplers || !ids || !n_history)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward_sample: samplers, n_history and ids must be set");
    if (n < 1 || n > s->n_batch || n_out < 1 || n_out > n) /* before the scratch is sized by n_out */
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward_sample: %d output rows for %d tokens (batch 1..%d)",
                       n_out, n, s->n_batch);
    for (int32_t j = 0; j < n_out; j++)
        if (!samplers[j] || (n_history[j] && (!histories || !histories[j])))
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "forward_sample: row %d has no sampler or no history", j);
    enum llmopt_status st = sample_scratch(s, n_out, err);
    if (st) return st;
    int32_t k = 0, n_full = 0, n_nuc = 0;
    bool device = s->device_sampling && s->backend->run_sample && s->backend->fetch_logits, any_pen = false;
    for (int32_t j = 0; j < n_out && device; j++) {
        struct sampler *smp = (struct sampler *)samplers[j];
        const int32_t kj = sampler_device_k(smp);
        const bool nuc = !kj && sampler_device_nucleus(smp);
        const bool full = !kj && !nuc && sampler_device_full(smp);
        int32_t *pid = s->smp_pen_ids + (size_t)j * BACKEND_PENALTY_MAX;
        int32_t *pcount = s->smp_pen_counts + (size_t)j * BACKEND_PENALTY_MAX;
        const int32_t n_pairs = kj || nuc || full ? sampler_penalty_list(smp, histories ? histories[j] : NULL,
                                                                         n_history[j], pid, pcount, BACKEND_PENALTY_MAX)
                                                  : -1;
        if (n_pairs < 0) {
            device = false;
            break;
        }
        const struct sampler_params *p = sampler_get_params(smp);
        s->smp_rows_spec[j] = (struct backend_row_sample){
            {p->repeat_penalty, p->presence_penalty, p->frequency_penalty, n_pairs, pid, pcount},
            p->temperature,
            p->min_p,
            full ? sampler_peek_uniform(smp) : 0.0};
        any_pen = any_pen || n_pairs > 0;
        k = nuc ? BACKEND_TOP_K_MAX : kj > k ? kj : k;
        n_full += full;
        n_nuc += nuc;
    }
    device = device && (n_full == 0 || n_full == n_out); /* one kind of help a step */
    if (device && k == 1 && !any_pen && s->backend->run_argmax) /* greedy alone: the argmax is the pick */
        return session_forward(s, n, tokens, positions, slots, n_out, out_rows, (struct backend_out){.argmax = ids},
                               err);
    if (device && n_full) {
        st = session_forward(s, n, tokens, positions, slots, n_out, out_rows,
                             (struct backend_out){.rows = s->smp_rows_spec, .k = 0, .draws = ids}, err);
        if (st) return st;
        for (int32_t j = 0; j < n_out; j++) {
            if (ids[j] >= 0)
                sampler_take_uniform((struct sampler *)samplers[j]);
            else
                ids[j] = 0; /* nothing finite: sampler_sample's answer, and it draws nothing */
        }
        return LLMOPT_OK;
    }
    if (device) {
        st = session_forward(s, n, tokens, positions, slots, n_out, out_rows,
                             (struct backend_out){.rows = any_pen || n_nuc ? s->smp_rows_spec : NULL, .k = k,
                                                  .cands = s->smp_cands, .sums = n_nuc ? s->smp_sums : NULL},
                             err);
        if (st) return st;
        const float *rows_back = NULL; /* the penalized rows, fetched for the first row that needs its own */
        for (int32_t j = 0; j < n_out; j++) {
            struct sampler *smp = (struct sampler *)samplers[j];
            for (int32_t i = 0; i < k; i++) {
                s->smp_cid[i] = s->smp_cands[(size_t)j * k + i].id;
                s->smp_clogit[i] = s->smp_cands[(size_t)j * k + i].logit;
            }
            if (!sampler_device_nucleus(smp)) {
                ids[j] = sampler_sample_ranked(smp, s->smp_cid, s->smp_clogit, k);
                continue;
            }
            if ((ids[j] = sampler_sample_nucleus(smp, s->smp_cid, s->smp_clogit, k, s->smp_sums[j])) >= 0) continue;
            if (!rows_back && (st = s->backend->fetch_logits(s->plan, &rows_back, err))) return st;
            const int32_t n_vocab = s->model->n_vocab;
            memcpy(s->smp_row, rows_back + (size_t)j * n_vocab, (size_t)n_vocab * sizeof *s->smp_row);
            ids[j] = sampler_sample_penalized(smp, s->smp_row, NULL);
        }
        return LLMOPT_OK;
    }
    const float *logits = NULL;
    st = session_forward(s, n, tokens, positions, slots, n_out, out_rows, (struct backend_out){.logits = &logits},
                         err);
    if (st) return st;
    const int32_t n_vocab = s->model->n_vocab;
    for (int32_t j = 0; j < n_out; j++) {
        memcpy(s->smp_row, logits + (size_t)j * n_vocab, (size_t)n_vocab * sizeof *s->smp_row);
        ids[j] = sampler_sample((struct sampler *)samplers[j], s->smp_row, histories ? histories[j] : NULL,
                                n_history[j], NULL);
    }
    return LLMOPT_OK;
}

enum llmopt_status llmopt_session_forward_sample(struct llmopt_session *s, int32_t n, const int32_t *tokens,
                                                 const int32_t *positions, const int32_t *slots, int32_t n_out,
                                                 const int32_t *out_rows, struct llmopt_sampler *const *samplers,
                                                 const int32_t *const *histories, const size_t *n_history,
                                                 int32_t *ids, struct llmopt_err *err) {
    return forward_sample(s, n, tokens, positions, slots, n_out, out_rows, samplers, histories, n_history, ids, err);
}

/* The sampler of an append's last row (llmopt_session_append_sample). */
struct append_sampling {
    struct llmopt_sampler *sampler;
    const int32_t *history;
    size_t n_history;
};

/* Appends in n_batch chunks; the last chunk's last row gives logits, its greedy id (id
 * set), or its id drawn by smp (smp and id set). */
static enum llmopt_status session_append(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                         int32_t n, const float **logits, int32_t *id,
                                         const struct append_sampling *smp, struct llmopt_err *err) {
    if (slot < 0 || slot >= s->n_slots)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "slot %d not in [0, %d)", slot, s->n_slots);
    if (n < 1) return err_set(err, LLMOPT_ERR_INVALID_ARG, "append: no tokens");
    if ((int64_t)s->kv->slot_len[slot] + n > s->n_ctx)
        return err_set(err, LLMOPT_ERR_LIMIT, "append: %d + %d tokens exceed the context of %d",
                       s->kv->slot_len[slot], n, s->n_ctx);
    /* a greedy or sampled append (id set, logits NULL) runs the earlier chunks through
     * run_argmax where the backend has it, else run (which needs a logits pointer), and
     * drops what they return */
    int32_t dropped_id;
    const float *dropped_logits = NULL;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < s->n_batch ? n - done : s->n_batch;
        int32_t start = s->kv->slot_len[slot];
        for (int32_t t = 0; t < chunk; t++) {
            s->chunk_pos[t] = start + t;
            s->chunk_slot[t] = slot;
        }
        int32_t last = chunk - 1;
        bool final = done + chunk == n;
        enum llmopt_status st;
        if (final && smp)
            st = forward_sample(s, chunk, tokens + done, s->chunk_pos, s->chunk_slot, 1, &last, &smp->sampler,
                                &smp->history, &smp->n_history, id, err);
        else if (final)
            st = session_forward(s, chunk, tokens + done, s->chunk_pos, s->chunk_slot, 1, &last,
                                 (struct backend_out){.logits = logits, .argmax = id}, err);
        else
            st = session_forward(s, chunk, tokens + done, s->chunk_pos, s->chunk_slot, 1, &last,
                                 s->backend->run_argmax ? (struct backend_out){.argmax = &dropped_id}
                                                        : (struct backend_out){.logits = logits ? logits : &dropped_logits},
                                 err);
        if (st) return st;
        done += chunk;
    }
    return LLMOPT_OK;
}

enum llmopt_status llmopt_session_append(struct llmopt_session *s, int32_t slot,
                                         const int32_t *tokens, int32_t n, const float **logits,
                                         struct llmopt_err *err) {
    if (!logits) return err_set(err, LLMOPT_ERR_INVALID_ARG, "append: no place for the logits (NULL)");
    return session_append(s, slot, tokens, n, logits, NULL, NULL, err);
}

enum llmopt_status llmopt_session_append_sample(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                                int32_t n, struct llmopt_sampler *sampler, const int32_t *history,
                                                size_t n_history, int32_t *next_id, struct llmopt_err *err) {
    if (!next_id || !sampler)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "append_sample: no sampler or no place for the id (NULL)");
    const struct append_sampling smp = {sampler, history, n_history};
    return session_append(s, slot, tokens, n, NULL, next_id, &smp, err);
}

enum llmopt_status llmopt_session_append_greedy(struct llmopt_session *s, int32_t slot,
                                                const int32_t *tokens, int32_t n, int32_t *next_id,
                                                struct llmopt_err *err) {
    if (!next_id) return err_set(err, LLMOPT_ERR_INVALID_ARG, "append_greedy: no place for the id (NULL)");
    if (s->backend->run_argmax) return session_append(s, slot, tokens, n, NULL, next_id, NULL, err);
    const float *logits = NULL;
    enum llmopt_status st = session_append(s, slot, tokens, n, &logits, NULL, NULL, err);
    if (st) return st;
    int32_t best = 0, n_vocab = s->model->n_vocab;
    float best_logit = -INFINITY;
    for (int32_t v = 0; v < n_vocab; v++) {
        float l = logits[v] == INFINITY ? FLT_MAX : logits[v];
        if (l > best_logit) { /* strict: the lowest id wins ties; NaN never wins */
            best_logit = l;
            best = v;
        }
    }
    *next_id = best;
    return LLMOPT_OK;
}

int32_t llmopt_session_seq_len(const struct llmopt_session *s, int32_t slot) {
    return slot >= 0 && slot < s->n_slots ? s->kv->slot_len[slot] : 0;
}

void llmopt_session_reset(struct llmopt_session *s, int32_t slot) { kv_cache_release(s->kv, slot); }

int32_t llmopt_session_kv_blocks_in_use(const struct llmopt_session *s) {
    return kv_cache_blocks_in_use(s->kv);
}

int32_t llmopt_session_prefix_attach(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                     int32_t n) {
    return kv_cache_prefix_attach(s->kv, slot, tokens, n);
}

void llmopt_session_prefix_publish(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                   int32_t n) {
    kv_cache_prefix_publish(s->kv, slot, tokens, n);
}

int32_t llmopt_session_kv_blocks_cached(const struct llmopt_session *s) {
    return kv_cache_blocks_cached(s->kv);
}

bool llmopt_session_prefix_cache_on(const struct llmopt_session *s) { return s->kv->prefix != NULL; }

enum llmopt_kv_type llmopt_session_kv_type(const struct llmopt_session *s) { return s->kv_type; }

uint64_t llmopt_session_kv_bytes(const struct llmopt_session *s) { return (uint64_t)kv_cache_bytes(s->kv); }

static const char *const kv_type_names[] = {"default", "f32", "f16", "q8_0"};
_Static_assert(sizeof kv_type_names / sizeof *kv_type_names == LLMOPT_KV_TYPE_COUNT, "kv type names");
_Static_assert(IR_DTYPE_COUNT <= LLMOPT_MEM_MAX_TYPES, "llmopt_memory.weights has a row per weight dtype");

const char *llmopt_kv_type_name(enum llmopt_kv_type t) {
    return (unsigned)t < LLMOPT_KV_TYPE_COUNT ? kv_type_names[t] : "?";
}

bool llmopt_kv_type_parse(const char *str, enum llmopt_kv_type *out) {
    for (int t = LLMOPT_KV_F32; t < LLMOPT_KV_TYPE_COUNT; t++)
        if (str && !strcmp(str, kv_type_names[t])) {
            *out = (enum llmopt_kv_type)t;
            return true;
        }
    return false;
}

uint64_t llmopt_session_kernels_run(const struct llmopt_session *s) {
    struct backend_stats st;
    s->backend->stats(s->plan, &st);
    return st.kernels_run;
}

size_t llmopt_session_packed_bytes(const struct llmopt_session *s) {
    struct backend_stats st;
    s->backend->stats(s->plan, &st);
    return (size_t)st.packed_bytes;
}

size_t llmopt_session_arena_bytes(const struct llmopt_session *s) {
    return s->backend->arena_bytes(s->plan);
}

enum llmopt_status llmopt_session_profile_start(struct llmopt_session *s, struct llmopt_err *err) {
    if (!s->backend->set_node_timing)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "profile: backend '%s' cannot time nodes (use --backend cpu)",
                       s->backend->name);
    llmopt_session_profile_stop(s);
    enum llmopt_status st = op_profile_create(&s->model->ir, &s->profile, err);
    if (st) return st;
    s->backend->set_node_timing(s->plan, s->profile->node_seconds);
    return LLMOPT_OK;
}

void llmopt_session_profile_read(const struct llmopt_session *s, struct llmopt_profile *out) {
    if (s->profile) op_profile_read(s->profile, &s->model->ir, out);
    else memset(out, 0, sizeof *out);
}

void llmopt_session_profile_stop(struct llmopt_session *s) {
    if (!s->profile) return;
    s->backend->set_node_timing(s->plan, NULL);
    op_profile_free(s->profile);
    s->profile = NULL;
}

enum llmopt_status llmopt_model_memory(const struct llmopt_model *m, const struct llmopt_session_opts *opts,
                                       struct llmopt_memory *out, struct llmopt_err *err) {
    struct llmopt_session_opts o;
    enum llmopt_status st = resolve_opts(m, opts, &o, err);
    if (st) return st;
    memset(out, 0, sizeof *out);
    out->n_ctx = o.n_ctx;
    out->n_batch = o.n_batch;
    out->n_slots = o.n_slots;
    const struct ir_graph *g = &m->ir;
    /* Weights by stored type; a tensor bound to two parameters counts once. */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_PARAM) continue;
        bool seen = false;
        for (int32_t j = 0; j < i && !seen; j++)
            seen = g->nodes[j].op == IR_OP_PARAM && g->nodes[j].weight.data == n->weight.data;
        if (seen) continue;
        const char *type = ir_dtype_name(n->weight.dtype);
        int32_t k = 0;
        while (k < out->n_weight_types && strcmp(out->weights[k].dtype, type)) k++;
        if (k == out->n_weight_types) {
            LLMOPT_ASSERT(k < LLMOPT_MEM_MAX_TYPES);
            out->weights[out->n_weight_types++].dtype = type;
        }
        out->weights[k].tensors++;
        out->weights[k].bytes += n->weight.n_bytes;
        out->weight_bytes += n->weight.n_bytes;
    }
    out->kv_layers = g->n_kv_layers;
    out->kv_type = llmopt_kv_type_name(o.kv_type);
    int32_t n_conv = ir_count_conv_layers(g);
    int32_t *dims = calloc((size_t)(g->n_kv_layers + 2 * n_conv + 1), sizeof *dims);
    if (!dims) return err_set(err, LLMOPT_ERR_NOMEM, "mem: out of memory");
    if ((st = kv_row_elems(g, o.kv_type, dims, err))) {
        free(dims);
        return st;
    }
    out->kv_bytes = (uint64_t)kv_cache_storage_bytes(g->n_kv_layers, dims, kv_dtype_of(o.kv_type), kv_pool_blocks(&o),
                                                     SESSION_BLOCK_SIZE);
    int32_t *rows = dims + g->n_kv_layers, *channels = rows + n_conv;
    conv_state_dims(g, n_conv, rows, channels);
    for (int32_t l = 0; l < n_conv; l++)
        out->conv_state_bytes += (uint64_t)o.n_slots * (uint64_t)rows[l] * (uint64_t)channels[l] * sizeof(float);
    free(dims);
    size_t naive;
    size_t arena;
    llmopt_model_plan_bytes(m, o.n_batch, &arena, &naive);
    out->arena_bytes = arena;
    out->total_bytes = out->weight_bytes + out->kv_bytes + out->conv_state_bytes + out->arena_bytes;
    return LLMOPT_OK;
}

int32_t session_n_ctx(const struct llmopt_session *s) { return s->n_ctx; }
const struct llmopt_model *session_model(const struct llmopt_session *s) { return s->model; }

int32_t llmopt_session_n_threads(const struct llmopt_session *s) {
    return s->n_threads;
}
