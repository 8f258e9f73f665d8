/* hermes-confine.so: every program a shell execs starts in a fresh Landlock domain.

   The terminal verifier starts test.sh's guarded shell with LD_PRELOAD naming this library (and
   the shell unsets the variable first thing, so nothing it runs inherits it). bash execs every
   external command through libc's execve in the child it forked; this execve runs first. It puts
   the child in a new Landlock domain, then makes the execve system call. A process in a Landlock
   domain can only ptrace (and so open /proc/PID/mem, process_vm_writev, pidfd_getfd...) processes
   in its own domain or one nested under it, and from ABI 6 on only signal those: the tested programs
   cannot reach the shell that runs test.sh and its guard, which stays outside every domain (and can
   still kill them). From ABI 6 the domain restricts nothing else; on ABI 2-5 it also refuses mount(2)
   and making block devices (see confine()); on ABI 1 nothing is confined.

   The child is confined before the exec is tried, so a script bash runs in that child itself (no
   #!, execve fails with ENOEXEC) is confined too. Where Landlock is missing (old kernels, gVisor)
   or refused, the exec goes ahead unconfined: the verifier checks for that itself (see verify.py).

   Built by environments/terminal_tasks/build_exec_confine.sh (scripts/setup.sh runs it): -nostdlib -shared, system calls only and one
   libc symbol (__errno_location, in glibc and musl alike, unversioned), so it loads into the
   bash of any image on the same architecture (x86-64, arm64). */
#include <linux/landlock.h>
#include <linux/prctl.h>
#include <sys/syscall.h>

#ifndef LANDLOCK_SCOPE_SIGNAL
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif

/* The attribute as of ABI 6 (older kernels take it too: they accept a larger struct whose fields
   they do not know if those are zero). */
struct ruleset_attr {
    unsigned long long handled_access_fs, handled_access_net, scoped;
};

#if defined(__x86_64__)
static long sys3(long n, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
static long sys3(long n, long a, long b, long c) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
    return x0;
}
#else
#error "hermes-confine: x86-64 and arm64 only"
#endif

static long sys5(long n, long a, long b, long c, long d, long e) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c,
                  x3 __asm__("x3") = d, x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
#endif
}

extern int *__errno_location(void);

#ifndef HERMES_CONFINE_ABI /* a test build may pretend the kernel has an older ABI */
#define HERMES_CONFINE_ABI(found) (found)
#endif

static void confine(void) {
    long abi = HERMES_CONFINE_ABI(sys3(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION));
    /* ABI 1 denies every rename or link across directories in a domain, whatever it handles: not used. */
    if (abi < 2) return;
    /* ABI 6 on: a domain that handles no file access, only scoping signals. Before: one that must handle some
       file access (any domain scopes ptrace); "make a block device", with no rule, and "reparent" (renames
       and links across directories, denied in every domain unless a rule grants it), granted on all of /.
       Such a domain also refuses mount(2) and its kin. */
    struct ruleset_attr attr = {0, 0, LANDLOCK_SCOPE_SIGNAL};
    if (abi < 6) attr = (struct ruleset_attr){LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_REFER, 0, 0};
    long fd = sys3(__NR_landlock_create_ruleset, (long)&attr, abi < 6 ? 8 : sizeof attr, 0);
    if (fd < 0) return;
    if (abi < 6) {
        struct landlock_path_beneath_attr everywhere = {LANDLOCK_ACCESS_FS_REFER, -1};
        long root = sys3(__NR_openat, -100 /* AT_FDCWD */, (long)"/", 010000000 | 02000000 /* O_PATH|O_CLOEXEC */);
        everywhere.parent_fd = (int)root;
        long added = root < 0 ? -1 : sys5(__NR_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&everywhere, 0, 0);
        if (root >= 0) sys3(__NR_close, root, 0, 0);
        if (added < 0) { /* without it renames across directories would fail: this program runs unconfined */
            sys3(__NR_close, fd, 0, 0);
            return;
        }
    }
    /* Needed unless the process has CAP_SYS_ADMIN; bubblewrap and hermes-spawn have set it already. */
    sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    sys3(__NR_landlock_restrict_self, fd, 0, 0);
    sys3(__NR_close, fd, 0, 0);
}

__attribute__((visibility("default"))) int execve(const char *path, char *const argv[], char *const envp[]) {
    confine();
    long ret = sys3(__NR_execve, (long)path, (long)argv, (long)envp);
    *__errno_location() = (int)-ret;
    return -1;
}
