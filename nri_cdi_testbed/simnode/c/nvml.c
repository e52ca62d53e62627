/* Simulated NVML (nri-cdi's simulated node): answers from the node description that
 * nri_cdi_testbed/simnode/nvml.py writes (simnode-nvml.txt at the node's top, found by walking up
 * from this library's own path, or named by $SIMNODE_NVML_NODE). The same object serves
 * every node: it reads the description when NVML starts. Followed by generic.c and
 * node_id.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define OK 0
#define E_UNINIT 1
#define E_ARG 2
#define E_NOTSUP 3
#define E_NOTFOUND 6
#define E_SIZE 7
#define E_DRIVER 9
#define E_UNKNOWN 999
#define MAXGPU 32
#define MAXMIG 16 /* NVML_MAX_MIG in nri_cdi_testbed/simnode/nvml.py */
#define SLEN 96

enum { M_GPU = 0x51a0, M_MIG, M_GI, M_CI };

struct hdr { int magic; void *owner; };
struct gpu;
struct gi { struct hdr h; struct gpu *gpu; unsigned id, profile, start, size; };
struct mig {
    struct hdr dev, ci; struct gpu *gpu; struct gi *gi; int index;
    unsigned gi_id, ci_id, gi_profile, ci_profile, slices; unsigned long long mem_mb;
    char uuid[SLEN], name[SLEN];
};
struct gpu {
    struct hdr h; int index; unsigned minor, mig_capable, mig_enabled, max_mig, pci_id, brand;
    unsigned cc_major, cc_minor, arch; unsigned long long mem_mb;
    char uuid[SLEN], bus[32], bus_legacy[16], name[SLEN];
    int nmig, ngi; struct mig migs[MAXMIG]; struct gi gis[MAXMIG];
};

static struct gpu gpus[MAXGPU];
static int ngpus, inited;
static char driver[SLEN], nvml_version[SLEN];
static int cuda_version;

/* --- loading the description ------------------------------------------------------------ */

static FILE *open_description(void) {
    const char *env = getenv("SIMNODE_NVML_NODE");
    if (env && *env) return fopen(env, "r");
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)open_description, &info) || !info.dli_fname) return NULL;
    if (!realpath(info.dli_fname, path)) return NULL;
    for (int up = 0; up < 12; up++) {
        char *slash = strrchr(path, '/');
        if (!slash) return NULL;
        *slash = 0;
        char cand[PATH_MAX + 32];
        snprintf(cand, sizeof cand, "%s/simnode-nvml.txt", path);
        FILE *f = fopen(cand, "r");
        if (f) return f;
        if (!*path) return NULL;
    }
    return NULL;
}

static void rest_of_line(const char *s, char *out) {
    while (*s == ' ') s++;
    snprintf(out, SLEN, "%s", s);
    out[strcspn(out, "\n")] = 0;
}

static struct gi *gi_of(struct gpu *g, unsigned id, unsigned profile, unsigned slices) {
    for (int k = 0; k < g->ngi; k++)
        if (g->gis[k].id == id) return &g->gis[k];
    struct gi *x = &g->gis[g->ngi++];
    x->h.magic = M_GI; x->h.owner = x; x->gpu = g; x->id = id; x->profile = profile;
    x->start = id; x->size = slices;
    return x;
}

static int load(void) {
    FILE *f = open_description();
    if (!f) return E_DRIVER;
    char line[512];
    int n, ok = 0;
    ngpus = 0;
    while (fgets(line, sizeof line, f)) {
        struct gpu *g = ngpus ? &gpus[ngpus - 1] : NULL;
        if (sscanf(line, "simnode-nvml %d", &n) == 1) ok = (n == 1);
        else if (sscanf(line, "driver %95s", driver) == 1) {}
        else if (sscanf(line, "nvml %95s", nvml_version) == 1) {}
        else if (sscanf(line, "cuda %d", &cuda_version) == 1) {}
        else if (strncmp(line, "gpu ", 4) == 0 && ngpus < MAXGPU) {
            g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            if (sscanf(line, "gpu %u %u %u %u %x %u %u %u %u %llu %95s %31s %15s %n", &g->minor,
                       &g->mig_capable, &g->mig_enabled, &g->max_mig, &g->pci_id, &g->brand,
                       &g->cc_major, &g->cc_minor, &g->arch, &g->mem_mb, g->uuid, g->bus,
                       g->bus_legacy, &n) < 13) { ok = 0; break; }
            rest_of_line(line + n, g->name);
            g->h.magic = M_GPU; g->h.owner = g; g->index = ngpus++;
        } else if (strncmp(line, "mig ", 4) == 0 && g && g->nmig < MAXMIG) {
            struct mig *m = &g->migs[g->nmig];
            memset(m, 0, sizeof *m);
            if (sscanf(line, "mig %u %u %u %u %u %llu %95s %n", &m->gi_id, &m->ci_id,
                       &m->gi_profile, &m->ci_profile, &m->slices, &m->mem_mb, m->uuid,
                       &n) < 7) { ok = 0; break; }
            rest_of_line(line + n, m->name);
            m->dev.magic = M_MIG; m->dev.owner = m; m->ci.magic = M_CI; m->ci.owner = m;
            m->gpu = g; m->index = g->nmig++;
            m->gi = gi_of(g, m->gi_id, m->gi_profile, m->slices);
        }
    }
    fclose(f);
    return ok ? OK : E_UNKNOWN;
}

