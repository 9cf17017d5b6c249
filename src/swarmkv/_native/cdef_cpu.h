/* ggml-cpu's compile-time feature queries, copied from the pinned ggml-cpu.h. Only the native
 * build links the one ggml-cpu library (the portable build loads a variant at run time and is
 * asked through ggml_backend_get_features instead), so build_ffi.py adds these for it alone.
 * Each returns 1 when the kernels for that instruction set were compiled in. */
int ggml_cpu_has_sse3(void);
int ggml_cpu_has_ssse3(void);
int ggml_cpu_has_avx(void);
int ggml_cpu_has_avx_vnni(void);
int ggml_cpu_has_avx2(void);
int ggml_cpu_has_bmi2(void);
int ggml_cpu_has_f16c(void);
int ggml_cpu_has_fma(void);
int ggml_cpu_has_avx512(void);
int ggml_cpu_has_avx512_vbmi(void);
int ggml_cpu_has_avx512_vnni(void);
int ggml_cpu_has_avx512_bf16(void);
int ggml_cpu_has_amx_int8(void);
int ggml_cpu_has_llamafile(void);
