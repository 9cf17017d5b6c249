/* Curated declarations for cffi API mode, copied from the pinned llama.h, ggml.h and
 * ggml-backend.h. Structs end in `...;` so the C compiler, not this file, decides their
 * layout: a field that drifts or vanishes upstream fails the build instead of corrupting
 * memory. Declare only what swarmkv uses. */

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;
typedef uint32_t llama_state_seq_flags;

#define LLAMA_STATE_SEQ_FLAGS_NONE ...
#define LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY ...
#define LLAMA_STATE_SEQ_FLAGS_ON_DEVICE ...
#define LLAMA_STATE_SEQ_FLAGS_KEEP_SWA_MASKED ...  /* ours: vendor/patches/0001 */

struct llama_vocab;
struct llama_model;
struct llama_context;
struct llama_sampler;
typedef struct llama_memory_i * llama_memory_t;

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT, ...
};
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);

enum ggml_type {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_BF16, ...
};

enum llama_flash_attn_type {
    LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED, ...
};

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

struct llama_model_params {
    int32_t n_gpu_layers;
    bool vocab_only;
    bool check_tensors;
    bool use_extra_bufts;
    ...;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_flash_attn_type flash_attn_type;
    enum ggml_type type_k;
    enum ggml_type type_v;
    bool offload_kqv;
    bool no_perf;
    bool swa_full;
    bool kv_unified;
    ...;
};

typedef struct llama_sampler_chain_params {
    bool no_perf;
    ...;
} llama_sampler_chain_params;

struct llama_perf_context_data {
    double t_start_ms;
    double t_load_ms;
    double t_p_eval_ms;
    double t_eval_ms;
    int32_t n_p_eval;
    int32_t n_eval;
    int32_t n_reused;
    ...;
};

/* backend lifetime and logging */
void llama_backend_init(void);
void llama_backend_free(void);
void llama_log_set(ggml_log_callback log_callback, void * user_data);
const char * llama_print_system_info(void);
bool llama_supports_gpu_offload(void);

/* model */
struct llama_model_params llama_model_default_params(void);
struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
void llama_model_free(struct llama_model * model);
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
int32_t llama_model_n_embd(const struct llama_model * model);
int32_t llama_model_n_layer(const struct llama_model * model);
int32_t llama_model_n_head(const struct llama_model * model);
int32_t llama_model_n_head_kv(const struct llama_model * model);
int32_t llama_model_n_swa(const struct llama_model * model);
int32_t llama_model_meta_val_str(const struct llama_model * model, const char * key, char * buf, size_t buf_size);
int32_t llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
uint64_t llama_model_size(const struct llama_model * model);
uint64_t llama_model_n_params(const struct llama_model * model);
const char * llama_model_chat_template(const struct llama_model * model, const char * name);

/* chat templates (llama.cpp's built-in, non-Jinja renderer) */
typedef struct llama_chat_message {
    const char * role;
    const char * content;
} llama_chat_message;
int32_t llama_chat_apply_template(const char * tmpl, const struct llama_chat_message * chat, size_t n_msg, bool add_ass, char * buf, int32_t length);
int32_t llama_chat_builtin_templates(const char ** output, size_t len);

/* context */
struct llama_context_params llama_context_default_params(void);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);
uint32_t llama_n_ctx(const struct llama_context * ctx);
uint32_t llama_n_ctx_seq(const struct llama_context * ctx);
uint32_t llama_n_batch(const struct llama_context * ctx);
uint32_t llama_n_ubatch(const struct llama_context * ctx);
uint32_t llama_n_seq_max(const struct llama_context * ctx);
void llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
bool llama_set_batch_invariant(struct llama_context * ctx, bool batch_invariant);  /* ours: vendor/patches/0003 */
/* ours: vendor/patches/0003-0008, the CPU backend's kernel switches (ggml-cpu.h); values
 * from the compiler. Each is set per context: no kernel reads the environment. */
enum ggml_cpu_switch {
    GGML_CPU_SWITCH_BATCH_INVARIANT, GGML_CPU_SWITCH_SKINNY_GEMM, GGML_CPU_SWITCH_BI_ATTN,
    GGML_CPU_SWITCH_BI_ATTN_TILE, GGML_CPU_SWITCH_KQUANT_ROWS, GGML_CPU_SWITCH_COUNT, ...
};
bool llama_swarmkv_set_cpu_switch(struct llama_context * ctx, int32_t sw, int32_t value);
int32_t llama_swarmkv_get_cpu_switch(const struct llama_context * ctx, int32_t sw);
void llama_synchronize(struct llama_context * ctx);