/* --- handles ---------------------------------------------------------------------------- */

typedef struct hdr *nvmlDevice_t;

static struct gpu *as_gpu(nvmlDevice_t d) {
    return (inited && d && d->magic == M_GPU) ? (struct gpu *)d->owner : NULL;
}
static struct mig *as_mig(nvmlDevice_t d) {
    return (inited && d && d->magic == M_MIG) ? (struct mig *)d->owner : NULL;
}
#define CHECK_INIT if (!inited) return E_UNINIT

static int copy_out(const char *s, char *buf, unsigned len) {
    if (!buf) return E_ARG;
    if (strlen(s) + 1 > len) return E_SIZE;
    strcpy(buf, s);
    return OK;
}

/* --- init and system -------------------------------------------------------------------- */

EXPORT int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (!inited) { /* read afresh each session: a long-lived caller sees a changed node */
        int r = load();
        if (r != OK) return r;
    }
    inited++;
    return OK;
}
EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlInit(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlShutdown(void) { CHECK_INIT; inited--; return OK; }

EXPORT const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_ARG: return "Invalid Argument";
    case E_NOTSUP: return "Not Supported";
    case E_NOTFOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

EXPORT int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    CHECK_INIT; return copy_out(driver, buf, len);
}
EXPORT int nvmlSystemGetNVMLVersion(char *buf, unsigned len) {
    CHECK_INIT; return copy_out(nvml_version, buf, len);
}
EXPORT int nvmlSystemGetCudaDriverVersion(int *v) {
    CHECK_INIT; if (!v) return E_ARG; *v = cuda_version; return OK;
}
EXPORT int nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* --- GPUs ------------------------------------------------------------------------------- */

EXPORT int nvmlDeviceGetCount_v2(unsigned *n) {
    CHECK_INIT; if (!n) return E_ARG; *n = ngpus; return OK;
}
EXPORT int nvmlDeviceGetCount(unsigned *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!d || i >= (unsigned)ngpus) return E_ARG;
    *d = &gpus[i].h;
    return OK;
}
EXPORT int nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!uuid || !d) return E_ARG;
    for (int i = 0; i < ngpus; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) { *d = &gpus[i].h; return OK; }
        for (int j = 0; j < gpus[i].nmig; j++)
            if (strcmp(gpus[i].migs[j].uuid, uuid) == 0) { *d = &gpus[i].migs[j].dev; return OK; }
    }
    return E_NOTFOUND;
}

EXPORT int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    CHECK_INIT;
    if (!bus || !d) return E_ARG;
    for (int i = 0; i < ngpus; i++)
        if (strcasecmp(gpus[i].bus, bus) == 0 || strcasecmp(gpus[i].bus_legacy, bus) == 0
            || strcasecmp(gpus[i].bus + 4, bus) == 0) { *d = &gpus[i].h; return OK; }
    return E_NOTFOUND;
}
EXPORT int nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByPciBusId_v2(b, d);
}

/* A MIG device's index is its index within its parent GPU (the j of i:j). */
EXPORT int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!i || !(g || m)) return E_ARG;
    *i = g ? (unsigned)g->index : (unsigned)m->index;
    return OK;
}

EXPORT int nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned len) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (g) return copy_out(g->uuid, buf, len);
    if (m) return copy_out(m->uuid, buf, len);
    return E_ARG;
}

EXPORT int nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned len) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (g) return copy_out(g->name, buf, len);
    if (m) return copy_out(m->name, buf, len);
    return E_ARG;
}

EXPORT int nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned *minor) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (as_mig(d)) return E_NOTSUP;
    if (!g || !minor) return E_ARG;
    *minor = g->minor;
    return OK;
}

EXPORT int nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !brand) return E_ARG;
    *brand = (int)g->brand;
    return OK;
}

EXPORT int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !major || !minor) return E_ARG;
    *major = (int)g->cc_major; *minor = (int)g->cc_minor;
    return OK;
}

