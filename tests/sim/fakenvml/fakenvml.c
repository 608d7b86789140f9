/*
 * fakenvml.c - a fake NVIDIA driver library (libnvidia-ml.so.1) for simulated GPU nodes.
 *
 * The unmodified pynvml loads it with CDLL("libnvidia-ml.so.1") and sees GPUs that exist only
 * as files. The contract is tests/sim/README.md; the model in short:
 *
 * - Run directory: $GPUSIM_RUN, else /run/gpusim. <run>/node.conf (key=value lines) is read
 *   again on every call, so knobs change live (gpunode set). Keys: gpus, name,
 *   memory_total_mib, minors, uuids, pci_bus_ids, reserved_mib, idle_used_mib, stray_mib
 *   ("i:MiB,..."), release_latency, hang, lost, driver_version, nvml_version,
 *   cuda_driver_version, persistence_mode, dev_dir (default /dev) and proc_dir (default
 *   <run>/proc when a procfs is mounted there, else /proc). Without uuids, GPU i gets a UUID
 *   hashed from the run directory's device/inode and i.
 *
 * - A context is a file <run>/contexts/<T>, lines "<index> <MiB> [compute|graphics|mps]",
 *   written by process T (T = its PID in the namespace of proc_dir). A handle with token T on
 *   GPU i is an fd of any thread (<proc>/PID/task/TID/fd) of the file <dev_dir>/nvidia<minor i>
 *   (matched by device and inode, not by path: a bind mount elsewhere is the same file) whose
 *   file position is T, or a mapping of that file at offset T*4096 (<proc>/PID/maps).
 *   For an "mps" line (an MPS client) the handle is an fd (or mapping) of <dev_dir>/nvidiactl at
 *   position T instead; the line is listed by nvmlDeviceGetMPSComputeRunningProcesses_v3 AND by
 *   the compute lists, with the same memory (counted once in the GPU's used memory), as the real
 *   driver lists an MPS client. Mappings at offset 0 (what the simulated processes map, as real
 *   ones do) are no handle: the token is the simulator's bookkeeping, never the collection's.
 *   A process whose number T is still listed for an earlier context (a dead creator's, held by
 *   its forked child) writes <run>/contexts/<T>.<G> (G = 1, 2, ...: the first free name) and
 *   uses the token T + (G << 32): both contexts live, and the lists give number T once with
 *   the memory of both (on GPUs without MIG instances), as the real driver does.
 *   Words: "ipc=<E>:<K>": K MiB imported from context E on the
 *   same GPU (CUDA IPC), charged to E while E's line is held, to this line once it is not;
 *   "pinned=<M>": M MiB of host memory pinned through the context, which lengthens the release.
 *   Each (context, GPU) line is in one of these states:
 *     held       some process holds a handle with token T: memory counted and the line listed
 *                under the creator's PID, as the caller's PID namespace numbers it (dropped
 *                where it has none; pid_namespace=init: proc_dir's numbers), also after the
 *                creator's exit (the real driver: tests/sim/README.md "The driver model");
 *     releasing  no handle left: still counted and listed until release_latency (plus the
 *                pinned memory's share, pinned_seconds) after the first call that saw it gone;
 *                that moment is kept in <run>/released/<T>.<i>, so all processes agree. A
 *                release is never undone (as in the driver): to create the context again,
 *                write the context file again (a new inode);
 *     freed      not counted, not listed. When every line of a context is freed, the context
 *                file and its state files are removed.
 *   Cost: the creator's own fds/maps are checked first, then the holder last seen for that
 *   line (<run>/released/<T>.<i>.holder); only when both fail is every process of proc_dir
 *   scanned (one scan is reused for 20 ms). Released lines are not scanned at all.
 *
 * - Memory of GPU i (MiB = 2^20 bytes): used = idle_used + stray + held/releasing contexts;
 *   free = total - reserved - used (floor 0); nvmlMemory_t (v1) reports used = total - free,
 *   i.e. reserved memory included, like current drivers.
 *
 * - While initialized (reference counted), the library holds <dev_dir>/nvidiactl, every
 *   <dev_dir>/nvidia<minor>, <dev_dir>/nvidia-uvm twice and nvidia-caps/nvidia-cap1 and -cap2
 *   (those the caller may open: cap1 is root's) open at position 0 and maps nothing, like the
 *   real one (tests/sim/README.md, "Device files per process kind"). nvidiactl missing:
 *   NVML_ERROR_DRIVER_NOT_LOADED.
 *
 * - lost: handle-by-index/UUID of those GPUs and calls on their handles answer
 *   NVML_ERROR_GPU_IS_LOST. hang=<symbol>: that call never returns (sleeps forever);
 *   hang=all: every call after a successful init never returns (nvmlErrorString excepted).
 *
 * - MIG (tests/sim/README.md, "MIG"): mig=<index>[:<profile>,...];... enables MIG on those GPUs
 *   with instances of the H100 80GB profiles (1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb,
 *   4g.40gb, 7g.80gb), placed first-fit on the 8 memory slices in the order given; "<index>"
 *   alone is the default layout 1g.10gb,2g.20gb,3g.40gb; "<index>:" is MIG on, no instance.
 *   Each GPU instance has one compute instance (id 0). GPU instance ids follow the placement
 *   (7g: 0, 4g/3g at slice s: 1 + s/4, 2g/1g.20gb: 3 + s/2, 1g: 7 + s), as nvidia-smi shows.
 *   mig_pending=<index>:<0|1>,... sets a pending mode that differs from the current one.
 *   A context line "... gi=<G> ci=<C>" runs on that instance: listed on the parent (with its
 *   instance ids) and on the MIG device handle, its memory counted on both. On a MIG-enabled
 *   parent the aggregate memory and process lists need privilege (nvml.h): root, or
 *   mig_privileged=1; mig_privileged=0 makes every caller unprivileged (NVML_ERROR_NO_PERMISSION).
 *
 * - Process lists: _v3 and _v2 (nvmlProcessInfo_v2_t, 24 bytes) and the unversioned v1 symbols
 *   (nvmlProcessInfo_v1_t, 16 bytes). Built with -DFAKENVML_NO_V3 (build.sh: build/no-v3/) the
 *   library has no _v3 process-list symbols at all, like drivers older than the _v3 API; with
 *   -DFAKENVML_V3_LEGACY (build/v3-32/) its _v3 entries are the 32-byte ones of early R535.
 *
 * - Other keys: memory_info=unsupported (memory v1/v2 NOT_SUPPORTED, a GB10), init_seconds (a
 *   process's first nvmlInit with persistence_mode=0), context word managed=<MiB> (charged to the
 *   GPU, not to the list entry).
 *
 * Calls are serialized by one mutex. Struct layouts are those of nvml.h (LP64, with padding).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h subset ---------------------------------------------------------------------- */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;

/* A GPU's handle has mig == 0; the handle of MIG device k of GPU index has mig == k + 1. */
typedef struct nvmlDevice_st {
    unsigned int index;
    unsigned int mig;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* = nvmlProcessInfo_v2_t, used by the _v2 and _v3 calls */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t; /* the unversioned (legacy) process-list calls */

/* The _v3 entry of early R535 drivers (535.43.02-535.86.05, nvml.h of those tags): the v2 fields and
 * usedGpuCcProtectedMemory, 32 bytes; later drivers went back to 24 bytes and moved the field to
 * nvmlProcessDetail_v1_t (nvmlDeviceGetRunningProcessDetailList), which has this layout. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_v3_legacy_t;

typedef struct {
    unsigned int version;
    unsigned int mode; /* 0 compute, 1 graphics, 2 MPS */
    unsigned int numProcArrayEntries;
    nvmlProcessInfo_v3_legacy_t *procArray; /* nvmlProcessDetail_v1_t */
} nvmlProcessDetailList_t;

typedef struct {
    unsigned long long protectedMemSizeKib;
    unsigned long long unprotectedMemSizeKib;
} nvmlConfComputeMemSizeInfo_t;

#define NVML_PROCESS_DETAIL_LIST_V1 ((unsigned int)(sizeof(nvmlProcessDetailList_t) | (1 << 24)))

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(NVML_MEMORY_V2_VERSION == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8, "nvmlProcessInfo_t padding");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v3_legacy_t) == 32, "early R535 _v3 layout");
_Static_assert(NVML_PROCESS_DETAIL_LIST_V1 == 0x1000018, "nvmlProcessDetailList_v1 version");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");

#define NO_INSTANCE_ID 0xFFFFFFFFu
#define MIB (1ULL << 20)
#define PAGE_BYTES 4096ULL
#define PCI_DEVICE_ID_H100_SXM 0x233010DEu
#define PCI_SUBSYSTEM_ID_H100_SXM 0x16C110DEu
#define SCAN_REUSE_SECONDS 0.020
/* /dev/nvidiactl is char 195:255 on real hosts: an MPS client's handle is its nvidiactl fd. */
#define CTL_MINOR 255u

/* ---- node configuration (node.conf) ------------------------------------------------------ */

#define MAX_GPUS 64
#define TEXT_LEN 96
#define MAX_MIG 7        /* nvmlDeviceGetMaxMigDeviceCount of an H100: at most 7 MIG devices */
#define MIG_SLICES 8     /* memory slices of an H100 (placements Start:Size in nvidia-smi mig -lgipp) */
#define NVML_DEVICE_MIG_DISABLE 0u
#define NVML_DEVICE_MIG_ENABLE 1u

/* GPU instance profiles of an H100 80GB (nvidia-smi mig -lgip / -lgipp on driver 535+): name, profile
 * id, memory slices, allowed start slices (bit s), memory in MiB (the GiB column x 1024). */
struct mig_profile {
    const char *name;
    unsigned int id, slices, starts;
    unsigned long long mib;
};

static const struct mig_profile MIG_PROFILES[] = {
    {"1g.10gb", 19, 1, 0x7f, 9984},
    {"1g.10gb+me", 20, 1, 0x7f, 9984},
    {"1g.20gb", 15, 2, 0x55, 20096},
    {"2g.20gb", 14, 2, 0x15, 20096},
    {"3g.40gb", 9, 4, 0x11, 40448},
    {"4g.40gb", 5, 4, 0x01, 40448},
    {"7g.80gb", 0, 8, 0x01, 81152},
};
#define MIG_PROFILE_COUNT (sizeof MIG_PROFILES / sizeof MIG_PROFILES[0])
static const char *const MIG_DEFAULT_LAYOUT[] = {"1g.10gb", "2g.20gb", "3g.40gb"};

struct mig_instance {
    const struct mig_profile *profile;
    unsigned int start, gi, ci;
    char uuid[TEXT_LEN];
};

enum context_type { CONTEXT_COMPUTE, CONTEXT_GRAPHICS, CONTEXT_MPS };
enum { PIDNS_AUTO, PIDNS_CALLER, PIDNS_INIT };

struct gpu_config {
    unsigned int minor;
    char uuid[TEXT_LEN];
    unsigned int pci_domain, pci_bus, pci_device;
    unsigned long long stray_mib;
    int lost;
    int persistence;                       /* -1: node-wide persistence_mode; else this GPU's (persistence=i:0|1) */
    unsigned int recovery_action;          /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (recovery_action=i:N) */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure; /* remapped_rows=i:C:U:P:F */
    unsigned int retired_pending;          /* retired_pending=i,... */
    unsigned int nvlink_group;             /* nvlink=0+1,2+3: 1 + the group, 0: no direct NVLink */
    unsigned int mig_current, mig_pending;
    unsigned int mig_count;                /* MIG devices, ordered by GPU instance id */
    struct mig_instance mig[MAX_MIG];
};

