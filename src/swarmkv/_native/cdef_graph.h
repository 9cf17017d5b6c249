/* A one-op ggml graph on a backend: enough to run a single kernel (MUL_MAT, FLASH_ATTN_EXT)
 * on chosen inputs. Tests use it to check the CPU kernels that decode steps rely on
 * (tests/native/test_skinny_gemm.py, test_bi_attention.py, test_repack_rows.py: weights in the
 * CPU backend's repack buffer type); the library itself never builds
 * graphs. All of these live in libggml-base, which every build links. */
typedef struct ggml_backend * ggml_backend_t;
struct ggml_init_params {
    size_t mem_size;
    void * mem_buffer;
    bool   no_alloc;
};
enum ggml_status {
    GGML_STATUS_ALLOC_FAILED = -2,
    GGML_STATUS_FAILED = -1,
    GGML_STATUS_SUCCESS = 0,
    GGML_STATUS_ABORTED = 1,
};
struct ggml_context * ggml_init(struct ggml_init_params params);
void ggml_free(struct ggml_context * ctx);
size_t ggml_tensor_overhead(void);
size_t ggml_graph_overhead(void);
struct ggml_tensor * ggml_new_tensor_2d(struct ggml_context * ctx, enum ggml_type type,
                                        int64_t ne0, int64_t ne1);
struct ggml_tensor * ggml_mul_mat(struct ggml_context * ctx, struct ggml_tensor * a,
                                  struct ggml_tensor * b);
struct ggml_cgraph * ggml_new_graph(struct ggml_context * ctx);
void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
size_t ggml_nbytes(const struct ggml_tensor * tensor);
ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params);
void ggml_backend_free(ggml_backend_t backend);
ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors(struct ggml_context * ctx,
                                                     ggml_backend_t backend);
ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context * ctx,
                                                              ggml_backend_buffer_type_t buft);
void ggml_backend_tensor_set(struct ggml_tensor * tensor, const void * data, size_t offset,
                             size_t size);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset,
                             size_t size);
enum ggml_status ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph);
struct ggml_tensor * ggml_new_tensor_4d(struct ggml_context * ctx, enum ggml_type type,
                                        int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
struct ggml_tensor * ggml_flash_attn_ext(struct ggml_context * ctx, struct ggml_tensor * q,
                                         struct ggml_tensor * k, struct ggml_tensor * v,
                                         struct ggml_tensor * mask, float scale, float max_bias,
                                         float logit_softcap);