EXPORT int nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned *arch) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (m) g = m->gpu;
    if (!g || !arch) return E_ARG;
    *arch = g->arch;
    return OK;
}

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } pci_v3;
typedef struct { char busId[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId,
                 r0, r1, r2, r3; } pci_v1;

static int pci_fields(nvmlDevice_t d, struct gpu **out, unsigned *dom, unsigned *bus,
                      unsigned *dev) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    if (!inited) return E_UNINIT;
    if (m) g = m->gpu;
    if (!g) return E_ARG;
    if (sscanf(g->bus, "%x:%x:%x", dom, bus, dev) != 3) return E_UNKNOWN;
    *out = g;
    return OK;
}

EXPORT int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, pci_v3 *p) {
    struct gpu *g; unsigned dom, bus, dev;
    int r = pci_fields(d, &g, &dom, &bus, &dev);
    if (r != OK) return r;
    if (!p) return E_ARG;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", g->bus_legacy);
    p->domain = dom; p->bus = bus; p->device = dev; p->pciDeviceId = g->pci_id;
    p->pciSubSystemId = 0x16a110de;
    return OK;
}
EXPORT int nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, pci_v3 *p) {
    return nvmlDeviceGetPciInfo_v3(d, p);
}
EXPORT int nvmlDeviceGetPciInfo(nvmlDevice_t d, pci_v1 *p) {
    struct gpu *g; unsigned dom, bus, dev;
    int r = pci_fields(d, &g, &dom, &bus, &dev);
    if (r != OK) return r;
    if (!p) return E_ARG;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->bus_legacy);
    p->domain = dom; p->bus = bus; p->device = dev; p->pciDeviceId = g->pci_id;
    p->pciSubSystemId = 0x16a110de;
    return OK;
}

typedef struct { unsigned long long total, free, used; } mem_v1;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2;

static unsigned long long mem_bytes(nvmlDevice_t d) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    if (m) return m->mem_mb << 20;
    return g ? g->mem_mb << 20 : 0;
}
EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, mem_v1 *mem) {
    CHECK_INIT;
    if (!mem || !(as_gpu(d) || as_mig(d))) return E_ARG;
    mem->total = mem->free = mem_bytes(d); mem->used = 0;
    return OK;
}
EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, mem_v2 *mem) {
    CHECK_INIT;
    if (!mem || !(as_gpu(d) || as_mig(d))) return E_ARG;
    mem->total = mem->free = mem_bytes(d); mem->used = mem->reserved = 0;
    return OK;
}

/* --- MIG -------------------------------------------------------------------------------- */

EXPORT int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (as_mig(d)) return E_NOTSUP;
    if (!g || !current || !pending) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    *current = *pending = g->mig_enabled;
    return OK;
}

EXPORT int nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is_mig) {
    CHECK_INIT;
    if (!is_mig || !(as_gpu(d) || as_mig(d))) return E_ARG;
    *is_mig = as_mig(d) != NULL;
    return OK;
}

EXPORT int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *n) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !n) return E_ARG;
    *n = g->mig_capable ? g->max_mig : 0;
    return OK;
}

EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned i, nvmlDevice_t *out) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !out) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    if (i >= g->max_mig) return E_ARG;
    if (!g->mig_enabled || i >= (unsigned)g->nmig) return E_NOTFOUND;
    *out = &g->migs[i].dev;
    return OK;
}

EXPORT int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *out) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!m || !out) return E_ARG;
    *out = &m->gpu->h;
    return OK;
}

EXPORT int nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned *id) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (as_gpu(d)) return E_NOTSUP;
    if (!m || !id) return E_ARG;
    *id = m->gi_id;
    return OK;
}

EXPORT int nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned *id) {
    struct mig *m = as_mig(d);
    CHECK_INIT;
    if (as_gpu(d)) return E_NOTSUP;
    if (!m || !id) return E_ARG;
    *id = m->ci_id;
    return OK;
}

typedef struct { unsigned mp, ce, dec, enc, jpeg, ofa, gi_slices, ci_slices;
                 unsigned long long mem_mb; } attrs_t;

EXPORT int nvmlDeviceGetAttributes_v2(nvmlDevice_t d, attrs_t *a) {
    struct gpu *g = as_gpu(d); struct mig *m = as_mig(d);
    CHECK_INIT;
    if (!a || !(g || m)) return E_ARG;
    memset(a, 0, sizeof *a);
    unsigned slices = m ? m->slices : 8;
    a->mp = 16 * slices; a->ce = slices; a->dec = slices; a->jpeg = slices;
    a->gi_slices = slices; a->ci_slices = slices;
    a->mem_mb = m ? m->mem_mb : g->mem_mb;
    return OK;
}
EXPORT int nvmlDeviceGetAttributes(nvmlDevice_t d, attrs_t *a) {
    return nvmlDeviceGetAttributes_v2(d, a);
}

typedef struct { nvmlDevice_t device; unsigned id, profileId, start, size; } gi_info_t;
typedef struct { nvmlDevice_t device; struct hdr *gi; unsigned id, profileId, start, size;
} ci_info_t;