struct node_config {
    char run_dir[PATH_MAX];
    char dev_dir[PATH_MAX];
    char proc_dir[PATH_MAX];
    unsigned int gpus;
    char name[TEXT_LEN];
    unsigned long long memory_total_mib;
    unsigned long long reserved_mib;
    unsigned long long idle_used_mib;
    double release_latency;
    char hang[128];
    char driver_version[80];
    char nvml_version[80];
    int cuda_driver_version;
    int persistence_mode;
    int mig_privileged; /* -1: privileged when euid is 0 */
    int memory_info_v2; /* 0: nvmlDeviceGetMemoryInfo_v2 answers FUNCTION_NOT_FOUND (only v1 memory info) */
    int memory_unsupported; /* memory_info=unsupported: v1 and v2 answer NOT_SUPPORTED (a GB10) */
    int pid_namespace; /* PIDNS_CALLER (535.113.01+), PIDNS_INIT (older), PIDNS_AUTO: by driver_version */
    double init_seconds; /* the first nvmlInit of a process takes this long when persistence mode is off */
    struct gpu_config gpu[MAX_GPUS];
};

/* All state below is guarded by g_lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct node_config g_cfg;
static unsigned int g_init_count;
static int g_held_fds[MAX_GPUS + 5]; /* nvidiactl, the GPUs, nvidia-uvm x2, nvidia-cap1 and -cap2 */
static unsigned int g_held_count;
static struct nvmlDevice_st g_devices[MAX_GPUS]; /* index set when the handle is handed out */
static struct nvmlDevice_st g_mig_devices[MAX_GPUS][MAX_MIG];

/* A child forked while another thread is inside a call must not inherit a locked mutex. */
static void lock_before_fork(void)
{
    pthread_mutex_lock(&g_lock);
}

static void unlock_after_fork(void)
{
    pthread_mutex_unlock(&g_lock);
}

__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

