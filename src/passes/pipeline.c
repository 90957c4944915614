/* The pass pipeline: canonicalize and CSE, fold constants, prune rows, fuse to a fixed
 * point, then DCE and the verifier. */
#include "passes/passes.h"

const char *const pass_names[PASS_COUNT] = {
    [PASS_CANONICALIZE] = "canonicalize",
    [PASS_CSE] = "cse",
    [PASS_FOLD] = "fold",
    [PASS_PRUNE_ROWS] = "prune-rows",
    [PASS_FUSE_RMS_NORM] = "fuse-rms-norm",
    [PASS_FUSE_ROPE] = "fuse-rope",
    [PASS_FUSE_LINEAR] = "fuse-linear",
    [PASS_DCE] = "dce",
};

#define PIPELINE_MAX_ROUNDS 8

enum llmopt_status passes_run(struct ir_graph *g, uint32_t enabled, struct pass_report *report,
                              struct llmopt_err *err) {
    static int32_t (*const fns[PASS_COUNT])(struct ir_graph *, struct llmopt_err *) = {
        [PASS_CANONICALIZE] = pass_canonicalize,
        [PASS_CSE] = pass_cse,
        [PASS_FOLD] = pass_fold,
        [PASS_PRUNE_ROWS] = pass_prune_rows,
        [PASS_FUSE_RMS_NORM] = pass_fuse_rms_norm,
        [PASS_FUSE_ROPE] = pass_fuse_rope,
        [PASS_FUSE_LINEAR] = pass_fuse_linear,
        [PASS_DCE] = pass_dce,
    };
    struct pass_report rep = {0};
    ir_count_uses(g);
    rep.nodes_before = g->n_nodes;
    rep.kernels_before = ir_count_kernels(g);
    for (int round = 0; round < PIPELINE_MAX_ROUNDS; round++) {
        int32_t changes = 0;
        for (int p = 0; p < PASS_COUNT; p++) {
            if (!(enabled & (1u << p))) continue;
            int32_t n = fns[p](g, err);
            if (n < 0) {
                err_prefix(err, "pass %s", pass_names[p]);
                return err->status ? err->status : LLMOPT_ERR_FORMAT;
            }
            rep.rewrites[p] += n;
            /* removed dead nodes count as progress only once; folding marks monotonically */
            if (p != PASS_DCE) changes += n;
        }
        if (!changes) break;
    }
    ir_count_uses(g);
    rep.nodes_after = g->n_nodes;
    rep.kernels_after = ir_count_kernels(g);
    if (report) *report = rep;
    enum llmopt_status st = ir_verify(g, err);
    if (st) err_prefix(err, "after passes");
    return st;
}
