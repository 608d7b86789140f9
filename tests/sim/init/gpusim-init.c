/*
 * gpusim-init: PID 1 of a simulated GPU node (see tests/sim/README.md).
 *
 * Started by `gpunode up` as the child of
 *   unshare --pid --mount --fork --kill-child [--user --map-root-user] -- gpusim-init ...
 * so it runs as PID 1 of a fresh PID namespace, in a private mount namespace, while /proc is
 * still the caller's. It then
 *   1. reads its own PID in the caller's PID namespace (first NSpid entry of /proc/self/status),
 *   2. builds the node's file system view with mount(2) (never touching /run/mount/utab):
 *      /proc of the node, a private /run, a private /dev (null, zero, full, random, urandom, tty
 *      bound from the host, devpts + ptmx, shm, fd links, nvidia<MINOR>, nvidiactl, nvidia-uvm,
 *      nvidia-uvm-tools as empty regular files, mode 0666; nvidia-caps/nvidia-cap1 0400 and
 *      nvidia-cap2 0444; kmsg, an empty regular file, 0644), /run/gpusim (bind of STATE/run) with
 *      the node's proc on /run/gpusim/proc, STATE/lib/ld.so.cache bound over /etc/ld.so.cache
 *      and STATE/proc-driver bound over /proc/driver (the simulated /proc/driver/nvidia),
 *   3. writes "ready <host pid>\n" to the ready pipe and closes it,
 *   4. reaps every child (orphans reparent to it), unless --no-reap; on SIGTERM it sends SIGTERM
 *      to every process of the node, waits up to 2 s for them to exit, SIGKILLs the rest and exits.
 *
 * usage: gpusim-init --state-dir DIR --ready-fd FD --minors M0,M1,... [--no-reap]
 * Errors go to stderr (the node's log) and exit status 1 before the ready line is written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STAGING_DEV "/run/.gpusim-dev"
#define SHUTDOWN_GRACE_NS 2000000000LL

static void die(const char *fmt, ...)
{
    va_list ap;
    int saved_errno = errno;

    fputs("gpusim-init: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s\n", strerror(saved_errno));
    exit(1);
}

static void do_mount(const char *source, const char *target, const char *fstype,
                     unsigned long flags, const char *data)
{
    if (mount(source, target, fstype, flags, data) != 0)
        die("mount %s on %s", source, target);
}

static void make_dir(const char *path, mode_t mode)
{
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        die("mkdir %s", path);
    if (chmod(path, mode) != 0)
        die("chmod %s", path);
}

/* An empty regular file with exactly MODE (umask does not apply). */
static void make_file(const char *path, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, mode);

    if (fd < 0)
        die("create %s", path);
    if (fchmod(fd, mode) != 0)
        die("chmod %s", path);
    close(fd);
}

static void make_link(const char *target, const char *path)
{
    if (symlink(target, path) != 0)
        die("symlink %s", path);
}

