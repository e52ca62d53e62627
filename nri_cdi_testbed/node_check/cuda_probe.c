/* nri-cdi doctor --e2e: does the CUDA driver work in this container?
 *
 * Built at run time with gcc, against the few CUDA driver API declarations below (written
 * for this probe from the documented C signatures; no CUDA toolkit needed). It dlopen()s
 * libcuda.so.1 as CUDA programs do, and prints one line per call: "<call> <CUresult> ...".
 * Exit status 0 when every call returned CUDA_SUCCESS. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;            /* CUDA_SUCCESS is 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*count_fn)(int *);
typedef CUresult (*get_fn)(CUdevice *, int);
typedef CUresult (*name_fn)(char *, int, CUdevice);
typedef CUresult (*ctx_create_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

#define ALLOC_BYTES ((size_t)1 << 20)

static void *sym(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) printf("%s missing\n", name);
    return f;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed %s\n", dlerror()); return 2; }
    printf("dlopen 0\n");
    init_fn cu_init = (init_fn)sym(h, "cuInit");
    count_fn cu_count = (count_fn)sym(h, "cuDeviceGetCount");
    get_fn cu_get = (get_fn)sym(h, "cuDeviceGet");
    name_fn cu_name = (name_fn)sym(h, "cuDeviceGetName");
    ctx_create_fn cu_ctx = (ctx_create_fn)sym(h, "cuCtxCreate_v2");
    ctx_destroy_fn cu_ctx_destroy = (ctx_destroy_fn)sym(h, "cuCtxDestroy_v2");
    alloc_fn cu_alloc = (alloc_fn)sym(h, "cuMemAlloc_v2");
    free_fn cu_free = (free_fn)sym(h, "cuMemFree_v2");
    if (!cu_init || !cu_count || !cu_get || !cu_name || !cu_ctx || !cu_ctx_destroy ||
        !cu_alloc || !cu_free)
        return 3;
    CUresult r = cu_init(0);
    printf("cuInit %d\n", r);
    if (r) return 1;
    int count = 0;
    r = cu_count(&count);
    printf("cuDeviceGetCount %d %d\n", r, count);
    if (r || count < 1) return 1;
    CUdevice dev = 0;
    r = cu_get(&dev, 0);
    printf("cuDeviceGet %d\n", r);
    if (r) return 1;
    char name[256] = "";
    r = cu_name(name, (int)sizeof(name), dev);
    printf("cuDeviceGetName %d %s\n", r, name);
    if (r) return 1;
    CUcontext ctx = NULL;
    r = cu_ctx(&ctx, 0, dev);
    printf("cuCtxCreate_v2 %d\n", r);
    if (r) return 1;
    CUdeviceptr ptr = 0;
    r = cu_alloc(&ptr, ALLOC_BYTES);
    printf("cuMemAlloc_v2 %d %zu\n", r, ALLOC_BYTES);
    if (r) return 1;
    r = cu_free(ptr);
    printf("cuMemFree_v2 %d\n", r);
    if (r) return 1;
    r = cu_ctx_destroy(ctx);
    printf("cuCtxDestroy_v2 %d\n", r);
    return r ? 1 : 0;
}
