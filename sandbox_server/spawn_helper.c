/* hermes-spawn: become a slot's user with its limits, then exec the command under the slot's syscall filter.

   hermes-spawn UID RESOURCE:SOFT:HARD... -- COMMAND [ARG...]
   hermes-spawn --filter -- COMMAND [ARG...]   (the filter only: a command whose uid someone else set)
   hermes-spawn --init                          (a task container's pid 1: task_init.c)

   A slot's exec server (exec_server.py) posix_spawns this as root with only CAP_SETUID,
   CAP_SETGID and CAP_SETPCAP. It sets the rlimits, empties the bounding set, drops every
   supplementary group, switches real/effective/saved uid and gid to UID (which clears the
   permitted, effective and ambient capabilities), clears the inheritable ones, sets
   no_new_privs, checks the uid, closes every descriptor above 3, installs the syscall filter
   (syscall_filter.h) and execs COMMAND (PATH search). The same as `prlimit ... setpriv ...` (the fallback when this is not built) in one
   exec instead of three. Any failure exits 127 before the command runs.

   Built by scripts/setup.sh and the Dockerfile, freestanding where it can be (x86-64, arm64):
     cc -O2 -static -nostdlib -ffreestanding -fno-stack-protector -DHERMES_FREESTANDING ...
   which skips libc's start-up (on a VM its CPU probing alone costs ~0.3 ms per command);
   otherwise against libc: cc -O2 -static ... Only system calls either way. */
#include <linux/capability.h>
#include <linux/prctl.h>
#include <linux/resource.h>
#include <sys/syscall.h>

#include "spawn_sys.h"
#include "syscall_filter.h"

#define ENOENT 2
#define EINTR 4
#define EACCES 13
#define EINVAL 22
#define ENOTDIR 20

#ifdef HERMES_FREESTANDING
#if defined(__x86_64__)
__asm__(".text\n.globl _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call start_c\n hlt\n");
#elif defined(__aarch64__)
__asm__(".text\n.globl _start\n_start:\n mov x0, sp\n bl start_c\n");
#else
#error "HERMES_FREESTANDING: x86-64 and arm64 only; build without it"
#endif
/* gcc may emit calls to these for struct copies and zeroing */
void *memset(void *dst, int c, unsigned long n) {
    unsigned char *p = dst;
    while (n--) *p++ = (unsigned char)c;
    return dst;
}
void *memcpy(void *dst, const void *src, unsigned long n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--) *d++ = *s++;
    return dst;
}
#endif

/* A decimal number ending at `end` (a ':' or the string's end); -1 if there is none. */
static long number(const char **text) {
    const char *p = *text;
    unsigned long v = 0;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (~0UL >> 4)) return -1;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    *text = p;
    return (long)v;
}

static void filter(void) {
    struct sock_filter insns[HERMES_FILTER_MAX];
    struct sock_fprog prog = {hermes_filter(insns), insns};
    long rc = sys(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0);
    if (rc < 0) die("no_new_privs", rc);
    if ((rc = sys(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0)) < 0) die("the syscall filter", rc);
}

static int exec_command(char **cmd, char **envp);