/* Copies src into dst[size], cut to fit. */
static void copy_text(char *dst, size_t size, const char *src)
{
    size_t len = strnlen(src, size - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

/* out = dir/name; returns 0 (out empty) when it would not fit. */
static int path_join(char *out, size_t size, const char *dir, const char *name)
{
    size_t dir_len = strlen(dir), name_len = strlen(name);
    if (dir_len + 1 + name_len + 1 > size) {
        out[0] = '\0';
        return 0;
    }
    memcpy(out, dir, dir_len);
    out[dir_len] = '/';
    memcpy(out + dir_len + 1, name, name_len + 1);
    return 1;
}

static double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads a whole small file into buf (NUL-terminated); the file's inode into *inode if not
 * NULL. Returns its length or -1. */
static ssize_t read_small_file(int dir_fd, const char *path, char *buf, size_t size,
                               unsigned long long *inode)
{
    int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (inode && fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    if (inode)
        *inode = (unsigned long long)st.st_ino;
    size_t len = 0;
    while (len < size - 1) {
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* FNV-1a, then the splitmix64 finalizer so that close inputs give unrelated outputs. */
static unsigned long long hash_text(const char *text, unsigned long long seed)
{
    unsigned long long h = 1469598103934665603ULL ^ seed;
    for (; *text; text++) {
        h ^= (unsigned char)*text;
        h *= 1099511628211ULL;
    }
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

/* Splits a comma list in place; returns the number of items (at most max). */
static unsigned int split_list(char *value, char **items, unsigned int max)
{
    unsigned int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(value, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (*tok)
            items[n++] = tok;
    }
    return n;
}

static void apply_defaults(struct node_config *cfg)
{
    cfg->gpus = 8;
    copy_text(cfg->name, sizeof cfg->name, "NVIDIA H100 80GB HBM3");
    cfg->memory_total_mib = 81559;
    cfg->reserved_mib = 529;
    cfg->idle_used_mib = 0;
    cfg->release_latency = 0.5;
    cfg->hang[0] = '\0';
    copy_text(cfg->driver_version, sizeof cfg->driver_version, "580.95.05");
    copy_text(cfg->nvml_version, sizeof cfg->nvml_version, "13.580.95.05");
    cfg->cuda_driver_version = 13000;
    cfg->persistence_mode = 1;
    cfg->mig_privileged = -1;
    cfg->memory_info_v2 = 1;
    cfg->memory_unsupported = 0;
    cfg->pid_namespace = PIDNS_AUTO;
    cfg->init_seconds = 0;
    copy_text(cfg->dev_dir, sizeof cfg->dev_dir, "/dev");
    cfg->proc_dir[0] = '\0';
    memset(cfg->gpu, 0, sizeof cfg->gpu);
}

/* Per-GPU lists are kept as raw strings until the GPU count is known. */
struct raw_lists {
    char minors[4096], uuids[8192], pci_bus_ids[4096], stray[4096], lost[4096], mig[4096], mig_pending[4096];
    char persistence[4096], recovery[4096], remapped[4096], retired[4096], nvlink[4096];
};

/* Applies one node.conf line; an empty value leaves the default ("KEY=" means none). */
static void set_key(struct node_config *cfg, struct raw_lists *raw, const char *key, const char *value)
{
    if (!*value)
        return;
    if (!strcmp(key, "gpus")) {
        unsigned long n = strtoul(value, NULL, 10);
        cfg->gpus = n > MAX_GPUS ? MAX_GPUS : (unsigned int)n;
    } else if (!strcmp(key, "name")) {
        copy_text(cfg->name, sizeof cfg->name, value);
    } else if (!strcmp(key, "memory_total_mib")) {
        cfg->memory_total_mib = strtoull(value, NULL, 10);
    } else if (!strcmp(key, "reserved_mib")) {
        cfg->reserved_mib = strtoull(value, NULL, 10);
    } else if (!strcmp(key, "idle_used_mib")) {
        cfg->idle_used_mib = strtoull(value, NULL, 10);
    } else if (!strcmp(key, "release_latency")) {
        cfg->release_latency = strtod(value, NULL);
    } else if (!strcmp(key, "hang")) {
        copy_text(cfg->hang, sizeof cfg->hang, value);
    } else if (!strcmp(key, "driver_version")) {
        copy_text(cfg->driver_version, sizeof cfg->driver_version, value);
    } else if (!strcmp(key, "nvml_version")) {
        copy_text(cfg->nvml_version, sizeof cfg->nvml_version, value);
    } else if (!strcmp(key, "cuda_driver_version")) {
        cfg->cuda_driver_version = (int)strtol(value, NULL, 10);
    } else if (!strcmp(key, "persistence_mode")) {
        cfg->persistence_mode = strtol(value, NULL, 10) != 0;
    } else if (!strcmp(key, "dev_dir")) {
        copy_text(cfg->dev_dir, sizeof cfg->dev_dir, value);
    } else if (!strcmp(key, "proc_dir")) {
        copy_text(cfg->proc_dir, sizeof cfg->proc_dir, value);
    } else if (!strcmp(key, "minors")) {
        copy_text(raw->minors, sizeof raw->minors, value);
    } else if (!strcmp(key, "uuids")) {
        copy_text(raw->uuids, sizeof raw->uuids, value);
    } else if (!strcmp(key, "pci_bus_ids")) {
        copy_text(raw->pci_bus_ids, sizeof raw->pci_bus_ids, value);
    } else if (!strcmp(key, "stray_mib")) {
        copy_text(raw->stray, sizeof raw->stray, value);
    } else if (!strcmp(key, "lost")) {
        copy_text(raw->lost, sizeof raw->lost, value);
    } else if (!strcmp(key, "mig")) {
        copy_text(raw->mig, sizeof raw->mig, value);
    } else if (!strcmp(key, "mig_pending")) {
        copy_text(raw->mig_pending, sizeof raw->mig_pending, value);
    } else if (!strcmp(key, "mig_privileged")) {
        cfg->mig_privileged = !strcmp(value, "auto") ? -1 : strtol(value, NULL, 10) != 0;
    } else if (!strcmp(key, "memory_info_v2")) {
        cfg->memory_info_v2 = strtol(value, NULL, 10) != 0;
    } else if (!strcmp(key, "memory_info")) {
        cfg->memory_unsupported = !strcmp(value, "unsupported");
    } else if (!strcmp(key, "pid_namespace")) {
        cfg->pid_namespace = !strcmp(value, "init") ? PIDNS_INIT : !strcmp(value, "caller") ? PIDNS_CALLER : PIDNS_AUTO;
    } else if (!strcmp(key, "init_seconds")) {
        cfg->init_seconds = strtod(value, NULL);
    } else if (!strcmp(key, "persistence")) {
        copy_text(raw->persistence, sizeof raw->persistence, value);
    } else if (!strcmp(key, "recovery_action")) {
        copy_text(raw->recovery, sizeof raw->recovery, value);
    } else if (!strcmp(key, "remapped_rows")) {
        copy_text(raw->remapped, sizeof raw->remapped, value);
    } else if (!strcmp(key, "retired_pending")) {
        copy_text(raw->retired, sizeof raw->retired, value);
    } else if (!strcmp(key, "nvlink")) {
        copy_text(raw->nvlink, sizeof raw->nvlink, value);

    }
}

static const struct mig_profile *mig_profile_named(const char *name)
{
    for (size_t k = 0; k < MIG_PROFILE_COUNT; k++)
        if (!strcmp(MIG_PROFILES[k].name, name))
            return &MIG_PROFILES[k];
    return NULL;
}

/* GPU instance id of a placement: the node of a binary tree over the 8 slices (whole GPU 0,
 * halves 1-2, quarters 3-6, slices 7-14), the ids nvidia-smi mig -lgi shows on H100/A100. */
static unsigned int mig_gi_id(unsigned int start, unsigned int slices)
{
    switch (slices) {
    case 8: return 0;
    case 4: return 1 + start / 4;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

/* Places one instance of profile p first-fit; returns 0 when no placement is free. */
static int mig_place(struct gpu_config *g, const struct mig_profile *p, unsigned int *used_slices)
{
    if (g->mig_count >= MAX_MIG)
        return 0;
    for (unsigned int start = 0; start < MIG_SLICES; start++) {
        unsigned int mask = ((1u << p->slices) - 1) << start;
        if (!(p->starts & (1u << start)) || (*used_slices & mask))
            continue;
        *used_slices |= mask;
        g->mig[g->mig_count++] = (struct mig_instance){.profile = p, .start = start,
                                                       .gi = mig_gi_id(start, p->slices), .ci = 0};
        return 1;
    }
    return 0;
}

static int mig_by_gi(const void *a, const void *b)
{
    const struct mig_instance *x = a, *y = b;
    return x->gi != y->gi ? (x->gi < y->gi ? -1 : 1) : (x->ci < y->ci ? -1 : x->ci > y->ci);
}

/* mig = "<index>[:<profile>,...];..." and mig_pending = "<index>:<0|1>,..." (after the UUIDs). */
static void fill_mig(struct node_config *cfg, struct raw_lists *raw)
{
    char *save = NULL, *items[MAX_MIG + 1];
    for (char *spec = strtok_r(raw->mig, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(spec, ':');
        if (colon)
            *colon = '\0';
        unsigned long index = strtoul(trim(spec), NULL, 10);
        if (index >= MAX_GPUS)
            continue;
        struct gpu_config *g = &cfg->gpu[index];
        unsigned int used_slices = 0, n;
        g->mig_current = NVML_DEVICE_MIG_ENABLE;
        g->mig_count = 0;
        if (!colon) {
            for (n = 0; n < sizeof MIG_DEFAULT_LAYOUT / sizeof MIG_DEFAULT_LAYOUT[0]; n++)
                mig_place(g, mig_profile_named(MIG_DEFAULT_LAYOUT[n]), &used_slices);
        } else {
            n = split_list(colon + 1, items, MAX_MIG + 1);
            for (unsigned int k = 0; k < n; k++) {
                const struct mig_profile *p = mig_profile_named(items[k]);
                if (p)
                    mig_place(g, p, &used_slices);
            }
        }
        qsort(g->mig, g->mig_count, sizeof g->mig[0], mig_by_gi);
        for (unsigned int k = 0; k < g->mig_count; k++) {
            char seed[TEXT_LEN + 32];
            snprintf(seed, sizeof seed, "%s/gi%u/ci%u", g->uuid, g->mig[k].gi, g->mig[k].ci);
            unsigned long long a = hash_text(seed, 0), b = hash_text(seed, 0x9e3779b97f4a7c15ULL);
            snprintf(g->mig[k].uuid, TEXT_LEN, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32,
                     (a >> 16) & 0xffff, a & 0xffff, b >> 48, b & 0xffffffffffffULL);
        }
    }
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        cfg->gpu[i].mig_pending = cfg->gpu[i].mig_current;
    char *pending[MAX_GPUS];
    unsigned int n_pending = split_list(raw->mig_pending, pending, MAX_GPUS);
    for (unsigned int k = 0; k < n_pending; k++) {
        unsigned int index, mode;
        if (sscanf(pending[k], "%u:%u", &index, &mode) == 2 && index < MAX_GPUS)
            cfg->gpu[index].mig_pending = mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    }
}

/* What the driver advises per GPU (tests/sim/README.md, "Recovery"): persistence=i:0|1,...,
 * recovery_action=i:N,..., remapped_rows=i:C:U:P:F,..., retired_pending=i,..., nvlink=0+1,2+3. */
static void fill_recovery(struct node_config *cfg, struct raw_lists *raw)
{
    char *items[MAX_GPUS];
    unsigned int index, a, b, c, d, n;
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        cfg->gpu[i].persistence = -1;
    n = split_list(raw->persistence, items, MAX_GPUS);
    for (unsigned int k = 0; k < n; k++)
        if (sscanf(items[k], "%u:%u", &index, &a) == 2 && index < MAX_GPUS)
            cfg->gpu[index].persistence = a != 0;
    n = split_list(raw->recovery, items, MAX_GPUS);
    for (unsigned int k = 0; k < n; k++)
        if (sscanf(items[k], "%u:%u", &index, &a) == 2 && index < MAX_GPUS)
            cfg->gpu[index].recovery_action = a;
    n = split_list(raw->remapped, items, MAX_GPUS);
    for (unsigned int k = 0; k < n; k++)
        if (sscanf(items[k], "%u:%u:%u:%u:%u", &index, &a, &b, &c, &d) == 5 && index < MAX_GPUS) {
            struct gpu_config *g = &cfg->gpu[index];
            g->remap_corr = a, g->remap_unc = b, g->remap_pending = c != 0, g->remap_failure = d != 0;
        }
    n = split_list(raw->retired, items, MAX_GPUS);
    for (unsigned int k = 0; k < n; k++)
        if ((index = (unsigned int)strtoul(items[k], NULL, 10)) < MAX_GPUS)
            cfg->gpu[index].retired_pending = 1;
    n = split_list(raw->nvlink, items, MAX_GPUS);
    for (unsigned int k = 0; k < n; k++) {
        char *save = NULL;
        for (char *member = strtok_r(items[k], "+", &save); member; member = strtok_r(NULL, "+", &save))
            if ((index = (unsigned int)strtoul(member, NULL, 10)) < MAX_GPUS)
                cfg->gpu[index].nvlink_group = k + 1;
    }
}

static void fill_gpu_lists(struct node_config *cfg, struct raw_lists *raw)
{
    static const unsigned int dgx_buses[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};
    char *items[MAX_GPUS];
    unsigned int n_minors = split_list(raw->minors, items, MAX_GPUS);
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        cfg->gpu[i].minor = i < n_minors ? (unsigned int)strtoul(items[i], NULL, 10) : i;

    struct stat run_st;
    char seed_text[64];
    if (stat(cfg->run_dir, &run_st) != 0)
        memset(&run_st, 0, sizeof run_st);
    unsigned int n_uuids = split_list(raw->uuids, items, MAX_GPUS);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        if (i < n_uuids) {
            copy_text(cfg->gpu[i].uuid, TEXT_LEN, items[i]);
            continue;
        }
        snprintf(seed_text, sizeof seed_text, "%llu:%llu:%u", (unsigned long long)run_st.st_dev,
                 (unsigned long long)run_st.st_ino, i);
        unsigned long long a = hash_text(seed_text, 0), b = hash_text(seed_text, 0x9e3779b97f4a7c15ULL);
        snprintf(cfg->gpu[i].uuid, TEXT_LEN, "GPU-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32,
                 (a >> 16) & 0xffff, a & 0xffff, b >> 48, b & 0xffffffffffffULL);
    }

    unsigned int n_pci = split_list(raw->pci_bus_ids, items, MAX_GPUS);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct gpu_config *g = &cfg->gpu[i];
        unsigned int function;
        if (i < n_pci &&
            sscanf(items[i], "%x:%x:%x.%x", &g->pci_domain, &g->pci_bus, &g->pci_device, &function) == 4)
            continue;
        g->pci_domain = i / 8;
        g->pci_bus = dgx_buses[i % 8];
        g->pci_device = 0;
    }

    unsigned int n_stray = split_list(raw->stray, items, MAX_GPUS);
    for (unsigned int k = 0; k < n_stray; k++) {
        unsigned int index;
        unsigned long long mib;
        if (sscanf(items[k], "%u:%llu", &index, &mib) == 2 && index < MAX_GPUS)
            cfg->gpu[index].stray_mib += mib;
    }

    unsigned int n_lost = split_list(raw->lost, items, MAX_GPUS);
    for (unsigned int k = 0; k < n_lost; k++) {
        unsigned long index = strtoul(items[k], NULL, 10);
        if (index < MAX_GPUS)
            cfg->gpu[index].lost = 1;
    }
    fill_mig(cfg, raw);
    fill_recovery(cfg, raw);
}

/* Reloads g_cfg from <run>/node.conf (defaults where a key or the file is missing). */
static void load_config(void)
{
    static struct raw_lists raw;
    static char text[65536];
    struct node_config *cfg = &g_cfg;
    const char *run = getenv("GPUSIM_RUN");

    apply_defaults(cfg);
    memset(&raw, 0, sizeof raw);
    copy_text(cfg->run_dir, sizeof cfg->run_dir, run && *run ? run : "/run/gpusim");

    char path[PATH_MAX + 32];
    path_join(path, sizeof path, cfg->run_dir, "node.conf");
    if (read_small_file(AT_FDCWD, path, text, sizeof text, NULL) >= 0) {
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *eq = strchr(line, '=');
            line = trim(line);
            if (*line == '#' || !eq)
                continue;
            *eq = '\0';
            set_key(cfg, &raw, trim(line), trim(eq + 1));
        }
    }
    fill_gpu_lists(cfg, &raw);

    if (!cfg->proc_dir[0]) {
        /* <run>/proc counts only when a procfs is mounted there (it has "self") */
        struct stat st;
        char self[PATH_MAX + 32];
        path_join(path, sizeof path, cfg->run_dir, "proc");
        path_join(self, sizeof self, path, "self");
        copy_text(cfg->proc_dir, sizeof cfg->proc_dir, lstat(self, &st) == 0 ? path : "/proc");
    }
}

/* ---- call entry: lock, config, hang, init ------------------------------------------------ */

static void hang_forever(void)
{
    for (;;)
        sleep(3600);
}

enum entry_kind { NEEDS_INIT, INIT_CALL, NO_INIT };

/* Locks, reloads the config and blocks forever if this call is told to hang.
 * Returns with g_lock held; release it with leave(). */
static nvmlReturn_t enter(const char *symbol, enum entry_kind kind)
{
    pthread_mutex_lock(&g_lock);
    load_config();
    int hang = !strcmp(g_cfg.hang, symbol) ||
               (!strcmp(g_cfg.hang, "all") && g_init_count > 0 && kind != INIT_CALL);
    if (hang) {
        pthread_mutex_unlock(&g_lock);
        hang_forever();
    }
    if (kind == NEEDS_INIT && g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Resolves a GPU or MIG device handle: *index is the GPU, *mig -1 for the GPU itself or the
 * MIG device's position in gpu[*index].mig. Checks validity and the lost knob. */
static nvmlReturn_t device_ref(nvmlDevice_t device, unsigned int *index, int *mig)
{
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)g_devices, mig_base = (uintptr_t)g_mig_devices;
    unsigned int i;
    if (p >= base && p < base + sizeof g_devices && (p - base) % sizeof g_devices[0] == 0) {
        i = (unsigned int)((p - base) / sizeof g_devices[0]);
        if (i >= g_cfg.gpus || g_devices[i].index != i || g_devices[i].mig != 0) /* never handed out */
            return NVML_ERROR_INVALID_ARGUMENT;
        *mig = -1;
    } else if (p >= mig_base && p < mig_base + sizeof g_mig_devices &&
               (p - mig_base) % sizeof g_mig_devices[0][0] == 0) {
        size_t slot = (p - mig_base) / sizeof g_mig_devices[0][0];
        i = (unsigned int)(slot / MAX_MIG);
        unsigned int k = (unsigned int)(slot % MAX_MIG);
        /* A MIG handle is invalid once its instance is gone (nvml.h: request it again). */
        if (i >= g_cfg.gpus || g_mig_devices[i][k].mig != k + 1 ||
            g_cfg.gpu[i].mig_current != NVML_DEVICE_MIG_ENABLE || k >= g_cfg.gpu[i].mig_count)
            return NVML_ERROR_INVALID_ARGUMENT;
        *mig = (int)k;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (g_cfg.gpu[i].lost)
        return NVML_ERROR_GPU_IS_LOST;
    *index = i;
    return NVML_SUCCESS;
}

/* Resolves a GPU handle; a MIG device handle answers NVML_ERROR_NOT_SUPPORTED. */
static nvmlReturn_t device_index(nvmlDevice_t device, unsigned int *index)
{
    int mig;
    nvmlReturn_t rc = device_ref(device, index, &mig);
    return rc == NVML_SUCCESS && mig >= 0 ? NVML_ERROR_NOT_SUPPORTED : rc;
}

/* enter() for calls on a GPU handle. */
static nvmlReturn_t enter_device(const char *symbol, nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t rc = enter(symbol, NEEDS_INIT);
    return rc != NVML_SUCCESS ? rc : device_index(device, index);
}

/* enter() for calls that take a GPU or a MIG device handle. */
static nvmlReturn_t enter_any_device(const char *symbol, nvmlDevice_t device, unsigned int *index, int *mig)
{
    nvmlReturn_t rc = enter(symbol, NEEDS_INIT);
    return rc != NVML_SUCCESS ? rc : device_ref(device, index, mig);
}

/* Whether this caller may read a MIG-enabled GPU's aggregate memory and process lists (nvml.h:
 * "only if the caller has appropriate privileges"): root, unless mig_privileged says otherwise. */
static int mig_privileged(void)
{
    return g_cfg.mig_privileged >= 0 ? g_cfg.mig_privileged : geteuid() == 0;
}

/* NVML_ERROR_NO_PERMISSION for an unprivileged aggregate query on a MIG-enabled GPU's handle. */
static nvmlReturn_t aggregate_allowed(unsigned int index, int mig)
{
    return mig < 0 && g_cfg.gpu[index].mig_current == NVML_DEVICE_MIG_ENABLE && !mig_privileged()
               ? NVML_ERROR_NO_PERMISSION : NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *text)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* ---- handles held in /proc: fds (any thread) and mappings -------------------------------- */

struct handle {
    unsigned int minor;
    unsigned long long token;
    unsigned long pid; /* a process that holds it */
};

struct handle_set {
    struct handle *items;
    size_t count, capacity;
};

static const struct handle *handle_set_find(const struct handle_set *set, unsigned int minor,
                                            unsigned long long token)
{
    for (size_t k = 0; k < set->count; k++)
        if (set->items[k].minor == minor && set->items[k].token == token)
            return &set->items[k];
    return NULL;
}

static void handle_set_add(struct handle_set *set, unsigned int minor, unsigned long long token,
                           unsigned long pid)
{
    if (handle_set_find(set, minor, token))
        return;
    if (set->count == set->capacity) {
        size_t capacity = set->capacity ? set->capacity * 2 : 16;
        struct handle *items = realloc(set->items, capacity * sizeof *items);
        if (!items)
            return;
        set->items = items;
        set->capacity = capacity;
    }
    set->items[set->count++] = (struct handle){minor, token, pid};
}

/* The device files, identified by the file (device and inode), not by the path: a bind mount of
 * <dev_dir>/nvidia0 elsewhere, or an fd opened through another path, is the same device (the kernel
 * finds the driver through the inode, never the name: kernel-open/nvidia/nv.c nvidia_open takes the
 * minor from the inode). nvidiactl is CTL_MINOR. */
struct device_ids {
    unsigned int count;
    struct {
        unsigned long long dev, ino;
        unsigned int minor;
    } items[MAX_GPUS + 1];
    char key[PATH_MAX + 64]; /* what the identities were taken from (cache key) */
};

static void add_device_id(struct device_ids *ids, const char *name, unsigned int minor)
{
    char path[PATH_MAX + 32];
    struct stat st;
    path_join(path, sizeof path, g_cfg.dev_dir, name);
    if (stat(path, &st) != 0 || ids->count > MAX_GPUS)
        return;
    ids->items[ids->count].dev = (unsigned long long)st.st_dev;
    ids->items[ids->count].ino = (unsigned long long)st.st_ino;
    ids->items[ids->count].minor = minor;
    ids->count++;
}

static void make_device_ids(struct device_ids *ids)
{
    char name[32];
    ids->count = 0;
    add_device_id(ids, "nvidiactl", CTL_MINOR);
    for (unsigned int i = 0; i < g_cfg.gpus; i++) {
        snprintf(name, sizeof name, "nvidia%u", g_cfg.gpu[i].minor);
        add_device_id(ids, name, g_cfg.gpu[i].minor);
    }
    snprintf(ids->key, sizeof ids->key, "%s", g_cfg.dev_dir);
    for (unsigned int k = 0; k < ids->count; k++) {
        size_t len = strlen(ids->key);
        snprintf(ids->key + len, sizeof ids->key - len, ":%llx.%llx", ids->items[k].dev, ids->items[k].ino);
    }
}

/* The minor of the device file (dev, ino), or 0 when it is none of them. */
static int device_minor(const struct device_ids *ids, unsigned long long dev, unsigned long long ino,
                        unsigned int *minor)
{
    for (unsigned int k = 0; k < ids->count; k++)
        if (ids->items[k].ino == ino && ids->items[k].dev == dev) {
            *minor = ids->items[k].minor;
            return 1;
        }
    return 0;
}

static int is_number(const char *name)
{
    if (!*name)
        return 0;
    for (; *name; name++)
        if (!isdigit((unsigned char)*name))
            return 0;
    return 1;
}

/* Adds the device fds (position > 0) of one thread: each fd is matched by the file it points to. */
static void scan_thread_fds(int task_dir, const char *tid, unsigned long pid,
                            const struct device_ids *ids, struct handle_set *out)
{
    char path[NAME_MAX * 2 + 16], info[256];
    snprintf(path, sizeof path, "%s/fd", tid);
    int fd_dir = openat(task_dir, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_dir < 0)
        return;
    DIR *dir = fdopendir(fd_dir);
    if (!dir) {
        close(fd_dir);
        return;
    }
    struct dirent *entry;
    struct stat st;
    while ((entry = readdir(dir))) {
        unsigned int minor;
        if (!is_number(entry->d_name) || fstatat(fd_dir, entry->d_name, &st, 0) != 0 ||
            !device_minor(ids, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, &minor))
            continue;
        snprintf(path, sizeof path, "%s/fdinfo/%s", tid, entry->d_name);
        if (read_small_file(task_dir, path, info, sizeof info, NULL) < 0 || strncmp(info, "pos:", 4))
            continue;
        unsigned long long pos = strtoull(info + 4, NULL, 10);
        if (pos > 0)
            handle_set_add(out, minor, pos, pid);
    }
    closedir(dir);
}

/* Adds the device mappings of one thread's address space. Returns 0 when its maps are empty
 * (kernel thread, or a thread-group leader that has exited). */
static int scan_thread_maps(int task_dir, const char *tid, unsigned long pid,
                            const struct device_ids *ids, struct handle_set *out)
{
    static char *buf;
    static size_t capacity;
    char path[NAME_MAX + 16];
    snprintf(path, sizeof path, "%s/maps", tid);
    int fd = openat(task_dir, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t len = 0;
    for (;;) {
        if (capacity - len < 65536) {
            size_t grown = capacity ? capacity * 2 : 262144;
            char *bigger = realloc(buf, grown);
            if (!bigger)
                break;
            buf = bigger;
            capacity = grown;
        }
        ssize_t n = read(fd, buf + len, capacity - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (len == 0)
        return 0;
    buf[len] = '\0';

    /* line: start-end perms offset dev inode path; the mapped file is (dev, inode) */
    for (char *line = buf; line < buf + len;) {
        char *line_end = memchr(line, '\n', len - (size_t)(line - buf));
        if (!line_end)
            line_end = buf + len;
        *line_end = '\0';
        unsigned long long offset, ino;
        unsigned int major_nr, minor_nr, minor;
        if (sscanf(line, "%*x-%*x %*s %llx %x:%x %llu", &offset, &major_nr, &minor_nr, &ino) == 4 && ino != 0 &&
            device_minor(ids, (unsigned long long)makedev(major_nr, minor_nr), ino, &minor) &&
            offset % PAGE_BYTES == 0 && offset > 0)
            handle_set_add(out, minor, offset / PAGE_BYTES, pid);
        line = line_end + 1;
    }
    return 1;
}

/* Adds every device handle held by process pid (all threads; its address space once). */
static void scan_process(int proc_dir, unsigned long pid, const struct device_ids *ids,
                         struct handle_set *out)
{
    char path[64];
    snprintf(path, sizeof path, "%lu/task", pid);
    int task_dir = openat(proc_dir, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (task_dir < 0)
        return;
    DIR *tasks = fdopendir(task_dir);
    if (!tasks) {
        close(task_dir);
        return;
    }
    int maps_seen = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks))) {
        if (!is_number(entry->d_name))
            continue;
        scan_thread_fds(task_dir, entry->d_name, pid, ids, out);
        if (!maps_seen)
            maps_seen = scan_thread_maps(task_dir, entry->d_name, pid, ids, out);
    }
    closedir(tasks);
}

/* Handles held by process pid alone. The caller frees out->items. */
static void process_handles(unsigned long pid, const struct device_ids *ids, struct handle_set *out)
{
    int proc_dir = open(g_cfg.proc_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc_dir < 0)
        return;
    scan_process(proc_dir, pid, ids, out);
    close(proc_dir);
}

/* Handles held by any process of proc_dir; one scan is reused for SCAN_REUSE_SECONDS. */
static const struct handle_set *all_handles(const struct device_ids *ids)
{
    static struct handle_set scan;
    static double taken_at = -1;
    static char taken_for[2 * PATH_MAX + 128];
    char key[sizeof taken_for];
    snprintf(key, sizeof key, "%s\n%s", g_cfg.proc_dir, ids->key);
    double now = monotonic_seconds();
    if (taken_at >= 0 && now - taken_at < SCAN_REUSE_SECONDS && !strcmp(key, taken_for))
        return &scan;

    scan.count = 0;
    int proc_dir = open(g_cfg.proc_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc_dir >= 0) {
        DIR *dir = fdopendir(proc_dir);
        if (dir) {
            struct dirent *entry;
            while ((entry = readdir(dir)))
                if (is_number(entry->d_name))
                    scan_process(proc_dir, strtoul(entry->d_name, NULL, 10), ids, &scan);
            closedir(dir);
        } else {
            close(proc_dir);
        }
    }
    taken_at = monotonic_seconds();
    copy_text(taken_for, sizeof taken_for, key);
    return &scan;
}

/* ---- contexts and their release ------------------------------------------------------------ */

struct context_line {
    unsigned int gpu;
    unsigned long long mib;
    unsigned long long managed_mib; /* "managed=M": cudaMallocManaged memory charged to the GPU, not to the list */
    enum context_type type;
    unsigned int gi, ci; /* MIG instance ("gi=G ci=C"); NO_INSTANCE_ID when not given */
    unsigned long ipc_token;   /* "ipc=E:K": memory imported from context E (CUDA IPC); 0: none */
    unsigned long long ipc_mib; /* K */
    unsigned long long pinned_mib; /* "pinned=M": host memory pinned through the context */
    int held;    /* some process (the creator or not) holds a handle */
    int counted; /* memory still allocated (held or releasing) */
    int listed;  /* shown in the process lists: while counted (a dead holder stays listed until the release) */
};

struct context {
    unsigned long token; /* the handles' file position: pid, or pid + (G << 32) for the file <pid>.<G> */
    unsigned long pid;   /* the creator's number in proc_dir's namespace */
    unsigned long long inode;
    unsigned int count;
    struct context_line lines[MAX_GPUS];
};

/* The device file whose handle keeps a line: the GPU's /dev/nvidia<minor>; for an MPS client's
 * line, /dev/nvidiactl (the simulator's bookkeeping: the client holds its GPU's file too). */
static unsigned int handle_minor(const struct context_line *line)
{
    return line->type == CONTEXT_MPS ? CTL_MINOR : g_cfg.gpu[line->gpu].minor;
}

static int parse_context(const char *text, struct context *ctx)
{
    char copy[8192], *save = NULL;
    copy_text(copy, sizeof copy, text);
    ctx->count = 0;
    for (char *line = strtok_r(copy, "\n", &save); line && ctx->count < MAX_GPUS;
         line = strtok_r(NULL, "\n", &save)) {
        unsigned int gpu, gi = NO_INSTANCE_ID, ci = NO_INSTANCE_ID;
        unsigned long long mib, managed = 0, pinned = 0, ipc_mib = 0;
        unsigned long ipc_token = 0;
        char type[16] = "compute", *word_save = NULL;
        int words = 0, bad = 0;
        /* "<index> <MiB> [type] [gi=<G> ci=<C>]": the type and the instance ids in any order */
        for (char *word = strtok_r(line, " \t", &word_save); word; word = strtok_r(NULL, " \t", &word_save)) {
            words++;
            if (words == 1)
                bad |= sscanf(word, "%u", &gpu) != 1;
            else if (words == 2)
                bad |= sscanf(word, "%llu", &mib) != 1;
            else if (!strncmp(word, "gi=", 3))
                gi = (unsigned int)strtoul(word + 3, NULL, 10);
            else if (!strncmp(word, "ci=", 3))
                ci = (unsigned int)strtoul(word + 3, NULL, 10);
            else if (!strncmp(word, "managed=", 8))
                managed = strtoull(word + 8, NULL, 10);
            else if (!strncmp(word, "pinned=", 7))
                pinned = strtoull(word + 7, NULL, 10);
            else if (!strncmp(word, "ipc=", 4))
                bad |= sscanf(word + 4, "%lu:%llu", &ipc_token, &ipc_mib) != 2;
            else
                copy_text(type, sizeof type, word);
        }
        if (bad || words < 2 || gpu >= g_cfg.gpus)
            continue;
        if (gi != NO_INSTANCE_ID && ci == NO_INSTANCE_ID)
            ci = 0; /* one compute instance per GPU instance: its id is 0 */
        struct context_line *l = &ctx->lines[ctx->count];
        l->gi = gi;
        l->ci = ci;
        if (!strcmp(type, "compute"))
            l->type = CONTEXT_COMPUTE;
        else if (!strcmp(type, "graphics"))
            l->type = CONTEXT_GRAPHICS;
        else if (!strcmp(type, "mps"))
            l->type = CONTEXT_MPS;
        else
            continue;
        l->gpu = gpu;
        l->mib = mib;
        l->managed_mib = managed;
        l->pinned_mib = pinned;
        l->ipc_token = ipc_token;
        l->ipc_mib = ipc_mib;
        ctx->count++;
    }
    return ctx->count > 0;
}

/* State of line (token, gpu) kept in <run>/released/ (mode 1777), valid for one context file
 * (its inode: a reused PID writes a new file):
 *   <T>.<i>         "<inode> <start>": the release began at CLOCK_MONOTONIC second start
 *                   (first writer wins; a release is never undone);
 *   <T>.<i>.holder  "<inode> <pid>": a process other than T last seen holding the handle,
 *                   checked before falling back to a full scan. */
static void state_path(char *out, size_t size, const struct context *ctx, unsigned int gpu, const char *suffix)
{
    char dir[PATH_MAX];
    path_join(dir, sizeof dir, g_cfg.run_dir, "released");
    if (mkdir(dir, 01777) == 0)
        chmod(dir, 01777); /* mkdir applies the umask */
    snprintf(out, size, "%s/%lu.%u%s", dir, ctx->token, gpu, suffix);
}

/* Reads "<inode> <value>" from a state file; 0 when missing or left by another context. */
static int read_state(const char *path, const struct context *ctx, double *value)
{
    char text[128];
    unsigned long long inode;
    return read_small_file(AT_FDCWD, path, text, sizeof text, NULL) > 0 &&
           sscanf(text, "%llu %lf", &inode, value) == 2 && inode == ctx->inode;
}

/* Writes "<inode> <value>" to path: by link (fails if path exists) or by rename (replaces it). */
static int write_state(const char *path, const struct context *ctx, const char *value, int replace)
{
    char tmp[PATH_MAX + 128];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f)
        return 0;
    fprintf(f, "%llu %s\n", ctx->inode, value);
    int written = fclose(f) == 0 && (replace ? rename(tmp, path) : link(tmp, path)) == 0;
    unlink(tmp);
    return written;
}

/* When the release of line (token, gpu) began: its marker, or now (recorded). */
static double release_start(const struct context *ctx, unsigned int gpu, double now)
{
    char path[PATH_MAX + 64], value[32];
    double start;
    state_path(path, sizeof path, ctx, gpu, "");
    snprintf(value, sizeof value, "%.6f", now);
    for (int attempt = 0; attempt < 3; attempt++) {
        if (read_state(path, ctx, &start))
            return start;
        unlink(path); /* missing, or left by an earlier context of a reused PID */
        if (write_state(path, ctx, value, 0))
            return now;
    }
    return now;
}

/* Whether some process holds a handle with ctx's token on GPU gpu: the last holder seen
 * first, then a scan of every process (which records the holder it finds). */
static int held_by_another(const struct context *ctx, const struct context_line *line,
                           const struct device_ids *ids)
{
    char path[PATH_MAX + 64], value[32];
    unsigned int gpu = line->gpu, minor = handle_minor(line);
    double pid;
    state_path(path, sizeof path, ctx, gpu, ".holder");
    if (read_state(path, ctx, &pid)) {
        struct handle_set set = {0};
        process_handles((unsigned long)pid, ids, &set);
        int holds = handle_set_find(&set, minor, ctx->token) != NULL;
        free(set.items);
        if (holds)
            return 1;
    }
    const struct handle *found = handle_set_find(all_handles(ids), minor, ctx->token);
    if (!found)
        return 0;
    snprintf(value, sizeof value, "%lu", found->pid);
    write_state(path, ctx, value, 1);
    return 1;
}

/* ---- PIDs as the driver reports them ------------------------------------------------------- */

/* A driver client keeps a reference to its creator's struct pid (rmapi/client.c rmclientConstruct:
 * pOsPidInfo = osGetPidInfo(), os-interface.c os_get_pid_info: get_task_pid(current, PIDTYPE_TGID)),
 * which keeps the creator's number in every PID namespace it had, alive or dead. The lists give the
 * number in the caller's namespace (gpu_rmapi.c _gpuConvertPid -> os-interface.c os_find_ns_pid ->
 * pid_vnr) and skip a client that has none there (NV_ERR_OBJECT_NOT_FOUND). Here the struct pid is
 * <run>/released/<T>.pid, "<inode> <levels> <ns>:<nr> ...", one pair per level from proc_dir's
 * namespace down (level 0's namespace is proc_dir's own, recorded as 0), written the first time a
 * call sees the creator alive. */
#define MAX_PID_LEVELS 8

struct pid_record {
    unsigned int levels;
    unsigned long long ns[MAX_PID_LEVELS];
    unsigned long nr[MAX_PID_LEVELS];
};

/* The inode of <proc>/<who>/ns/pid ("pid:[4026531836]"), 0 when it cannot be read. */
static unsigned long long pid_ns_inode(const char *who)
{
    char path[PATH_MAX + 64], link[64];
    snprintf(path, sizeof path, "%s/%s/ns/pid", g_cfg.proc_dir, who);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
        return 0;
    link[n] = '\0';
    const char *open = strchr(link, '[');
    return open ? strtoull(open + 1, NULL, 10) : 0;
}

/* NSpid of <proc>/<who> into nr (at most max; returns the count, 0 when unreadable) and its PPid. */
static unsigned int read_nspid(const char *who, unsigned long *nr, unsigned int max, unsigned long *ppid)
{
    char path[PATH_MAX + 64], text[4096];
    snprintf(path, sizeof path, "%s/%s/status", g_cfg.proc_dir, who);
    if (read_small_file(AT_FDCWD, path, text, sizeof text, NULL) <= 0)
        return 0;
    const char *p = strstr(text, "\nPPid:");
    if (ppid)
        *ppid = p ? strtoul(p + 6, NULL, 10) : 0;
    p = strstr(text, "\nNSpid:");
    if (!p)
        return 0;
    p += 7;
    unsigned int count = 0;
    while (count < max) {
        char *end;
        unsigned long value = strtoul(p, &end, 10);
        if (end == p)
            break;
        nr[count++] = value;
        p = end;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\n' || !*p)
            break;
    }
    return count;
}

static void pid_record_path(char *out, size_t size, const struct context *ctx)
{
    char dir[PATH_MAX];
    path_join(dir, sizeof dir, g_cfg.run_dir, "released");
    snprintf(out, size, "%s/%lu.pid", dir, ctx->token);
}

/* The creator's numbers and namespaces while it lives: its NSpid, its own namespace, the namespaces
 * above from its ancestors (a process's parent is in its namespace or the parent namespace). */
static int creator_record(const struct context *ctx, struct pid_record *rec)
{
    char who[32];
    unsigned long ppid;
    snprintf(who, sizeof who, "%lu", ctx->pid);
    rec->levels = read_nspid(who, rec->nr, MAX_PID_LEVELS, &ppid);
    if (rec->levels == 0)
        return 0;
    memset(rec->ns, 0, sizeof rec->ns);
    rec->ns[rec->levels - 1] = pid_ns_inode(who);
    for (int hops = 0; ppid > 0 && hops < 64; hops++) {
        unsigned long nr[MAX_PID_LEVELS], next;
        snprintf(who, sizeof who, "%lu", ppid);
        unsigned int levels = read_nspid(who, nr, MAX_PID_LEVELS, &next);
        if (levels == 0)
            break;
        if (levels <= rec->levels && !rec->ns[levels - 1])
            rec->ns[levels - 1] = pid_ns_inode(who);
        ppid = next;
    }
    return rec->levels == 1 || rec->ns[rec->levels - 1] != 0;
}

/* Records the creator's struct pid the first time it is seen alive (a no-op once recorded). */
static void remember_creator(const struct context *ctx)
{
    char path[PATH_MAX + 64], value[MAX_PID_LEVELS * 48 + 16];
    double levels;
    struct pid_record rec;
    pid_record_path(path, sizeof path, ctx);
    if (read_state(path, ctx, &levels) || !creator_record(ctx, &rec))
        return;
    int len = snprintf(value, sizeof value, "%u", rec.levels);
    for (unsigned int k = 0; k < rec.levels && len < (int)sizeof value; k++)
        len += snprintf(value + len, sizeof value - (size_t)len, " %llu:%lu", rec.ns[k], rec.nr[k]);
    write_state(path, ctx, value, 0);
}

/* The creator's struct pid: recorded, or (never seen alive) the number in proc_dir's namespace. */
static void creator_pid(const struct context *ctx, struct pid_record *rec)
{
    char path[PATH_MAX + 64], text[MAX_PID_LEVELS * 48 + 64];
    pid_record_path(path, sizeof path, ctx);
    rec->levels = 0;
    unsigned long long inode;
    int used;
    if (read_small_file(AT_FDCWD, path, text, sizeof text, NULL) > 0 &&
        sscanf(text, "%llu %u%n", &inode, &rec->levels, &used) == 2 && inode == ctx->inode) {
        const char *p = text + used;
        unsigned int k = 0;
        int n;
        while (k < rec->levels && k < MAX_PID_LEVELS && sscanf(p, " %llu:%lu%n", &rec->ns[k], &rec->nr[k], &n) == 2) {
            p += n;
            k++;
        }
        rec->levels = k;
    }
    if (rec->levels == 0) {
        rec->levels = 1;
        rec->ns[0] = 0;
        rec->nr[0] = ctx->pid;
    }
}

/* The caller's PID namespace: its level below proc_dir's and its inode. */
struct caller_ns {
    unsigned int level;
    unsigned long long ns;
    int init_numbers; /* drivers before 535.113.01: init-namespace numbers for every caller */
};

static int driver_translates(void)
{
    if (g_cfg.pid_namespace != PIDNS_AUTO)
        return g_cfg.pid_namespace == PIDNS_CALLER;
    unsigned int major = 0, minor = 0, patch = 0;
    sscanf(g_cfg.driver_version, "%u.%u.%u", &major, &minor, &patch);
    return major > 535 || (major == 535 && minor >= 113);
}

static void caller_namespace(struct caller_ns *caller)
{
    unsigned long nr[MAX_PID_LEVELS];
    unsigned int levels = read_nspid("self", nr, MAX_PID_LEVELS, NULL);
    caller->level = levels ? levels - 1 : 0;
    caller->ns = pid_ns_inode("self");
    caller->init_numbers = !driver_translates();
}

/* The creator's number as the caller sees it (pid_vnr); 0 when it has none in the caller's namespace. */
static unsigned long listed_pid(const struct context *ctx, const struct caller_ns *caller)
{
    struct pid_record rec;
    creator_pid(ctx, &rec);
    if (caller->init_numbers || caller->level == 0) /* level 0: proc_dir's own namespace, every process has a number */
        return rec.nr[0];
    if (caller->level >= rec.levels || rec.ns[caller->level] != caller->ns)
        return 0;
    return rec.nr[caller->level];
}

/* Seconds that host memory pinned through a context adds to its release. Measured after SIGKILL on an NVIDIA
 * H200, driver 580.159.04 (tests/sim/README.md): released after 0.151 s without pinned memory; with 8 GiB on the
 * GPU, 0.178 s with 1 GiB pinned, 2.467 s with 32 GiB. Here the first GiB adds 0.029 s, each further GiB 0.0739 s. */
static double pinned_seconds(unsigned long long mib)
{
    double gib = (double)mib / 1024.0;
    return gib <= 1.0 ? 0.029 * gib : 0.029 + 0.0739 * (gib - 1.0);
}

/* Decides held/counted/listed for every line of ctx; removes the context once all is freed. */
static void evaluate_context(struct context *ctx, const char *ctx_path, const struct device_ids *ids)
{
    char path[PATH_MAX + 64];
    struct handle_set own = {0};
    process_handles(ctx->pid, ids, &own);
    remember_creator(ctx);
    double now = monotonic_seconds(), start;
    int any_counted = 0;
    for (unsigned int k = 0; k < ctx->count; k++) {
        struct context_line *l = &ctx->lines[k];
        double wait = g_cfg.release_latency + pinned_seconds(l->pinned_mib);
        state_path(path, sizeof path, ctx, l->gpu, "");
        l->held = 0;
        if (read_state(path, ctx, &start)) {
            l->counted = now < start + wait;
        } else {
            /* The driver client lives, listed under its creator's PID, while any process holds the file it
             * was made on (the creator or a process that inherited the fd): gpu_rmapi.c gpuGetProcWithObject
             * walks the live clients, osapi.c RmFreeUnusedClients frees them at the file's last close. */
            l->held = handle_set_find(&own, handle_minor(l), ctx->token) != NULL || held_by_another(ctx, l, ids);
            l->counted = l->held || now < release_start(ctx, l->gpu, now) + wait;
        }
        /* Listed until the memory is released: a SIGKILLed holder's PID stays in the lists with its memory
         * (0.15 s on an H200; unlisted at the moment of the release). */
        l->listed = l->counted;
        any_counted |= l->counted;
    }
    free(own.items);
    if (any_counted)
        return;
    struct stat st;
    if (stat(ctx_path, &st) == 0 && (unsigned long long)st.st_ino == ctx->inode)
        unlink(ctx_path);
    for (unsigned int k = 0; k < ctx->count; k++) {
        state_path(path, sizeof path, ctx, ctx->lines[k].gpu, "");
        unlink(path);
        state_path(path, sizeof path, ctx, ctx->lines[k].gpu, ".holder");
        unlink(path);
    }
    pid_record_path(path, sizeof path, ctx);
    unlink(path);
}

/* The contexts with a line on one GPU, read and evaluated. */
struct context_set {
    struct context *items;
    size_t count, capacity;
};

/* A context file's name: "<T>", or "<T>.<G>" (G >= 1) for a context made by a process whose number T is still
 * listed for an earlier one (a dead creator's: the driver keeps its struct pid). Sets the creator's number and
 * the token, T + (G << 32). Returns 0 for any other name (temporary files start with '.'). */
static int context_name(const char *name, struct context *ctx)
{
    char *end;
    if (!isdigit((unsigned char)name[0]))
        return 0;
    unsigned long pid = strtoul(name, &end, 10), generation = 0;
    if (*end == '.') {
        const char *rest = end + 1;
        if (!isdigit((unsigned char)*rest))
            return 0;
        generation = strtoul(rest, &end, 10);
        if (generation == 0)
            return 0;
    }
    if (*end || pid == 0 || pid > 0xFFFFFFFFUL || generation > 0xFFFFUL)
        return 0;
    ctx->pid = pid;
    ctx->token = pid + (generation << 32);
    return 1;
}

/* Reads and evaluates every context with a line on GPU gpu into set (the caller frees set->items). */
static void load_contexts(unsigned int gpu, struct context_set *set)
{
    char dir_path[PATH_MAX], ctx_path[PATH_MAX + 32], text[8192];
    static struct device_ids ids;
    struct context ctx;
    path_join(dir_path, sizeof dir_path, g_cfg.run_dir, "contexts");
    DIR *dir = opendir(dir_path);
    if (!dir)
        return;
    make_device_ids(&ids);
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        if (!context_name(entry->d_name, &ctx))
            continue;
        path_join(ctx_path, sizeof ctx_path, dir_path, entry->d_name);
        if (read_small_file(AT_FDCWD, ctx_path, text, sizeof text, &ctx.inode) < 0 || !parse_context(text, &ctx))
            continue;
        int on_gpu = 0;
        for (unsigned int k = 0; k < ctx.count; k++)
            on_gpu |= ctx.lines[k].gpu == gpu;
        if (!on_gpu)
            continue;
        evaluate_context(&ctx, ctx_path, &ids);
        if (set->count == set->capacity) {
            size_t capacity = set->capacity ? set->capacity * 2 : 16;
            struct context *items = realloc(set->items, capacity * sizeof *items);
            if (!items)
                break;
            set->items = items;
            set->capacity = capacity;
        }
        set->items[set->count++] = ctx;
    }
    closedir(dir);
}

static struct context_line *line_of(struct context_set *set, unsigned long token, unsigned int gpu)
{
    for (size_t c = 0; c < set->count; c++)
        for (unsigned int k = 0; token == set->items[c].token && k < set->items[c].count; k++)
            if (set->items[c].lines[k].gpu == gpu)
                return &set->items[c].lines[k];
    return NULL;
}

/* CUDA IPC: memory that a live importer took from an exporter is charged to the exporter while the exporter's
 * line is held, to the importer once it is not (the import keeps the allocation; the exporter's own memory is
 * released). Measured on an NVIDIA H200, driver 580.159.04 (tests/sim/README.md). */
static void settle_ipc(struct context_set *set, unsigned int gpu)
{
    for (size_t c = 0; c < set->count; c++)
        for (unsigned int k = 0; k < set->items[c].count; k++) {
            struct context_line *importer = &set->items[c].lines[k];
            if (importer->gpu != gpu || !importer->ipc_token || !importer->counted)
                continue;
            struct context_line *exporter = line_of(set, importer->ipc_token, gpu);
            if (exporter && exporter->held)
                continue;
            importer->mib += importer->ipc_mib;
            if (exporter)
                exporter->mib -= exporter->mib < importer->ipc_mib ? exporter->mib : importer->ipc_mib;
        }
}

/* Calls visit(ctx line) for every line on GPU gpu of every context that has one, after
 * evaluating every such context. */
static void for_each_context_line(unsigned int gpu, void (*visit)(const struct context *, const struct context_line *, void *),
                                  void *arg)
{
    struct context_set set = {0};
    load_contexts(gpu, &set);
    settle_ipc(&set, gpu);
    for (size_t c = 0; c < set.count; c++)
        for (unsigned int k = 0; k < set.items[c].count; k++)
            if (set.items[c].lines[k].gpu == gpu)
                visit(&set.items[c], &set.items[c].lines[k], arg);
    free(set.items);
}

/* Whether a line runs on MIG device mig of its GPU (mig < 0: the whole GPU, every line). A line's
 * instance ids count only while its GPU is in MIG mode and has that instance. */
static const struct mig_instance *line_instance(const struct context_line *line)
{
    const struct gpu_config *g = &g_cfg.gpu[line->gpu];
    if (g->mig_current != NVML_DEVICE_MIG_ENABLE || line->gi == NO_INSTANCE_ID)
        return NULL;
    for (unsigned int k = 0; k < g->mig_count; k++)
        if (g->mig[k].gi == line->gi && g->mig[k].ci == line->ci)
            return &g->mig[k];
    return NULL;
}

static int line_on(const struct context_line *line, int mig)
{
    return mig < 0 || line_instance(line) == &g_cfg.gpu[line->gpu].mig[mig];
}

struct process_list {
    enum context_type type;
    int mig; /* -1: the GPU's aggregate list; else the MIG device's */
    struct caller_ns caller;
    unsigned int count;
    nvmlProcessInfo_t items[1024];
};

static void add_listed_process(const struct context *ctx, const struct context_line *line, void *arg)
{
    struct process_list *list = arg;
    /* An MPS client is in the compute lists too, with the same memory (measured on an H200, 580.159.04). */
    int in_list = line->type == list->type || (line->type == CONTEXT_MPS && list->type == CONTEXT_COMPUTE);
    if (!line->listed || !in_list || list->count >= 1024 || !line_on(line, list->mig))
        return;
    unsigned long pid = listed_pid(ctx, &list->caller);
    if (pid == 0)
        return; /* no number in the caller's PID namespace: the driver skips the entry */
    const struct mig_instance *instance = line_instance(line);
    if (!instance) {
        /* Two driver clients with one number (a dead creator's context and the context of the process that got its
         * number): one entry with both clients' memory. gpu_rmapi.c gpuGetProcWithObject_IMPL skips a client whose
         * number is already in the list (_gpuiIsPidSavedAlready); gpuFindClientInfoWithPidIterator_IMPL adds up the
         * memory of every client with that number. */
        for (unsigned int k = 0; k < list->count; k++)
            if (list->items[k].pid == pid && list->items[k].gpuInstanceId == NO_INSTANCE_ID) {
                list->items[k].usedGpuMemory += line->mib * MIB;
                return;
            }
    }
    list->items[list->count++] = (nvmlProcessInfo_t){
        .pid = (unsigned int)pid,
        .usedGpuMemory = line->mib * MIB,
        .gpuInstanceId = instance ? instance->gi : NO_INSTANCE_ID,
        .computeInstanceId = instance ? instance->ci : NO_INSTANCE_ID,
    };
}

struct counted_on {
    int mig;
    unsigned long long mib;
};

static void add_counted_mib_on(const struct context *ctx, const struct context_line *line, void *arg)
{
    struct counted_on *sum = arg;
    (void)ctx;
    if (line->counted && line_on(line, sum->mig))
        sum->mib += line->mib + line->managed_mib;
}

struct memory_state {
    unsigned long long total, reserved, used, free;
};

/* Memory of GPU gpu (mig < 0) or of its MIG device mig: the instance's profile memory, nothing
 * reserved, used = its contexts. */
static void gpu_memory(unsigned int gpu, int mig, struct memory_state *m)
{
    struct counted_on sum = {mig, 0};
    for_each_context_line(gpu, add_counted_mib_on, &sum);
    if (mig >= 0) {
        m->total = g_cfg.gpu[gpu].mig[mig].profile->mib * MIB;
        m->reserved = 0;
        m->used = sum.mib * MIB;
    } else {
        m->total = g_cfg.memory_total_mib * MIB;
        m->reserved = g_cfg.reserved_mib * MIB;
        m->used = (g_cfg.idle_used_mib + g_cfg.gpu[gpu].stray_mib + sum.mib) * MIB;
    }
    m->free = m->total > m->reserved + m->used ? m->total - m->reserved - m->used : 0;
}

/* ---- exported API ------------------------------------------------------------------------ */

static const char *error_text(nvmlReturn_t rc)
{
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_OPERATING_SYSTEM: return "Operating System Error";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch between versioned argument";
    default: return "Unknown Error";
    }
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    return error_text(result);
}

/* Opens <dev_dir>/name (if it can) and keeps it open until nvmlShutdown. */
static void hold_file(const char *name, int flags)
{
    char path[PATH_MAX + 32];
    path_join(path, sizeof path, g_cfg.dev_dir, name);
    int fd = open(path, flags | O_CLOEXEC);
    if (fd >= 0 && g_held_count < sizeof g_held_fds / sizeof g_held_fds[0])
        g_held_fds[g_held_count++] = fd;
    else if (fd >= 0)
        close(fd);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t rc = enter(__func__, INIT_CALL);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (g_init_count > 0) {
        g_init_count++;
        return leave(NVML_SUCCESS);
    }
    char path[PATH_MAX + 32], name[32];
    path_join(path, sizeof path, g_cfg.dev_dir, "nvidiactl");
    int ctl = open(path, O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    g_held_fds[0] = ctl;
    g_held_count = 1;
    /* Persistence mode off: the first client initializes every GPU, seconds on real hosts
     * (NVIDIA/nvidia-container-toolkit#202). Modelled per process; other threads wait on the lock. */
    if (!g_cfg.persistence_mode && g_cfg.init_seconds > 0) {
        struct timespec pause = {(time_t)g_cfg.init_seconds,
                                 (long)((g_cfg.init_seconds - (double)(time_t)g_cfg.init_seconds) * 1e9)};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
            ;
    }
    for (unsigned int i = 0; i < g_cfg.gpus; i++) {
        snprintf(name, sizeof name, "nvidia%u", g_cfg.gpu[i].minor);
        hold_file(name, O_RDWR);
    }
    /* A real NVML client keeps nvidia-uvm open twice and the MIG capabilities config (root's alone) and
     * monitor (everyone's): measured on an H200, driver 580.159.04 (tests/sim/README.md). */
    hold_file("nvidia-uvm", O_RDWR);
    hold_file("nvidia-uvm", O_RDWR);
    hold_file("nvidia-caps/nvidia-cap1", O_RDONLY);
    hold_file("nvidia-caps/nvidia-cap2", O_RDONLY);
    g_init_count = 1;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = enter(__func__, NEEDS_INIT);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (--g_init_count == 0) {
        for (unsigned int k = 0; k < g_held_count; k++)
            close(g_held_fds[k]);
        g_held_count = 0;
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter(__func__, NEEDS_INIT);
    return leave(rc != NVML_SUCCESS ? rc : copy_out(version, length, g_cfg.driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter(__func__, NO_INIT);
    return leave(rc != NVML_SUCCESS ? rc : copy_out(version, length, g_cfg.nvml_version));
}

static nvmlReturn_t cuda_driver_version(const char *symbol, int *version)
{
    nvmlReturn_t rc = enter(symbol, NEEDS_INIT);
    if (rc == NVML_SUCCESS) {
        if (version)
            *version = g_cfg.cuda_driver_version;
        else
            rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_driver_version(__func__, cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_driver_version(__func__, cudaDriverVersion);
}

static nvmlReturn_t device_count(const char *symbol, unsigned int *count)
{
    nvmlReturn_t rc = enter(symbol, NEEDS_INIT);
    if (rc == NVML_SUCCESS) {
        if (count)
            *count = g_cfg.gpus;
        else
            rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    return device_count(__func__, deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return device_count(__func__, deviceCount);
}

/* Fills *device with GPU index's handle (g_lock held). */
static nvmlReturn_t handle_for(unsigned int index, nvmlDevice_t *device)
{
    if (!device || index >= g_cfg.gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_cfg.gpu[index].lost)
        return NVML_ERROR_GPU_IS_LOST;
    g_devices[index].index = index;
    g_devices[index].mig = 0;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

/* Fills *device with MIG device k of GPU index (g_lock held). */
static nvmlReturn_t mig_handle_for(unsigned int index, unsigned int k, nvmlDevice_t *device)
{
    g_mig_devices[index][k] = (struct nvmlDevice_st){index, k + 1};
    *device = &g_mig_devices[index][k];
    return NVML_SUCCESS;
}

static nvmlReturn_t handle_by_index(const char *symbol, unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = enter(symbol, NEEDS_INIT);
    return leave(rc != NVML_SUCCESS ? rc : handle_for(index, device));
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = enter(__func__, NEEDS_INIT);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* nvml.h: "The UUID of the target GPU or MIG instance" */
    for (unsigned int i = 0; i < g_cfg.gpus; i++) {
        if (!strcmp(g_cfg.gpu[i].uuid, uuid))
            return leave(handle_for(i, device));
        if (g_cfg.gpu[i].mig_current != NVML_DEVICE_MIG_ENABLE)
            continue;
        for (unsigned int k = 0; k < g_cfg.gpu[i].mig_count; k++)
            if (!strcmp(g_cfg.gpu[i].mig[k].uuid, uuid))
                return leave(g_cfg.gpu[i].lost ? NVML_ERROR_GPU_IS_LOST : mig_handle_for(i, k, device));
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* A MIG device handle gives its MIG device index (nvml.h). */
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    if (rc == NVML_SUCCESS && !index)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *index = mig >= 0 ? (unsigned int)mig : i;
    return leave(rc);
}

/* A MIG device's name is the GPU's followed by "MIG <profile>" ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"). */
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    unsigned int i;
    int mig;
    char text[2 * TEXT_LEN];
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (mig < 0)
        return leave(copy_out(name, length, g_cfg.name));
    snprintf(text, sizeof text, "%s MIG %s", g_cfg.name, g_cfg.gpu[i].mig[mig].profile->name);
    return leave(copy_out(name, length, text));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    return leave(rc != NVML_SUCCESS ? rc : copy_out(uuid, length, mig < 0 ? g_cfg.gpu[i].uuid : g_cfg.gpu[i].mig[mig].uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !minorNumber)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *minorNumber = g_cfg.gpu[i].minor;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !mode)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *mode = (g_cfg.gpu[i].persistence < 0 ? g_cfg.persistence_mode : g_cfg.gpu[i].persistence)
                    ? NVML_FEATURE_ENABLED
                    : NVML_FEATURE_DISABLED;
    return leave(rc);
}

/* ---- what the driver advises (tests/sim/README.md, "Recovery") --------------------------- */

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define FAKE_NVLINK_LINKS 18 /* links an H100 SXM has; higher link numbers answer INVALID_ARGUMENT */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType; /* nvmlValueType_t: NVML_VALUE_TYPE_UNSIGNED_INT = 1 */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");

/* Only field 230 answers; every other field answers NOT_SUPPORTED in its own nvmlReturn (nvml.h: the call
 * succeeds and each value carries its own status). */
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && (!values || valuesCount < 0))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int k = 0; k < valuesCount; k++) {
        nvmlFieldValue_t *v = &values[k];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = 1;
            v->value.uiVal = g_cfg.gpu[i].recovery_action;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !(corrRows && uncRows && isPending && failureOccurred))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        const struct gpu_config *g = &g_cfg.gpu[i];
        *corrRows = g->remap_corr, *uncRows = g->remap_unc;
        *isPending = g->remap_pending, *failureOccurred = g->remap_failure;
    }
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !isPending)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isPending = g_cfg.gpu[i].retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(rc);
}

/* The GPU at the far end of `link` of GPU i: the k-th other member of its NVLink group (one link per peer), or
 * -1 for an inactive link. NOT_SUPPORTED for a GPU without direct NVLink, INVALID_ARGUMENT past its links. */
static nvmlReturn_t nvlink_peer(unsigned int i, unsigned int link, int *peer)
{
    unsigned int group = g_cfg.gpu[i].nvlink_group, k = 0;
    if (!group)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= FAKE_NVLINK_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *peer = -1;
    for (unsigned int j = 0; j < g_cfg.gpus; j++)
        if (j != i && g_cfg.gpu[j].nvlink_group == group && k++ == link)
            *peer = (int)j;
    return NVML_SUCCESS;
}

/* enter_device, then the far end of `link` (nvlink_peer); with `need_peer`, an inactive link answers NOT_SUPPORTED. */
static nvmlReturn_t enter_link(const char *symbol, nvmlDevice_t device, unsigned int link, const void *out,
                               int need_peer, unsigned int *i, int *peer)
{
    nvmlReturn_t rc = enter_device(symbol, device, i);
    if (rc == NVML_SUCCESS && !out)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        rc = nvlink_peer(*i, link, peer);
    if (rc == NVML_SUCCESS && need_peer && *peer < 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    unsigned int i;
    int peer;
    nvmlReturn_t rc = enter_link(__func__, device, link, isActive, 0, &i, &peer);
    if (rc == NVML_SUCCESS)
        *isActive = peer >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type)
{
    unsigned int i;
    int peer;
    nvmlReturn_t rc = enter_link(__func__, device, link, type, 1, &i, &peer);
    if (rc == NVML_SUCCESS)
        *type = 0; /* NVML_NVLINK_DEVICE_TYPE_GPU */
    return leave(rc);
}

static void fill_pci(unsigned int i, nvmlPciInfo_t *pci);

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    unsigned int i;
    int peer;
    nvmlReturn_t rc = enter_link(__func__, device, link, pci, 1, &i, &peer);
    if (rc == NVML_SUCCESS)
        fill_pci((unsigned int)peer, pci);
    return leave(rc);
}

static void fill_pci(unsigned int i, nvmlPciInfo_t *pci)
{
    const struct gpu_config *g = &g_cfg.gpu[i];
    memset(pci, 0, sizeof *pci);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = PCI_DEVICE_ID_H100_SXM;
    pci->pciSubSystemId = PCI_SUBSYSTEM_ID_H100_SXM;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->pci_domain & 0xffff,
             g->pci_bus & 0xff, g->pci_device & 0xff);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", g->pci_domain, g->pci_bus & 0xff,
             g->pci_device & 0xff);
}

static nvmlReturn_t pci_info(const char *symbol, nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(symbol, device, &i);
    if (rc == NVML_SUCCESS && !pci)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    fill_pci(i, pci);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(__func__, device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    /* memory_info=unsupported: a unified-memory GPU (GB10) answers NOT_SUPPORTED for v1 and v2 */
    if (rc == NVML_SUCCESS && g_cfg.memory_unsupported)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        rc = aggregate_allowed(i, mig);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    struct memory_state m;
    gpu_memory(i, mig, &m);
    memory->total = m.total;
    memory->free = m.free;
    memory->used = m.total - m.free;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    if (rc == NVML_SUCCESS && g_cfg.memory_unsupported)
        rc = NVML_ERROR_NOT_SUPPORTED;
    /* memory_info_v2=0: a driver without a working v2 memory call. Driver 510.39.01 answered it with
     * NVML_ERROR_FUNCTION_NOT_FOUND (NVIDIA/nvidia-settings#78); older drivers lack the symbol, for which
     * pynvml raises the same NVMLError_FunctionNotFound. */
    if (rc == NVML_SUCCESS && !g_cfg.memory_info_v2)
        rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && memory->version != NVML_MEMORY_V2_VERSION)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS)
        rc = aggregate_allowed(i, mig);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    struct memory_state m;
    gpu_memory(i, mig, &m);
    memory->total = m.total;
    memory->reserved = m.reserved;
    memory->free = m.free;
    memory->used = m.used;
    return leave(NVML_SUCCESS);
}

/* The count-probe protocol of the *RunningProcesses calls; entry_size is that of the caller's
 * struct (nvmlProcessInfo_v1_t for the unversioned calls, nvmlProcessInfo_t for _v2/_v3). */
static nvmlReturn_t running_processes(const char *symbol, enum context_type type, nvmlDevice_t device,
                                      unsigned int *count, void *infos, size_t entry_size)
{
    static struct process_list list;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(symbol, device, &i, &mig);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        rc = aggregate_allowed(i, mig);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    list.type = type;
    list.mig = mig;
    list.count = 0;
    caller_namespace(&list.caller);
    for_each_context_line(i, add_listed_process, &list);
    if (*count < list.count) {
        *count = list.count;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (list.count > 0 && !infos)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int k = 0; k < list.count; k++) {
        if (entry_size == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *entry = (nvmlProcessInfo_v1_t *)infos + k;
            *entry = (nvmlProcessInfo_v1_t){list.items[k].pid, list.items[k].usedGpuMemory};
        } else if (entry_size == sizeof(nvmlProcessInfo_v3_legacy_t)) {
            ((nvmlProcessInfo_v3_legacy_t *)infos)[k] = (nvmlProcessInfo_v3_legacy_t){
                list.items[k].pid, list.items[k].usedGpuMemory, list.items[k].gpuInstanceId,
                list.items[k].computeInstanceId, 0};
        } else {
            ((nvmlProcessInfo_t *)infos)[k] = list.items[k];
        }
    }
    *count = list.count;
    return leave(NVML_SUCCESS);
}

#define PROCESS_LIST_CALL(name, type, struct_type)                                                    \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, struct_type *infos)        \
    {                                                                                                 \
        return running_processes(#name, type, device, infoCount, infos, sizeof(struct_type));         \
    }

#if defined(FAKENVML_V3_LEGACY)
/* Early R535 (build/v3-32/): 32-byte _v3 entries; nvmlDeviceGetConfComputeMemSizeInfo exists and
 * nvmlDeviceGetRunningProcessDetailList does not, the signature nvitop's libnvml.py probes for. */
PROCESS_LIST_CALL(nvmlDeviceGetComputeRunningProcesses_v3, CONTEXT_COMPUTE, nvmlProcessInfo_v3_legacy_t)
PROCESS_LIST_CALL(nvmlDeviceGetGraphicsRunningProcesses_v3, CONTEXT_GRAPHICS, nvmlProcessInfo_v3_legacy_t)
PROCESS_LIST_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v3, CONTEXT_MPS, nvmlProcessInfo_v3_legacy_t)
#elif !defined(FAKENVML_NO_V3)
PROCESS_LIST_CALL(nvmlDeviceGetComputeRunningProcesses_v3, CONTEXT_COMPUTE, nvmlProcessInfo_t)
PROCESS_LIST_CALL(nvmlDeviceGetGraphicsRunningProcesses_v3, CONTEXT_GRAPHICS, nvmlProcessInfo_t)
PROCESS_LIST_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v3, CONTEXT_MPS, nvmlProcessInfo_t)

/* nvml.h (R550+): every process of one list with its confidential-compute memory, 32-byte entries. */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
    static const enum context_type types[] = {CONTEXT_COMPUTE, CONTEXT_GRAPHICS, CONTEXT_MPS};
    if (!plist || plist->version != NVML_PROCESS_DETAIL_LIST_V1)
        return !plist ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (plist->mode > 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int count = plist->procArray ? plist->numProcArrayEntries : 0;
    nvmlReturn_t rc = running_processes(__func__, types[plist->mode], device, &count, plist->procArray,
                                        sizeof(nvmlProcessInfo_v3_legacy_t));
    plist->numProcArrayEntries = count;
    return rc;
}
#endif

#ifndef FAKENVML_NO_V3
/* Confidential computing is off on these GPUs: the call exists (R535+) and answers NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *info)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS)
        rc = info ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return leave(rc);
}
#endif
PROCESS_LIST_CALL(nvmlDeviceGetComputeRunningProcesses_v2, CONTEXT_COMPUTE, nvmlProcessInfo_t)
PROCESS_LIST_CALL(nvmlDeviceGetGraphicsRunningProcesses_v2, CONTEXT_GRAPHICS, nvmlProcessInfo_t)
PROCESS_LIST_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v2, CONTEXT_MPS, nvmlProcessInfo_t)
PROCESS_LIST_CALL(nvmlDeviceGetComputeRunningProcesses, CONTEXT_COMPUTE, nvmlProcessInfo_v1_t)
PROCESS_LIST_CALL(nvmlDeviceGetGraphicsRunningProcesses, CONTEXT_GRAPHICS, nvmlProcessInfo_v1_t)
PROCESS_LIST_CALL(nvmlDeviceGetMPSComputeRunningProcesses, CONTEXT_MPS, nvmlProcessInfo_v1_t)

/* ---- MIG (nvml.h, "Multi Instance GPU Management") ---------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && (!currentMode || !pendingMode))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *currentMode = g_cfg.gpu[i].mig_current;
        *pendingMode = g_cfg.gpu[i].mig_pending;
    }
    return leave(rc);
}

/* "Returns zero if MIG is not supported or enabled." */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = g_cfg.gpu[i].mig_current == NVML_DEVICE_MIG_ENABLE ? MAX_MIG : 0;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !migDevice)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && g_cfg.gpu[i].mig_current != NVML_DEVICE_MIG_ENABLE)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS && index >= MAX_MIG)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && index >= g_cfg.gpu[i].mig_count)
        rc = NVML_ERROR_NOT_FOUND;
    return leave(rc != NVML_SUCCESS ? rc : mig_handle_for(i, index, migDevice));
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, device, &i, &mig);
    if (rc == NVML_SUCCESS && !isMigDevice)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isMigDevice = mig >= 0;
    return leave(rc);
}

