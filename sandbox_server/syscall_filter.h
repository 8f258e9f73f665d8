/* The syscall filter of every slot command (seccomp, classic BPF), installed by hermes-spawn (spawn_helper.c)
   just before it execs the command's first program: every process of the command inherits it, none can drop it.

   A denylist, at least as strict as Docker's default profile for a process with no capabilities (what slot
   code is), and then some (docs/security.md lists it):
   - another architecture's system calls (i386 or arm32 entry, and x32 numbers on x86-64): the process is killed;
   - kernel keyrings (add_key, keyctl, request_key): a key outlives the command, the slot and the container;
   - bpf, perf_event_open, userfaultfd, io_uring, the mount API, pivot_root, setns, new namespaces of any kind
     (clone and unshare with a CLONE_NEW* flag), kexec, modules, open_by_handle_at/name_to_handle_at,
     iopl/ioperm, swap, reboot, the clock, acct, quotactl, syslog, vhangup, NUMA policy, personality other than
     Docker's defaults, the host and domain name, and the obsolete calls (uselib, ustat, sysfs, _sysctl...);
   - clone3 gets ENOSYS: its flags sit in memory a filter cannot read, and libc then falls back to clone,
     whose flags it can.
   Everything else is allowed: ptrace of the command's own children among it (exec_confine.c's Landlock domains
   keep a traced process from reaching its ancestors). Refused calls fail with EPERM. */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define HERMES_AUDIT_ARCH AUDIT_ARCH_X86_64
#define HERMES_X32_BIT 0x40000000u
#elif defined(__aarch64__)
#define HERMES_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "the slot syscall filter knows x86-64 and arm64 only"
#endif

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
/* CLONE_NEWTIME shares its bit with clone()'s exit signal: checked for unshare only. */
#define HERMES_CLONE_NS (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

static const unsigned int hermes_denied[] = {
    __NR_add_key, __NR_keyctl, __NR_request_key, __NR_bpf, __NR_perf_event_open, __NR_userfaultfd,
    __NR_mount, __NR_umount2, __NR_pivot_root, __NR_setns,
#ifdef __NR_move_mount
    __NR_open_tree, __NR_move_mount, __NR_fsopen, __NR_fsconfig, __NR_fsmount, __NR_fspick,
#endif
#ifdef __NR_mount_setattr
    __NR_mount_setattr,
#endif
#ifdef __NR_io_uring_setup
    __NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register,
#endif
    __NR_kexec_load, __NR_init_module, __NR_finit_module, __NR_delete_module,
#ifdef __NR_kexec_file_load
    __NR_kexec_file_load,
#endif
    __NR_open_by_handle_at, __NR_name_to_handle_at, __NR_swapon, __NR_swapoff, __NR_reboot,
    __NR_settimeofday, __NR_clock_settime, __NR_clock_adjtime, __NR_acct, __NR_quotactl, __NR_lookup_dcookie,
#ifdef __NR_quotactl_fd
    __NR_quotactl_fd,
#endif
    __NR_syslog, __NR_vhangup, __NR_fanotify_init, __NR_sethostname, __NR_setdomainname,
    __NR_mbind, __NR_migrate_pages, __NR_move_pages, __NR_set_mempolicy, __NR_get_mempolicy,
#if defined(__x86_64__)
    __NR_iopl, __NR_ioperm, __NR_modify_ldt, __NR_uselib, __NR_ustat, __NR_sysfs, __NR__sysctl,
    __NR_create_module, __NR_get_kernel_syms, __NR_query_module, __NR_nfsservctl, __NR_afs_syscall,
    __NR_tuxcall, __NR_security, __NR_vserver, __NR_getpmsg, __NR_putpmsg,
#endif
};

#define HERMES_LOAD(off) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define HERMES_RET(action) BPF_STMT(BPF_RET | BPF_K, (action))
#define HERMES_EPERM (SECCOMP_RET_ERRNO | 1)
#define HERMES_ENOSYS (SECCOMP_RET_ERRNO | 38)
/* Offsets in struct seccomp_data: the number, the architecture, the low word of the first argument
   (little-endian: x86-64 and arm64 as built here). */
#define HERMES_NR 0
#define HERMES_ARCH 4
#define HERMES_ARG0 16

#define HERMES_DENIED_COUNT (sizeof hermes_denied / sizeof hermes_denied[0])
/* The numbers with a rule (the denied ones, clone3, clone, unshare, personality), at most this many. */
#define HERMES_RULES_MAX 100
_Static_assert(HERMES_DENIED_COUNT + 4 <= HERMES_RULES_MAX, "HERMES_RULES_MAX too small");
/* The instructions, into `out` (room for HERMES_FILTER_MAX); returns how many. */
#define HERMES_FILTER_MAX 512
/* per number its comparison and (mostly) a 1-instruction rule, a search node or a leaf's end; 13 more
   for the argument checks, 6 for the architecture; a half of the search stays far under 256 (jumps) */
