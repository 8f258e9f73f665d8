/* The system-call layer hermes-spawn (spawn_helper.c) and its exec-server mode (exec_server.c) share:
   raw system calls returning -errno, freestanding where the build is (no libc start-up), and the
   few string helpers both use. */
#ifndef HERMES_SPAWN_SYS_H
#define HERMES_SPAWN_SYS_H
#include <sys/syscall.h>

#ifdef HERMES_FREESTANDING
#if defined(__x86_64__)
static inline long sys5(long n, long a, long b, long c, long d, long e) {
    long ret;
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
static inline long sys5(long n, long a, long b, long c, long d, long e) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c,
                  x3 __asm__("x3") = d, x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#else
#error "HERMES_FREESTANDING: x86-64 and arm64 only; build without it"
#endif
#else
#include <errno.h>
#include <unistd.h>
/* libc's syscall() returns -1 and sets errno; the raw form returns -errno */
static inline long sys5(long n, long a, long b, long c, long d, long e) {
    long ret = syscall(n, a, b, c, d, e);
    return ret == -1 ? -errno : ret;
}
#endif
/* Every argument given (unused ones 0): prctl refuses non-zero leftovers. */
static inline long sys(long n, long a, long b, long c, long d) { return sys5(n, a, b, c, d, 0); }

/* The kernel's struct timespec on 64-bit targets (no libc header in the freestanding build). */
struct hermes_timespec {
    long tv_sec, tv_nsec;
};

static inline unsigned long len(const char *s) {
    unsigned long n = 0;
    while (s[n]) n++;
    return n;
}

static inline int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static inline void say(const char *s) { sys(SYS_write, 2, (long)s, (long)len(s), 0); }

static inline void die(const char *what, long err) {
    char num[24];
    int i = sizeof num - 1;
    num[i] = 0;
    unsigned long e = (unsigned long)(err < 0 ? -err : err);
    do num[--i] = (char)('0' + e % 10), e /= 10;
    while (e && i > 0);
    say("sandbox: cannot start the command: ");
    say(what);
    say(" (errno ");
    say(num + i);
    say(")\n");
    sys(SYS_exit_group, 127, 0, 0, 0);
    for (;;) {
    }
}


/* hermes-spawn's own work (spawn_helper.c): limits, uid, no capabilities, the filter, then exec. */
int hermes_spawn_run(int argc, char **argv, char **envp);
/* The slot's exec server (exec_server.c): `hermes-spawn --serve ...`. */
int hermes_serve(int argc, char **argv, char **envp);
/* A task container's pid 1 (task_init.c): `hermes-spawn --init`. */
int hermes_task_init(void);

#endif
