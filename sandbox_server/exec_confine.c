/* hermes-confine.so: every program exec'd in the terminal verifier's process tree starts in a Landlock domain
   nested in its parent's, so no process there can ptrace an ancestor that exec'd it (as Yama's ptrace_scope 1).

   The sandbox server binds this library read-only at /.hermes-confine.so in every slot command's namespace, and
   the terminal verifier starts test.sh's guarded shell (or Endless Terminals' pytest) with LD_PRELOAD naming it.
   The variable stays set, so every dynamically linked program below loads it too. Its execve, execv, execvp,
   execvpe, execl, execlp and execle run first (glibc's own execv/execvp/execl* call its internal execve, not the
   exported one, so each is defined here): they put the calling process in a new Landlock domain, then make the
   execve system call. Its posix_spawn and posix_spawnp (CPython 3.13's subprocess, Rust's Command) have libc's
   spawn this file itself, run as a program, which does the same in the child. A process in a Landlock domain can only ptrace (and so open /proc/PID/mem, use
   process_vm_writev, pidfd_getfd...) processes in its own domain or one nested under it: a program cannot reach
   the process that exec'd it (test.sh's shell, pytest) nor any ancestor, while a parent still traces its children.
   The domain restricts little else: it refuses mount(2) and making block devices (see confine()); signals are not
   scoped (a test.sh's `pkill` of a server it started in the background, from another process, must still work).
   On Landlock ABI 1 nothing is confined.

   Not confined anew: what a static program (no preloading) or libc itself (system(), popen: they call libc's
   internal spawn) execs. Such a child stays in the domain of the process that spawned it, so it can
   reach that process (and the others in its domain) but no ancestor of it; its own execs are confined again.
   Landlock nests at most 16 domains: past that depth, a program stays in its parent's domain.

   The process is confined before the exec is tried, so a script bash then runs in that child itself (no #!,
   execve fails with ENOEXEC) is confined too; a path that is not executable is refused first, with no domain made,
   so a PATH search (the exec*p functions here, or CPython's own) nests one domain, not one per try.
   Where Landlock is missing (old kernels, gVisor) or refused, the exec goes ahead unconfined: the verifier checks
   for that itself (see environments/terminal_tasks/verify.py).

   Built by sandbox_server/build_exec_confine.sh (scripts/setup.sh, and into the sandbox runtime): -nostdlib
   -shared, system calls only and three libc symbols (__errno_location, environ, dl_iterate_phdr: in glibc and musl
   alike, unversioned), so it loads into the programs of any image on the same architecture (x86-64, arm64). */
#include <elf.h>
#include <linux/landlock.h>
#include <linux/prctl.h>
#include <stdarg.h>
#include <sys/syscall.h>