_Static_assert(HERMES_RULES_MAX * 3 + 32 <= HERMES_FILTER_MAX, "HERMES_FILTER_MAX too small");

#define HERMES_EMIT(insn) (out[n++] = (struct sock_filter)insn)

/* The rule of one number with a rule (the number is in A; the argument is loaded where needed). */
static unsigned short hermes_rule(struct sock_filter *out, unsigned short n, unsigned int nr) {
    if (nr == __NR_clone3) {
        HERMES_EMIT(HERMES_RET(HERMES_ENOSYS));
    } else if (nr == __NR_clone || nr == __NR_unshare) {
        /* refused with any namespace flag */
        HERMES_EMIT(HERMES_LOAD(HERMES_ARG0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, nr == __NR_clone ? HERMES_CLONE_NS : HERMES_CLONE_NS | CLONE_NEWTIME, 0, 1));
        HERMES_EMIT(HERMES_RET(HERMES_EPERM));
        HERMES_EMIT(HERMES_RET(SECCOMP_RET_ALLOW));
    } else if (nr == __NR_personality) {
        /* only Docker's values (PER_LINUX, UNAME26, PER_LINUX32 and with UNAME26, the query) */
        HERMES_EMIT(HERMES_LOAD(HERMES_ARG0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0, 5, 0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8, 4, 0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20000, 3, 0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20008, 2, 0));
        HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 1, 0));
        HERMES_EMIT(HERMES_RET(HERMES_EPERM));
        HERMES_EMIT(HERMES_RET(SECCOMP_RET_ALLOW));
    } else {
        HERMES_EMIT(HERMES_RET(HERMES_EPERM));
    }
    return n;
}

/* A binary search over nrs[lo..hi) (sorted, distinct): each number's rule, every other number allowed. */
static unsigned short hermes_search(struct sock_filter *out, unsigned short n, const unsigned int *nrs, unsigned lo, unsigned hi) {
    if (hi - lo <= 3) {
        for (unsigned i = lo; i < hi; i++) {
            unsigned short at = n;
            HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nrs[i], 0, 0));
            n = hermes_rule(out, n, nrs[i]);
            out[at].jf = (unsigned char)(n - at - 1);
        }
        HERMES_EMIT(HERMES_RET(SECCOMP_RET_ALLOW));
        return n;
    }
    unsigned mid = lo + (hi - lo) / 2;
    unsigned short at = n;
    HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, nrs[mid], 0, 0));
    n = hermes_search(out, n, nrs, mid, hi);
    out[at].jf = (unsigned char)(n - at - 1); /* under 256: the filter's halves are far smaller */
    return hermes_search(out, n, nrs, lo, mid);
}

/* The filter. The numbers are searched, not compared one by one: the kernel runs the filter for every
   syscall number as it is installed (to cache the always-allowed ones), once per command, and a chain of
   ~70 comparisons made that ~0.15 ms of each command's start. */
static unsigned short hermes_filter(struct sock_filter *out) {
    unsigned int nrs[HERMES_RULES_MAX];
    unsigned count = 0;
    const unsigned int extra[] = {__NR_clone3, __NR_clone, __NR_unshare, __NR_personality};
    for (unsigned long i = 0; i < HERMES_DENIED_COUNT + 4; i++) {
        unsigned int nr = i < HERMES_DENIED_COUNT ? hermes_denied[i] : extra[i - HERMES_DENIED_COUNT];
        unsigned j = count;
        while (j > 0 && nrs[j - 1] > nr) j--;
        if (j > 0 && nrs[j - 1] == nr) continue; /* listed twice */
        for (unsigned k = count; k > j; k--) nrs[k] = nrs[k - 1];
        nrs[j] = nr;
        count++;
    }
    unsigned short n = 0;
    HERMES_EMIT(HERMES_LOAD(HERMES_ARCH));
    HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, HERMES_AUDIT_ARCH, 1, 0));
    HERMES_EMIT(HERMES_RET(SECCOMP_RET_KILL_PROCESS));
    HERMES_EMIT(HERMES_LOAD(HERMES_NR));
#ifdef HERMES_X32_BIT
    HERMES_EMIT(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, HERMES_X32_BIT, 0, 1));
    HERMES_EMIT(HERMES_RET(SECCOMP_RET_KILL_PROCESS));
#endif
    return hermes_search(out, n, nrs, 0, count);
}
#undef HERMES_EMIT