/* GPU or compute instance id of a MIG device handle; a GPU handle: NVML_ERROR_NOT_SUPPORTED. */
static nvmlReturn_t instance_id(const char *symbol, nvmlDevice_t device, unsigned int *id, int compute)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(symbol, device, &i, &mig);
    if (rc == NVML_SUCCESS && !id)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mig < 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *id = compute ? g_cfg.gpu[i].mig[mig].ci : g_cfg.gpu[i].mig[mig].gi;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(__func__, device, id, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(__func__, device, id, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any_device(__func__, migDevice, &i, &mig);
    if (rc == NVML_SUCCESS && !device)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mig < 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return leave(rc != NVML_SUCCESS ? rc : handle_for(i, device));
}

/* ---- what monitoring clients ask (nvitop 1.7.2, gpustat 1.1.1) ------------------------------- */
/* Plausible values of an H100 SXM (nvidia-smi -q of one: no fan, 700 W limit, P0 under load), busy where a context
 * holds memory; each call's documented errors for a bad handle or argument (nvml.h). */

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t layout");

/* MiB held by contexts on GPU i (g_lock held). */
static unsigned long long context_mib(unsigned int i)
{
    struct counted_on sum = {-1, 0};
    for_each_context_line(i, add_counted_mib_on, &sum);
    return sum.mib;
}

/* A uint answer of GPU `device`: busy or idle value. */
static nvmlReturn_t busy_value(const char *symbol, nvmlDevice_t device, unsigned int *out, unsigned int idle,
                               unsigned int busy)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(symbol, device, &i);
    if (rc == NVML_SUCCESS && !out)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = context_mib(i) ? busy : idle;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !utilization)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        int busy = context_mib(i) > 0;
        utilization->gpu = busy ? 87 : 0;
        utilization->memory = busy ? 41 : 0;
    }
    return leave(rc);
}