/* The ruleset attribute as of ABI 1 (the header's may be larger). */
struct ruleset_attr {
    unsigned long long handled_access_fs;
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
extern char **environ;

/* PATH from the environment, as the exec*p functions search it; glibc's default when it is unset. */
/* buf = DIR/FILE (FILE's NUL included); an empty DIR (a PATH entry "") is the working directory: FILE alone. */
static void join(char *buf, const char *dir, long dlen, const char *file, long flen) {
    long n = 0;
    for (long i = 0; i < dlen; i++) buf[n++] = dir[i];
    if (dlen) buf[n++] = '/';
    for (long i = 0; i <= flen; i++) buf[n++] = file[i];
}

static const char *search_path(void) {
    for (char **e = environ; e && *e; e++) {
        const char *v = *e;
        if (v[0] == 'P' && v[1] == 'A' && v[2] == 'T' && v[3] == 'H' && v[4] == '=') return v + 5;
    }
    return "/bin:/usr/bin";
}
/* struct dl_phdr_info's leading fields (glibc and musl alike); x86-64 and arm64 are 64-bit. */
struct phdr_info {
    Elf64_Addr addr;
    const char *name;
    const Elf64_Phdr *phdr;
    Elf64_Half phnum;
};
extern int dl_iterate_phdr(int (*)(struct phdr_info *, unsigned long, void *), void *);

#ifndef HERMES_CONFINE_ABI /* a test build may pretend the kernel has an older ABI */
#define HERMES_CONFINE_ABI(found) (found)
#endif

/* No "confined already" mark in memory: CPython's subprocess execs from a vfork child, which shares the spawner's
   memory, and a later child given the same thread id would skip its domain (the ids cycle). A path that cannot be
   exec'd is refused before any domain is made instead (see exec_checked), so a PATH search nests one. */
static void confine(void) {
    long abi = HERMES_CONFINE_ABI(sys3(__NR_landlock_create_ruleset, 0, 0, LANDLOCK_CREATE_RULESET_VERSION));
    /* ABI 1 denies every rename or link across directories in a domain, whatever it handles: not used. */
    if (abi < 2) return;
    /* A domain must handle some access (any domain scopes ptrace): "make a block device", with no rule, and
       "reparent" (renames and links across directories, denied in every domain unless a rule grants it), granted
       on all of /. Such a domain also refuses mount(2) and its kin. Not LANDLOCK_SCOPE_SIGNAL (ABI 6): sibling
       domains could not signal each other, and test.sh's `pkill` of its own background server would fail. */
    struct ruleset_attr attr = {LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_REFER};
    long fd = sys3(__NR_landlock_create_ruleset, (long)&attr, sizeof attr, 0);
    if (fd < 0) return;
    struct landlock_path_beneath_attr everywhere = {LANDLOCK_ACCESS_FS_REFER, -1};
    long root = sys3(__NR_openat, -100 /* AT_FDCWD */, (long)"/", 010000000 | 02000000 /* O_PATH|O_CLOEXEC */);
    everywhere.parent_fd = (int)root;
    long added = root < 0 ? -1 : sys5(__NR_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&everywhere, 0, 0);
    if (root >= 0) sys3(__NR_close, root, 0, 0);
    if (added >= 0) { /* without the rule renames across directories would fail: this program runs unconfined */
        /* Needed unless the process has CAP_SYS_ADMIN; bubblewrap and hermes-spawn have set it already. */
        sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        sys3(__NR_landlock_restrict_self, fd, 0, 0);
    }
    sys3(__NR_close, fd, 0, 0);
}

static long access_x(const char *path) { return sys3(__NR_faccessat, -100 /* AT_FDCWD */, (long)path, 1 /* X_OK */); }

static int fail(long ret) {
    *__errno_location() = (int)-ret;
    return -1;
}

#define EXPORT __attribute__((visibility("default")))

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    /* Not executable: its error, and no exec tried (a file made executable meanwhile must not run unconfined). */
    long ok = access_x(path);
    if (ok < 0) return fail(ok);
    confine();
    return fail(sys3(__NR_execve, (long)path, (long)argv, (long)envp));
}

EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

/* The execve system call, and on ENOEXEC (no #!, not a binary) `/bin/sh path args...` as POSIX says execvp does. */
static long exec_or_sh(const char *path, char *const argv[], char *const envp[]) {
    long ret = sys3(__NR_execve, (long)path, (long)argv, (long)envp);
    if (ret != -8 /* ENOEXEC */) return ret;
    long argc = 0, i = 1;
    while (argv[argc]) argc++;
    const char *sh[argc + 3];
    sh[0] = "/bin/sh";
    sh[1] = path;
    for (; i < argc; i++) sh[i + 1] = argv[i];
    sh[i + 1] = 0;
    sys3(__NR_execve, (long)"/bin/sh", (long)sh, (long)envp);
    return ret;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    if (!*file) return fail(-2 /* ENOENT */);
    const char *p = file;
    while (*p && *p != '/') p++;
    if (*p) {
        long ok = access_x(file);
        if (ok < 0) return fail(ok);
        confine();
        return fail(exec_or_sh(file, argv, envp));
    }
    long flen = p - file;
    if (flen > 255) return fail(-36 /* ENAMETOOLONG */);
    const char *path = search_path();
    char buf[4096 + 256];
    long ret = -2, eacces = 0, confined = 0;
    for (const char *dir = path;; dir++) {
        const char *end = dir;
        while (*end && *end != ':') end++;
        long dlen = end - dir;
        if (dlen < 4096) {
            join(buf, dir, dlen, file, flen);
            ret = access_x(buf); /* tried only if executable, confined once */
            if (ret == 0 && !confined) confine(), confined = 1;
            if (ret == 0) ret = exec_or_sh(buf, argv, envp);
            if (ret == -13 /* EACCES */) eacces = 1;
            else if (ret != -2 && ret != -20 && ret != -116 && ret != -19 && ret != -110)
                return fail(ret); /* not ENOENT, ENOTDIR, ESTALE, ENODEV, ETIMEDOUT: glibc stops there too */
        }
        dir = end;
        if (!*dir) break;
    }
    return fail(eacces ? -13 : ret);
}

EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

/* execl, execlp, execle: the arguments (up to the null pointer) gathered into an array. */
#define GATHER(arg0, ap, args)                                  \
    long n_ = 1;                                                \
    va_start(ap, arg0);                                         \
    while (va_arg(ap, char *)) n_++;                            \
    va_end(ap);                                                 \
    char *args[n_ + 1];                                         \
    args[0] = (char *)arg0;                                     \
    va_start(ap, arg0);                                         \
    for (long i_ = 1; i_ <= n_; i_++) args[i_] = va_arg(ap, char *);

EXPORT int execl(const char *path, const char *arg0, ...) {
    va_list ap;
    GATHER(arg0, ap, args)
    va_end(ap);
    return execve(path, args, environ);
}

EXPORT int execlp(const char *file, const char *arg0, ...) {
    va_list ap;
    GATHER(arg0, ap, args)
    va_end(ap);
    return execvpe(file, args, environ);
}

EXPORT int execle(const char *path, const char *arg0, ...) {
    va_list ap;
    GATHER(arg0, ap, args)
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, args, envp);
}

/* posix_spawn, posix_spawnp: libc's (found below, past this library) start a trampoline, this very file run as a
   program (entry: hermes_trampoline), which confines itself, then execs the program; argv [this file, path, argv...].
   libc's spawn applies the file actions and attributes before exec'ing the trampoline, which keeps them all. The
   exec errors libc's spawn would report (no such file, not executable) are checked first; an exec the trampoline
   cannot make after all ends the child with status 127. */
typedef int spawn_fn(int *, const char *, const void *, const void *, char *const[], char *const[]);

struct lookup {
    const char *name;
    void *found, *self;
    const char *self_path;
};

static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

/* `name` defined in the object at `base` with dynamic section `dyn`, through its GNU or SysV hash table. */
static void *symbol(unsigned long base, const Elf64_Dyn *dyn, const char *name) {
    const Elf64_Sym *syms = 0;
    const char *strs = 0;
    const unsigned *gnu = 0, *sysv = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        unsigned long ptr = dyn->d_un.d_ptr;
        if (dyn->d_tag != DT_SYMTAB && dyn->d_tag != DT_STRTAB && dyn->d_tag != DT_GNU_HASH && dyn->d_tag != DT_HASH)
            continue;
        if (ptr < base) ptr += base; /* glibc's loader relocates these in place, musl's does not */
        if (dyn->d_tag == DT_SYMTAB) syms = (const Elf64_Sym *)ptr;
        else if (dyn->d_tag == DT_STRTAB) strs = (const char *)ptr;
        else if (dyn->d_tag == DT_GNU_HASH) gnu = (const unsigned *)ptr;
        else sysv = (const unsigned *)ptr;
    }
    if (!syms || !strs) return 0;
    if (gnu) {
        unsigned h = 5381;
        for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = h * 33 + *c;
        unsigned nbuckets = gnu[0], offset = gnu[1], bloom = gnu[2];
        const unsigned *buckets = gnu + 4 + bloom * (sizeof(Elf64_Addr) / 4), *chain = buckets + nbuckets;
        unsigned i = buckets[h % nbuckets];
        if (i < offset) return 0;
        for (;; i++) {
            unsigned h2 = chain[i - offset];
            const Elf64_Sym *s = syms + i;
            if ((h | 1) == (h2 | 1) && s->st_shndx != SHN_UNDEF && s->st_value && same(strs + s->st_name, name))
                return (void *)(base + s->st_value);
            if (h2 & 1) return 0;
        }
    }
    if (sysv) {
        unsigned long h = 0, g;
        for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
            h = (h << 4) + *c;
            g = h & 0xf0000000;
            if (g) h ^= g >> 24;
            h &= ~g;
        }
        unsigned nbucket = sysv[0];
        const unsigned *bucket = sysv + 2, *chain = bucket + nbucket;
        for (unsigned i = bucket[h % nbucket]; i; i = chain[i]) {
            const Elf64_Sym *s = syms + i;
            if (s->st_shndx != SHN_UNDEF && s->st_value && same(strs + s->st_name, name)) return (void *)(base + s->st_value);
        }
    }
    return 0;
}

