/* A wall clock for one process, for tests: LD_PRELOAD this library and set
 * CLOCK_SHIM_FILE to a file of 16 bytes: two native-endian int64s, a time in
 * microseconds and a mode. Mode 0: the time is an offset added to the real clock. Mode 1:
 * the clock is frozen at that Unix time. The file is mapped shared, so a test changes the
 * process's wall clock at run time by rewriting those bytes. Only CLOCK_REALTIME (and its coarse variant),
 * gettimeofday and time are shifted; monotonic clocks are left alone. The real time is
 * read with the raw system call, so nothing here can recurse into an allocator.
 *
 * It also hides /proc/cpuinfo from the process (an empty file instead), so that a server
 * whose monotonic clock would be the CPU's TSC falls back to clock_gettime: Valkey 9's
 * ustime() reads the wall clock at most once a millisecond and adds the TSC's ticks in
 * between, so under the TSC a frozen clock would move and a step would land up to a
 * millisecond late (the server logs "monotonic clock: POSIX clock_gettime" instead of
 * "X86 TSC"). Redis and Valkey read /proc/cpuinfo only for that choice.
 * Built by tests/support/mod.rs with `cc -shared -fPIC`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t *volatile shared_clock;
static volatile int mapped;

/* The mapped {time, mode} pair, or NULL when there is none. */
static int64_t *clock_words(void) {
    if (!__atomic_load_n(&mapped, __ATOMIC_ACQUIRE)) {
        const char *path = getenv("CLOCK_SHIM_FILE");
        int64_t *p = NULL;
        if (path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *m = mmap(NULL, 2 * sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (m != MAP_FAILED) p = m;
            }
        }
        __atomic_store_n(&shared_clock, p, __ATOMIC_RELEASE);
        __atomic_store_n(&mapped, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&shared_clock, __ATOMIC_ACQUIRE);
}

static int real_clock_gettime(clockid_t clock, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static void shift(struct timespec *ts) {
    int64_t *words = clock_words();
    if (!words) return;
    int64_t us = __atomic_load_n(&words[0], __ATOMIC_ACQUIRE);
    int64_t ns;
    if (__atomic_load_n(&words[1], __ATOMIC_ACQUIRE) == 1) {
        ns = us * 1000LL;
    } else {
        ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + us * 1000LL;
    }
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = real_clock_gettime(clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = real_clock_gettime(CLOCK_REALTIME, &ts);
    if (r != 0) return r;
    shift(&ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    shift(&ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}

/* /proc/cpuinfo reads as empty (see the top): no `constant_tsc` flag, so no TSC clock. */
static const char *hide_cpuinfo(const char *path) {
    return path && strcmp(path, "/proc/cpuinfo") == 0 ? "/dev/null" : path;
}

typedef FILE *(*fopen_fn)(const char *, const char *);

FILE *fopen(const char *path, const char *mode) {
    fopen_fn real = (fopen_fn)dlsym(RTLD_NEXT, "fopen");
    return real(hide_cpuinfo(path), mode);
}

FILE *fopen64(const char *path, const char *mode) {
    fopen_fn real = (fopen_fn)dlsym(RTLD_NEXT, "fopen64");
    return real(hide_cpuinfo(path), mode);
}