struct samples {
    unsigned int count;
    unsigned int pids[1024];
};

static void add_sample_pid(const struct context *ctx, const struct context_line *line, void *arg)
{
    struct samples *s = arg;
    (void)line;
    struct caller_ns caller;
    caller_namespace(&caller);
    unsigned long pid = line->listed ? listed_pid(ctx, &caller) : 0;
    if (pid && s->count < 1024)
        s->pids[s->count++] = (unsigned int)pid;
}

/* nvml.h: utilization NULL (or too small) gives the count and NVML_ERROR_INSUFFICIENT_SIZE; no sample since
 * lastSeenTimeStamp gives NVML_ERROR_NOT_FOUND. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    static struct samples found;
    unsigned int i;
    (void)lastSeenTimeStamp;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && !processSamplesCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    found.count = 0;
    for_each_context_line(i, add_sample_pid, &found);
    if (found.count == 0)
        return leave(NVML_ERROR_NOT_FOUND);
    if (!utilization || *processSamplesCount < found.count) {
        *processSamplesCount = found.count;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (unsigned int k = 0; k < found.count; k++)
        utilization[k] = (nvmlProcessUtilizationSample_t){
            found.pids[k], (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000, 85, 40, 0, 0};
    *processSamplesCount = found.count;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    if (sensorType != 0) { /* NVML_TEMPERATURE_GPU is the only sensor */
        nvmlReturn_t rc = enter(__func__, NEEDS_INIT);
        return leave(rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT);
    }
    return busy_value(__func__, device, temp, 31, 58);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return busy_value(__func__, device, power, 71000, 540000); /* milliwatts */
}