EXPORT int nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned id, struct hdr **out) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !out) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    for (int k = 0; k < g->ngi; k++)
        if (g->gis[k].id == id) { *out = &g->gis[k].h; return OK; }
    return E_NOTFOUND;
}

static struct gi *as_gi(struct hdr *h) {
    return (inited && h && h->magic == M_GI) ? (struct gi *)h->owner : NULL;
}

EXPORT int nvmlGpuInstanceGetInfo(struct hdr *h, gi_info_t *info) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !info) return E_ARG;
    info->device = &x->gpu->h; info->id = x->id; info->profileId = x->profile;
    info->start = x->start; info->size = x->size;
    return OK;
}

EXPORT int nvmlGpuInstanceGetComputeInstanceById(struct hdr *h, unsigned id, struct hdr **out) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !out) return E_ARG;
    for (int j = 0; j < x->gpu->nmig; j++) {
        struct mig *m = &x->gpu->migs[j];
        if (m->gi == x && m->ci_id == id) { *out = &m->ci; return OK; }
    }
    return E_NOTFOUND;
}

EXPORT int nvmlComputeInstanceGetInfo_v2(struct hdr *h, ci_info_t *info) {
    CHECK_INIT;
    if (!h || h->magic != M_CI || !info) return E_ARG;
    struct mig *m = (struct mig *)h->owner;
    info->device = &m->gpu->h; info->gi = &m->gi->h; info->id = m->ci_id;
    info->profileId = m->ci_profile; info->start = 0; info->size = m->slices;
    return OK;
}
EXPORT int nvmlComputeInstanceGetInfo(struct hdr *h, ci_info_t *info) {
    return nvmlComputeInstanceGetInfo_v2(h, info);
}

/* GPU-instance profiles: the standard ones, plus whatever the node's instances use. */
static const unsigned std_slices[] = {1, 2, 3, 4, 7}; /* profile ids 0..4 */

typedef struct { unsigned id, p2p, slices, count, mp, ce, dec, enc, jpeg, ofa;
                 unsigned long long mem_mb; } gip_v1;
typedef struct { unsigned version, id, p2p, slices, count, mp, ce, dec, enc, jpeg, ofa;
                 unsigned long long mem_mb; char name[96]; } gip_v2;

static int gi_profile(struct gpu *g, unsigned profile, gip_v1 *p) {
    unsigned slices = 0; unsigned long long mem = 0;
    for (int j = 0; j < g->nmig; j++)
        if (g->migs[j].gi_profile == profile) {
            slices = g->migs[j].slices; mem = g->migs[j].mem_mb;
        }
    if (!slices && profile < 5) { slices = std_slices[profile]; mem = g->mem_mb * slices / 8; }
    if (!slices) return E_NOTSUP;
    memset(p, 0, sizeof *p);
    p->id = profile; p->slices = slices; p->count = 7 / slices; p->mp = 16 * slices;
    p->ce = slices; p->dec = slices; p->jpeg = slices; p->mem_mb = mem;
    return OK;
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned profile, gip_v1 *p) {
    struct gpu *g = as_gpu(d);
    CHECK_INIT;
    if (!g || !p) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    return gi_profile(g, profile, p);
}

EXPORT int nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned profile, gip_v2 *p) {
    struct gpu *g = as_gpu(d); gip_v1 v1;
    CHECK_INIT;
    if (!g || !p) return E_ARG;
    if (!g->mig_capable) return E_NOTSUP;
    int r = gi_profile(g, profile, &v1);
    if (r != OK) return r;
    unsigned version = p->version;
    memset(p, 0, sizeof *p);
    p->version = version; p->id = v1.id; p->slices = v1.slices; p->count = v1.count;
    p->mp = v1.mp; p->ce = v1.ce; p->dec = v1.dec; p->jpeg = v1.jpeg; p->mem_mb = v1.mem_mb;
    snprintf(p->name, sizeof p->name, "%ug.%llugb", v1.slices, (v1.mem_mb + 512) / 1024);
    return OK;
}

typedef struct { unsigned id, slices, count, mp, ce, dec, enc, jpeg, ofa; } cip_v1;

EXPORT int nvmlGpuInstanceGetComputeInstanceProfileInfo(struct hdr *h, unsigned profile,
                                                         unsigned engine, cip_v1 *p) {
    struct gi *x = as_gi(h);
    CHECK_INIT;
    if (!x || !p) return E_ARG;
    if (engine != 0) return E_NOTSUP;
    for (int j = 0; j < x->gpu->nmig; j++) {
        struct mig *m = &x->gpu->migs[j];
        if (m->gi == x && m->ci_profile == profile) {
            memset(p, 0, sizeof *p);
            p->id = profile; p->slices = m->slices; p->count = 1; p->mp = 16 * m->slices;
            return OK;
        }
    }
    return E_NOTSUP;
}