static int visit(struct phdr_info *info, unsigned long size, void *data) {
    (void)size;
    struct lookup *l = data;
    const Elf64_Dyn *dyn = 0;
    int mine = 0;
    for (int i = 0; i < info->phnum; i++) {
        const Elf64_Phdr *ph = info->phdr + i;
        unsigned long start = info->addr + ph->p_vaddr;
        if (ph->p_type == PT_DYNAMIC) dyn = (const Elf64_Dyn *)start;
        if (ph->p_type == PT_LOAD && (unsigned long)l->self >= start && (unsigned long)l->self < start + ph->p_memsz)
            mine = 1;
    }
    if (mine) {
        l->self_path = info->name;
        return 0;
    }
    if (!l->found && dyn) l->found = symbol(info->addr, dyn, l->name);
    return 0;
}

static int spawn(const char *name, int *pid, const char *path, const void *fa, const void *attr, char *const argv[],
                 char *const envp[]) {
    struct lookup l = {name, 0, (void *)spawn, 0};
    dl_iterate_phdr(visit, &l);
    spawn_fn *real = (spawn_fn *)l.found;
    if (!real) return 38; /* ENOSYS: no libc below this library defines it */
    /* This library as a program needs its own absolute path (LD_PRELOAD names it so); else spawn as libc does. */
    if (!l.self_path || l.self_path[0] != '/' || access_x(l.self_path) < 0) return real(pid, path, fa, attr, argv, envp);
    /* A relative path is the child's, after the file actions' chdir (Rust's Command with current_dir): not checked
       here; an exec that fails there ends the child with 127. */
    long ret = path[0] == '/' ? access_x(path) : 0;
    if (ret < 0) return (int)-ret;
    long argc = 0;
    while (argv[argc]) argc++;
    char *args[argc + 3];
    args[0] = (char *)l.self_path;
    args[1] = (char *)path;
    for (long i = 0; i <= argc; i++) args[i + 2] = argv[i];
    return real(pid, l.self_path, fa, attr, args, envp);
}

EXPORT int posix_spawn(int *pid, const char *path, const void *fa, const void *attr, char *const argv[],
                       char *const envp[]) {
    return spawn("posix_spawn", pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(int *pid, const char *file, const void *fa, const void *attr, char *const argv[],
                        char *const envp[]) {
    const char *p = file;
    while (*p && *p != '/') p++;
    if (*p || !*file) return spawn("posix_spawn", pid, file, fa, attr, argv, envp);
    long flen = p - file;
    if (flen > 255) return 36; /* ENAMETOOLONG */
    const char *path = search_path();
    char buf[4096 + 256];
    long eacces = 0;
    for (const char *dir = path;; dir++) {
        const char *end = dir;
        while (*end && *end != ':') end++;
        long dlen = end - dir;
        if (dlen < 4096) {
            join(buf, dir, dlen, file, flen);
            long ret = access_x(buf);
            if (ret == 0) return spawn("posix_spawn", pid, buf, fa, attr, argv, envp);
            if (ret == -13) eacces = 1;
        }
        dir = end;
        if (!*dir) break;
    }
    return eacces ? 13 : 2;
}

/* Run as a program (posix_spawn's trampoline): no loader, no relocations; system calls only. */
__attribute__((used)) static void trampoline(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1), **envp = argv + argc + 1;
    if (argc >= 2) {
        confine();
        sys3(__NR_execve, (long)argv[1], (long)(argv + 2), (long)envp);
    }
    sys3(__NR_exit_group, 127, 0, 0);
}

#if defined(__x86_64__)
__asm__(".globl hermes_trampoline\n.hidden hermes_trampoline\n.type hermes_trampoline,@function\nhermes_trampoline:\n"
        "  mov %rsp, %rdi\n  and $-16, %rsp\n  call trampoline\n  hlt\n");
#else
__asm__(".globl hermes_trampoline\n.hidden hermes_trampoline\n.type hermes_trampoline,%function\nhermes_trampoline:\n"
        "  mov x0, sp\n  bl trampoline\n  brk #0\n");
#endif