/* vocab and tokenizer */
enum llama_vocab_type {
    LLAMA_VOCAB_TYPE_NONE, LLAMA_VOCAB_TYPE_SPM, LLAMA_VOCAB_TYPE_BPE, LLAMA_VOCAB_TYPE_WPM,
    LLAMA_VOCAB_TYPE_UGM, LLAMA_VOCAB_TYPE_RWKV, LLAMA_VOCAB_TYPE_PLAMO2, ...
};
enum llama_token_attr {
    LLAMA_TOKEN_ATTR_CONTROL, LLAMA_TOKEN_ATTR_USER_DEFINED, LLAMA_TOKEN_ATTR_LSTRIP,
    LLAMA_TOKEN_ATTR_RSTRIP, ...
};
enum llama_vocab_type llama_vocab_type(const struct llama_vocab * vocab);
int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
const char * llama_vocab_get_text(const struct llama_vocab * vocab, llama_token token);
enum llama_token_attr llama_vocab_get_attr(const struct llama_vocab * vocab, llama_token token);
bool llama_vocab_get_add_eos(const struct llama_vocab * vocab);
llama_token llama_vocab_bos(const struct llama_vocab * vocab);
llama_token llama_vocab_eos(const struct llama_vocab * vocab);
bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
                             int32_t length, int32_t lstrip, bool special);
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                         char * text, int32_t text_len_max, bool remove_special, bool unparse_special);

/* batch and decode */
struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(struct llama_batch batch);
int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);

/* samplers */
struct llama_sampler_chain_params llama_sampler_chain_default_params(void);
struct llama_sampler * llama_sampler_chain_init(struct llama_sampler_chain_params params);
void llama_sampler_chain_add(struct llama_sampler * chain, struct llama_sampler * smpl);
struct llama_sampler * llama_sampler_init_greedy(void);
struct llama_sampler * llama_sampler_init_dist(uint32_t seed);
struct llama_sampler * llama_sampler_init_temp(float t);
struct llama_sampler * llama_sampler_init_top_k(int32_t k);
struct llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep);
/* NULL when grammar_str does not parse (llama.cpp logs why) */
struct llama_sampler * llama_sampler_init_grammar(const struct llama_vocab * vocab,
                                                  const char * grammar_str, const char * grammar_root);
llama_token llama_sampler_sample(struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx);
void llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
void llama_sampler_reset(struct llama_sampler * smpl);
void llama_sampler_free(struct llama_sampler * smpl);

/* memory (KV cache) */
void llama_swarmkv_memory_bytes(const struct llama_context * ctx, size_t * model, size_t * context, size_t * compute);
llama_memory_t llama_get_memory(const struct llama_context * ctx);
void llama_memory_clear(llama_memory_t mem, bool data);
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1);
void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq_id);
void llama_memory_seq_add(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta);
llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);

/* state */
size_t llama_state_get_size(struct llama_context * ctx);
size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id);
size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id);
size_t llama_state_seq_get_size_ext(struct llama_context * ctx, llama_seq_id seq_id, llama_state_seq_flags flags);
size_t llama_state_seq_get_data_ext(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id, llama_state_seq_flags flags);
size_t llama_state_seq_set_data_ext(struct llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id, llama_state_seq_flags flags);
size_t llama_state_seq_save_file(struct llama_context * ctx, const char * filepath, llama_seq_id seq_id,
                                 const llama_token * tokens, size_t n_token_count);
size_t llama_state_seq_load_file(struct llama_context * ctx, const char * filepath, llama_seq_id dest_seq_id,
                                 llama_token * tokens_out, size_t n_token_capacity, size_t * n_token_count_out);

/* perf */
struct llama_perf_context_data llama_perf_context(const struct llama_context * ctx);
void llama_perf_context_reset(struct llama_context * ctx);

/* ggml backend: devices and host buffers */
typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
typedef struct ggml_backend_buffer * ggml_backend_buffer_t;
typedef struct ggml_backend_device * ggml_backend_dev_t;
enum ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU,
    GGML_BACKEND_DEVICE_TYPE_ACCEL, ...
};
typedef struct ggml_backend_reg * ggml_backend_reg_t;
struct ggml_backend_feature {
    const char * name;
    const char * value;
};
typedef struct ggml_backend_feature * (*ggml_backend_get_features_t)(ggml_backend_reg_t reg);
void ggml_backend_load_all(void);
void ggml_backend_load_all_from_path(const char * dir_path);
ggml_backend_reg_t ggml_backend_load(const char * path);
size_t ggml_backend_reg_count(void);
ggml_backend_reg_t ggml_backend_reg_get(size_t index);
const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
size_t ggml_backend_dev_count(void);
ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
const char * ggml_backend_dev_name(ggml_backend_dev_t device);
const char * ggml_backend_dev_description(ggml_backend_dev_t device);
ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);
ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size);
const char * ggml_backend_buffer_name(ggml_backend_buffer_t buffer);
void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer);
size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer);
bool ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer);

/* ours, defined in build_ffi.py's C source */
const char * swarmkv_llama_cpp_commit(void);
const char * swarmkv_build_json(void);
extern "Python" void swarmkv_log_callback(enum ggml_log_level level, const char * text, void * user_data);