static nvmlReturn_t power_limit(const char *symbol, nvmlDevice_t device, unsigned int *limit)
{
    return busy_value(symbol, device, limit, 700000, 700000);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(__func__, device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(__func__, device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    return busy_value(__func__, device, pState, 0, 0); /* NVML_PSTATE_0: an H100 stays in P0 */
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    return busy_value(__func__, device, mode, 0, 0); /* NVML_COMPUTEMODE_DEFAULT */
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, unsigned int *isActive)
{
    return busy_value(__func__, device, isActive, 0, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, unsigned int *display)
{
    return busy_value(__func__, device, display, 0, 0);
}

/* An SXM GPU has no fan of its own: NVML_ERROR_NOT_SUPPORTED (nvidia-smi prints N/A). */
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS)
        rc = speed ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return leave(rc);
}

static nvmlReturn_t codec_utilization(const char *symbol, nvmlDevice_t device, unsigned int *utilization,
                                      unsigned int *samplingPeriodUs)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(symbol, device, &i);
    if (rc == NVML_SUCCESS && (!utilization || !samplingPeriodUs))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *utilization = 0;
        *samplingPeriodUs = 167000;
    }
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    return codec_utilization(__func__, device, utilization, samplingPeriodUs);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    return codec_utilization(__func__, device, utilization, samplingPeriodUs);
}