int hermes_spawn_run(int argc, char **argv, char **envp) {
    if (argc >= 2 && same(argv[1], "--serve")) return hermes_serve(argc - 2, argv + 2, envp);
    if (argc == 2 && same(argv[1], "--init")) return hermes_task_init();
    if (argc >= 3 && same(argv[1], "--filter") && same(argv[2], "--")) {
        if (argc < 4) die("no command after --", EINVAL);
        filter();
        return exec_command(argv + 3, envp);
    }
    if (argc < 4) die("usage: hermes-spawn UID RESOURCE:SOFT:HARD... -- COMMAND", EINVAL);
    const char *p = argv[1];
    long uid = number(&p);
    if (uid <= 0 || *p) die("the uid must be a number above 0", EINVAL);
    int i = 2;
    for (; i < argc && !same(argv[i], "--"); i++) {
        p = argv[i];
        long which = number(&p), soft = -1, hard = -1;
        if (*p == ':') p++, soft = number(&p);
        if (*p == ':') p++, hard = number(&p);
        if (which < 0 || soft < 0 || hard < 0 || *p) die(argv[i], EINVAL);
        struct rlimit64 lim = {(unsigned long long)soft, (unsigned long long)hard};
        long rc = sys(SYS_prlimit64, 0, which, (long)&lim, 0);
        if (rc < 0) die(argv[i], rc);
    }
    if (i + 1 >= argc) die("no command after --", EINVAL);
    for (long cap = 0; cap <= 63; cap++) {
        long rc = sys(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0);
        if (rc == -EINVAL) break; /* past the kernel's last capability (they are numbered without gaps) */
        if (rc < 0) die("drop the bounding set", rc);
    }
    long rc;
    if ((rc = sys(SYS_setgroups, 0, 0, 0, 0)) < 0) die("setgroups", rc);
    if ((rc = sys(SYS_setresgid, uid, uid, uid, 0)) < 0) die("setresgid", rc);
    if ((rc = sys(SYS_setresuid, uid, uid, uid, 0)) < 0) die("setresuid", rc);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2] = {{0, 0, 0}, {0, 0, 0}};
    if ((rc = sys(SYS_capset, (long)&header, (long)none, 0, 0)) < 0) die("clear capabilities", rc);
    if ((rc = sys(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0)) < 0) die("no_new_privs", rc);
    unsigned int r = 0, e = 0, s = 0;
    if (sys(SYS_getresuid, (long)&r, (long)&e, (long)&s, 0) < 0 || r != (unsigned long)uid || e != (unsigned long)uid || s != (unsigned long)uid)
        die("the uid did not change", EINVAL);
    /* 0-2 are the command's pipes, 3 its script if it has one; nothing of the server's passes. */
    if (sys(SYS_close_range, 4, ~0U, 0, 0) < 0) {
        for (long fd = 4; fd < 65536; fd++) sys(SYS_close, fd, 0, 0, 0);
    }
    filter();
    return exec_command(argv + i + 1, envp);
}

static int exec_command(char **cmd, char **envp) {
    long rc;
    if (*cmd[0] == 0) die("empty command", EINVAL);
    for (const char *c = cmd[0]; *c; c++) {
        if (*c == '/') {
            rc = sys(SYS_execve, (long)cmd[0], (long)cmd, (long)envp, 0);
            die(cmd[0], rc);
        }
    }
    const char *path = "/usr/bin:/bin";
    for (char **env = envp; *env; env++) {
        const char *v = *env;
        if (v[0] == 'P' && v[1] == 'A' && v[2] == 'T' && v[3] == 'H' && v[4] == '=') path = v + 5;
    }
    char buf[4096];
    unsigned long name = len(cmd[0]);
    long last = -ENOENT;
    while (1) {
        unsigned long n = 0;
        while (path[n] && path[n] != ':') n++;
        if (n + 1 + name + 1 <= sizeof buf) {
            unsigned long k = 0;
            for (unsigned long j = 0; j < n; j++) buf[k++] = path[j];
            if (n == 0) buf[k++] = '.';
            buf[k++] = '/';
            for (unsigned long j = 0; j <= name; j++) buf[k++] = cmd[0][j];
            rc = sys(SYS_execve, (long)buf, (long)cmd, (long)envp, 0);
            if (rc != -ENOENT && rc != -ENOTDIR && rc != -EACCES) die(cmd[0], rc);
            if (rc == -EACCES || last != -EACCES) last = rc;
        }
        if (!path[n]) break;
        path += n + 1;
    }
    die(cmd[0], last);
    return 127;
}

#ifdef HERMES_FREESTANDING
__attribute__((used, noreturn)) void start_c(long *sp) {
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    sys(SYS_exit_group, hermes_spawn_run(argc, argv, argv + argc + 1), 0, 0, 0);
    for (;;) {
    }
}
#else
int main(int argc, char **argv, char **envp) { return hermes_spawn_run(argc, argv, envp); }
#endif
