/*
 * A stand-in for the SYCL (Intel GPU) backend library of Intel's ipex-llm
 * builds of Ollama (PyPI bigdl-core-cpp): libollama-ggml-sycl.so in Ollama
 * 0.5.4 (bigdl-core-cpp 2.6.0), libggml-sycl.so in Ollama 0.9.3
 * (bigdl-core-cpp 2.7.0b20260110).
 *
 * The real library aborts at start on a machine without an Intel GPU, and
 * the binaries load it from their own folder before LD_LIBRARY_PATH, so the
 * test harness compiles this file with `cc -shared -fPIC` into the place of
 * the real one. It registers no backend and reports no device, so Ollama runs
 * its models on the CPU backend. Each function is one the builds import from
 * the real library (`nm -D --undefined-only` on their libraries).
 */
#include <stddef.h>

/* Ollama 0.5.4 (libollama_ggml.so) and 0.9.3: no SYCL backend registers. */
void *ggml_backend_sycl_reg(void) { return NULL; }

/* Both: no SYCL device. */
int ggml_backend_sycl_get_device_count(void) { return 0; }

/* 0.5.4 (libollama_llama.so): never called without a device; an empty name. */
void ggml_backend_sycl_get_device_name(int device, char *name, size_t len) {
    (void)device;
    if (name != NULL && len > 0) {
        name[0] = '\0';
    }
}

/* 0.5.4 (libollama_llava_shared.so) and 0.9.3 (ollama-lib): no backend. */
void *ggml_backend_sycl_init(int device) {
    (void)device;
    return NULL;
}

/* 0.9.3 (ollama-lib): no buffer type. */
void *ggml_backend_sycl_buffer_type(int device) {
    (void)device;
    return NULL;
}

/* 0.9.3: the dynamic-backend entry point; no backend. */
void *ggml_backend_init(void) { return NULL; }

/*
 * 0.5.4 (libollama_llama.so) imports the C++ function
 * ggml_format_convert_to_xpu(const void *, void *, unsigned long, int); it
 * converts weights for the GPU and is never reached on the CPU backend.
 */
void ggml_format_convert_to_xpu(const void *src, void *dst, unsigned long n,
                                int type) __asm__("_Z26ggml_format_convert_to_xpuPKvPvmi");
void ggml_format_convert_to_xpu(const void *src, void *dst, unsigned long n,
                                int type) {
    (void)src;
    (void)dst;
    (void)n;
    (void)type;
}