static void join(char *out, const char *dir, const char *name)
{
    if (snprintf(out, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX) {
        errno = ENAMETOOLONG;
        die("path %s/%s", dir, name);
    }
}

/* PID of this process in the PID namespace of the mounted /proc (the caller's). */
static long host_pid(void)
{
    char line[256];
    long pid = -1;
    FILE *status = fopen("/proc/self/status", "re");

    if (!status)
        die("open /proc/self/status");
    while (fgets(line, sizeof(line), status))
        if (strncmp(line, "NSpid:", 6) == 0) {
            pid = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(status);
    if (pid <= 0) {
        errno = ENOENT;
        die("no NSpid in /proc/self/status");
    }
    return pid;
}

/* Private /dev, populated in a staging tmpfs (host /dev still visible), then moved onto /dev. */
static void build_dev(const char *minors)
{
    static const char *const host_devices[] = {"null", "zero", "full", "random", "urandom", "tty"};
    char path[PATH_MAX], host[PATH_MAX];
    char *list, *minor, *save;
    size_t i;

    make_dir(STAGING_DEV, 0755);
    do_mount("tmpfs", STAGING_DEV, "tmpfs", MS_NOSUID, "mode=0755");
    for (i = 0; i < sizeof(host_devices) / sizeof(host_devices[0]); i++) {
        join(path, STAGING_DEV, host_devices[i]);
        join(host, "/dev", host_devices[i]);
        make_file(path, 0666);
        do_mount(host, path, NULL, MS_BIND, NULL);
    }
    make_dir(STAGING_DEV "/pts", 0755);
    if (mount("devpts", STAGING_DEV "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,gid=5") != 0)
        /* In a user namespace group 5 is not mapped. */
        do_mount("devpts", STAGING_DEV "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                 "newinstance,ptmxmode=0666,mode=0620");
    make_link("pts/ptmx", STAGING_DEV "/ptmx");
    make_dir(STAGING_DEV "/shm", 01777);
    do_mount("tmpfs", STAGING_DEV "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    make_link("/proc/self/fd", STAGING_DEV "/fd");
    make_link("/proc/self/fd/0", STAGING_DEV "/stdin");
    make_link("/proc/self/fd/1", STAGING_DEV "/stdout");
    make_link("/proc/self/fd/2", STAGING_DEV "/stderr");

    list = strdup(minors);
    if (!list)
        die("strdup");
    for (minor = strtok_r(list, ",", &save); minor; minor = strtok_r(NULL, ",", &save)) {
        if (snprintf(path, sizeof(path), STAGING_DEV "/nvidia%s", minor) >= (int)sizeof(path))
            die("minor %s", minor);
        make_file(path, 0666);
    }
    free(list);
    make_file(STAGING_DEV "/nvidiactl", 0666);
    make_file(STAGING_DEV "/nvidia-uvm", 0666);
    make_file(STAGING_DEV "/nvidia-uvm-tools", 0666);
    /* The MIG capabilities every 580 host has, MIG or not: config (root's alone) and monitor
     * (everyone's), modes as src/nvidia/arch/nvalloc/unix/src/os.c osRmCapRegisterSys gives them. */
    make_dir(STAGING_DEV "/nvidia-caps", 0755);
    make_file(STAGING_DEV "/nvidia-caps/nvidia-cap1", 0400);
    make_file(STAGING_DEV "/nvidia-caps/nvidia-cap2", 0444);
    /* The node's kernel log: an empty regular file in /dev/kmsg's place, mode 0644 as the real
     * character device; tests append records in its format (tests/sim/README.md, "Recovery"). */
    make_file(STAGING_DEV "/kmsg", 0644);

    do_mount(STAGING_DEV, "/dev", NULL, MS_MOVE, NULL);
    if (rmdir(STAGING_DEV) != 0)
        die("rmdir %s", STAGING_DEV);
}

/* The kernel module's /proc/driver/nvidia (gpus/<bus>/information, version), written by gpunode
 * into STATE/proc-driver/nvidia: STATE/proc-driver is bound over the node's /proc/driver (this mount
 * namespace only; the host's /proc is untouched). Skipped when either directory is missing, and
 * (with a warning in the node's log) when the kernel refuses the mount. */
static void bind_proc_driver(const char *state_dir)
{
    char path[PATH_MAX];
    struct stat st;

    join(path, state_dir, "proc-driver");
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || stat("/proc/driver", &st) != 0)
        return;
    if (mount(path, "/proc/driver", NULL, MS_BIND, NULL) != 0)
        fprintf(stderr, "gpusim-init: warning: no simulated /proc/driver/nvidia: mount %s on /proc/driver: %s\n",
                path, strerror(errno));
}

static void build_node(const char *state_dir, const char *minors)
{
    char path[PATH_MAX];

    do_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    do_mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
    build_dev(minors);

    make_dir("/run/gpusim", 0755);
    join(path, state_dir, "run");
    do_mount(path, "/run/gpusim", NULL, MS_BIND, NULL);
    do_mount("proc", "/run/gpusim/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    join(path, state_dir, "lib/ld.so.cache");
    do_mount(path, "/etc/ld.so.cache", NULL, MS_BIND, NULL);
    bind_proc_driver(state_dir);
}

static long long now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Reap every exited child; returns 1 while children remain, 0 when there are none. */
static int reap_children(void)
{
    for (;;) {
        pid_t pid = waitpid(-1, NULL, WNOHANG);

        if (pid > 0)
            continue;
        if (pid == 0)
            return 1;
        if (errno == EINTR)
            continue;
        return 0; /* ECHILD */
    }
}

static void shut_down(void)
{
    long long deadline = now_ns() + SHUTDOWN_GRACE_NS;
    struct timespec tick = {0, 5000000};

    kill(-1, SIGTERM);
    while (reap_children() && now_ns() < deadline)
        nanosleep(&tick, NULL);
    kill(-1, SIGKILL);
    exit(0);
}

static void ignore_signal(int sig)
{
    (void)sig;
}

int main(int argc, char **argv)
{
    const char *state_dir = NULL, *minors = NULL;
    int ready_fd = -1, reap = 1, i;
    struct sigaction action;
    sigset_t wanted;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--state-dir") == 0 && i + 1 < argc)
            state_dir = argv[++i];
        else if (strcmp(argv[i], "--ready-fd") == 0 && i + 1 < argc)
            ready_fd = atoi(argv[++i]);
        else if (strcmp(argv[i], "--minors") == 0 && i + 1 < argc)
            minors = argv[++i];
        else if (strcmp(argv[i], "--no-reap") == 0)
            reap = 0;
        else {
            fprintf(stderr, "gpusim-init: unknown argument %s\n", argv[i]);
            return 1;
        }
    }
    if (!state_dir || !minors || ready_fd < 0) {
        fprintf(stderr, "usage: gpusim-init --state-dir DIR --ready-fd FD --minors M0,M1,... "
                        "[--no-reap]\n");
        return 1;
    }

    /* PID 1 of a namespace only gets signals it handles: install handlers, then take the
     * signals synchronously. SIGCHLD must not be ignored, or --no-reap would not keep zombies. */
    memset(&action, 0, sizeof(action));
    action.sa_handler = ignore_signal;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGCHLD, &action, NULL);
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGTERM);
    sigaddset(&wanted, SIGCHLD);
    sigprocmask(SIG_BLOCK, &wanted, NULL);

    umask(022);
    {
        long pid = host_pid();

        build_node(state_dir, minors);
        if (chdir("/") != 0)
            die("chdir /");
        if (dprintf(ready_fd, "ready %ld\n", pid) < 0)
            die("write ready line");
        close(ready_fd);
    }

    for (;;) {
        int sig = sigwaitinfo(&wanted, NULL);

        if (sig == SIGTERM)
            shut_down();
        else if (sig == SIGCHLD && reap)
            reap_children();
    }
}
