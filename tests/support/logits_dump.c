/* logits_dump: decode tokens with libllama and write the logits of each decode's last row.
 *
 * Built by bench/build_upstream.sh against llama.cpp's public header only, and run against
 * either an unpatched build of the pinned tree or SwarmKV's own libraries (LD_LIBRARY_PATH
 * picks which), so the same calls in the same order meet both: tests/model/
 * test_plain_upstream.py compares what comes out, bit for bit.
 *
 *   logits_dump MODEL TOKENS OUT N_CTX N_BATCH N_THREADS SWA_FULL CHUNK...
 *
 * TOKENS: a binary file of int32 token ids. The ids are decoded on sequence 0 in batches of
 * the CHUNK sizes, in order (they must add up to the token count), each batch asking for the
 * logits of its last row; OUT receives those rows, float32, one after another. The context
 * is llama_context_default_params with N_CTX, N_BATCH (n_ubatch the same), N_THREADS for both
 * thread counts, flash attention on and SWA_FULL (0/1); the model loads with the defaults
 * (weights repacked, as SwarmKV's plain mode loads a model given by path). Exit status 0 on
 * success; otherwise a line on stderr naming what failed.
 */
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static int fail(const char * what) {
    fprintf(stderr, "logits_dump: %s\n", what);
    return 1;
}

static int32_t * read_tokens(const char * path, long * n) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *n = ftell(f) / (long) sizeof(int32_t);
    fseek(f, 0, SEEK_SET);
    int32_t * tokens = malloc(sizeof(int32_t) * (size_t) (*n > 0 ? *n : 1));
    if (tokens && fread(tokens, sizeof(int32_t), (size_t) *n, f) != (size_t) *n) {
        free(tokens);
        tokens = NULL;
    }
    fclose(f);
    return tokens;
}

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static struct llama_context * open_context(struct llama_model * model, char ** argv) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) atoi(argv[4]);
    cp.n_batch = cp.n_ubatch = (uint32_t) atoi(argv[5]);
    cp.n_threads = cp.n_threads_batch = atoi(argv[6]);
    cp.swa_full = atoi(argv[7]) != 0;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    return llama_init_from_model(model, cp);
}

static int decode_chunks(struct llama_context * ctx, const int32_t * tokens, long n_tokens,
                         int n_chunks, char ** chunks, FILE * out) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    long pos = 0;
    for (int c = 0; c < n_chunks; ++c) {
        const int n = atoi(chunks[c]);
        if (n < 1 || pos + n > n_tokens) {
            return fail("the chunk sizes must be positive and add up to the token count");
        }
        struct llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; ++i) {
            batch.token[i] = tokens[pos + i];
            batch.pos[i] = (llama_pos) (pos + i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == n - 1;
        }
        batch.n_tokens = n;
        const int rc = llama_decode(ctx, batch);
        llama_batch_free(batch);
        if (rc != 0) {
            return fail("llama_decode failed");
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (!logits || fwrite(logits, sizeof(float), (size_t) n_vocab, out) != (size_t) n_vocab) {
            return fail("could not write the logits");
        }
        pos += n;
    }
    return pos == n_tokens ? 0 : fail("the chunk sizes must add up to the token count");
}

int main(int argc, char ** argv) {
    if (argc < 9) {
        return fail("usage: logits_dump MODEL TOKENS OUT N_CTX N_BATCH N_THREADS SWA_FULL CHUNK...");
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    long n_tokens = 0;
    int32_t * tokens = read_tokens(argv[2], &n_tokens);
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    struct llama_context * ctx = model ? open_context(model, argv) : NULL;
    FILE * out = fopen(argv[3], "wb");
    int rc = 1;
    if (!tokens || !model || !ctx || !out) {
        fail(!tokens ? "could not read the tokens" : !model ? "could not load the model"
             : !ctx ? "could not create the context" : "could not open the output");
    } else {
        rc = decode_chunks(ctx, tokens, n_tokens, argc - 8, argv + 8, out);
    }
    if (out) {
        fclose(out);
    }
    if (ctx) {
        llama_free(ctx);
    }
    if (model) {
        llama_model_free(model);
    }
    free(tokens);
    llama_backend_free();
    return rc;
}
