/* Simulated libcuda (nri-cdi's simulated node): enough of the CUDA driver API to prove that a
 * container reaches the GPUs it was given. Appended to generic.c and followed by node_id.c;
 * the builder (nri_cdi_testbed/simnode/csource.py) defines SIMNODE_GPUS (the node's GPUs as
 * initialisers {minor, "name", MiB}) and SIMNODE_CUDA_VERSION (e.g. 13000 for CUDA 13.0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The node's GPUs in NVML index order: minor, name, memory in MiB. */
static const struct { int minor; const char *name; unsigned long long mib; } gpus[] = {
SIMNODE_GPUS
};
#define NGPUS ((int)(sizeof(gpus) / sizeof(gpus[0])))

/* CUDA numbers the GPUs this process can see (their /dev/nvidia<minor> is a character
 * device), in NVML order: ordinal i is the i-th visible GPU. */
static int visible(int ordinal) {
    char path[32];
    struct stat st;
    int seen = 0;
    for (int i = 0; i < NGPUS; i++) {
        snprintf(path, sizeof(path), "/dev/nvidia%d", gpus[i].minor);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode)) {
            if (seen == ordinal) return i;
            seen++;
        }
    }
    return ordinal < 0 ? seen : -1;  /* visible(-1): how many */
}

static int initialised, contexts;

/* CUDA_SUCCESS 0, INVALID_VALUE 1, NOT_INITIALIZED 3, NO_DEVICE 100, INVALID_DEVICE 101,
 * INVALID_CONTEXT 201 */
SIMNODE_EXPORT int cuInit(unsigned int flags) {
    (void)flags;
    struct stat st;
    if (stat("/dev/nvidiactl", &st) != 0 || visible(-1) == 0) return 100;
    initialised = 1;
    return 0;
}

SIMNODE_EXPORT int cuDriverGetVersion(int *version) {
    if (!version) return 1;
    *version = SIMNODE_CUDA_VERSION;
    return 0;
}

SIMNODE_EXPORT int cuDeviceGetCount(int *count) {
    if (!count) return 1;
    *count = visible(-1);
    return 0;
}

SIMNODE_EXPORT int cuDeviceGet(int *device, int ordinal) {
    if (!initialised) return 3;
    if (!device) return 1;
    if (visible(ordinal) < 0) return 101;
    *device = ordinal;
    return 0;
}

SIMNODE_EXPORT int cuDeviceGetName(char *name, int len, int device) {
    if (!initialised) return 3;
    int i = visible(device);
    if (i < 0) return 101;
    if (!name || len <= 0) return 1;
    snprintf(name, (size_t)len, "%s", gpus[i].name);
    return 0;
}

SIMNODE_EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int device) {
    if (!initialised) return 3;
    int i = visible(device);
    if (i < 0) return 101;
    if (!bytes) return 1;
    *bytes = (size_t)(gpus[i].mib << 20);
    return 0;
}

SIMNODE_EXPORT int cuCtxCreate_v2(void **ctx, unsigned int flags, int device) {
    (void)flags;
    if (!initialised) return 3;
    if (visible(device) < 0) return 101;
    if (!ctx) return 1;
    *ctx = malloc(1);
    contexts++;
    return 0;
}

SIMNODE_EXPORT int cuCtxDestroy_v2(void *ctx) {
    if (!ctx || contexts == 0) return 201;
    free(ctx);
    contexts--;
    return 0;
}

/* "Device memory" is host memory here: enough to prove the calls reach the driver. */
SIMNODE_EXPORT int cuMemAlloc_v2(unsigned long long *dptr, size_t bytes) {
    if (!initialised) return 3;
    if (contexts == 0) return 201;
    if (!dptr || bytes == 0) return 1;
    void *p = malloc(bytes);
    if (!p) return 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
    *dptr = (unsigned long long)(size_t)p;
    return 0;
}

SIMNODE_EXPORT int cuMemFree_v2(unsigned long long dptr) {
    if (contexts == 0) return 201;
    free((void *)(size_t)dptr);
    return 0;
}
