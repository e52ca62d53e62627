/* Simulated Jetson (Tegra) library (nri-cdi's simulated Tegra node): every library of the
 * node is built from this file and answers with its own file name. The builder
 * (nri_cdi_testbed/tegra/builder.py) defines TEGRA_EXPORT, TEGRA_LIBRARY and, for libcuda,
 * TEGRA_CUDA, TEGRA_CUDA_VERSION and TEGRA_NODE_ID before it. */
TEGRA_EXPORT const char *fake_tegra_library(void) { return TEGRA_LIBRARY; }

#ifdef TEGRA_CUDA
#include <dlfcn.h>
#include <sys/stat.h>

static int is_char_device(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* The integrated GPU is there when the process has its control node and the memory
 * manager's; like the real driver, libcuda needs libnvrm_gpu.so, found by the loader. */
static int gpu_visible(void) {
    return is_char_device("/dev/nvgpu/igpu0/ctrl") && is_char_device("/dev/nvmap");
}

/* CUDA_SUCCESS 0, INVALID_VALUE 1, NO_DEVICE 100, SHARED_OBJECT_INIT_FAILED 303 */
TEGRA_EXPORT int cuInit(unsigned int flags) {
    (void)flags;
    if (!dlopen("libnvrm_gpu.so", RTLD_NOW)) return 303;
    return gpu_visible() ? 0 : 100;
}

TEGRA_EXPORT int cuDriverGetVersion(int *version) {
    if (!version) return 1;
    *version = TEGRA_CUDA_VERSION;
    return 0;
}

TEGRA_EXPORT int cuDeviceGetCount(int *count) {
    if (!count) return 1;
    *count = gpu_visible();
    return 0;
}

/* Which simulated node this library belongs to: tests read it to tell that a container
 * was given this node's driver. */
TEGRA_EXPORT const char *fake_gpu_node_id(void) { return TEGRA_NODE_ID; }
#endif