/* clockType: 0 graphics, 1 SM, 2 memory, 3 video (MHz, an H100 SXM's base/boost and HBM3 clocks). */
static nvmlReturn_t clock_info(const char *symbol, nvmlDevice_t device, unsigned int type, unsigned int *clock, int max)
{
    static const unsigned int idle[] = {345, 345, 2619, 765}, top[] = {1980, 1980, 2619, 1755};
    unsigned int i;
    nvmlReturn_t rc = enter_device(symbol, device, &i);
    if (rc == NVML_SUCCESS && (!clock || type > 3))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *clock = max || context_mib(i) ? top[type] : idle[type];
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_info(__func__, device, type, clock, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_info(__func__, device, type, clock, 1);
}

/* ECC is on, with no error counted (nvidia-smi -q of a healthy H100). */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
                                                unsigned long long *eccCounts)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && (!eccCounts || errorType > 1 || counterType > 1))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *eccCounts = 0;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS && (!current || !pending))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *current = *pending = NVML_FEATURE_ENABLED;
    return leave(rc);
}

/* The driver model is a Windows notion (WDDM/TCC): Linux drivers answer NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, &i);
    if (rc == NVML_SUCCESS)
        rc = current && pending ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    return nvmlDeviceGetDriverModel(device, current, pending);
}
