/* A slot's exec server: `hermes-spawn --serve EXEC_FD CTL_FD TMP_BYTES [--tmp-bind PATH]... [--sysctl NAME=VALUE]...`

   Runs as root inside the slot's long-lived bubblewrap namespace (see spawner.py) with only CAP_SETUID, SETGID,
   SETPCAP, KILL and SYS_ADMIN, and starts the slot's commands, one at a time. Compiled into hermes-spawn (same
   binary, same system-call layer), so a command costs one fork of this small process and one exec of bash: the
   child does hermes-spawn's own work (spawn_helper.c: limits, uid, no capabilities, the syscall filter) in place
   when the command line starts with it, instead of exec'ing it.

   Protocol (both sockets SOCK_SEQPACKET, from the host's SlotShell):
   - EXEC_FD carries requests "ID\0FDS\0CWD\0ARGC\0ARGV...\0ENV...\0" with the descriptors FDS names (one letter
     each, in order: o = output for 1 and 2, i = stdin, s = a long command's script as 3);
   - CTL_FD carries kills from the host ({"kill": ID}) and our replies: {"ready": PID} once, then
     {"id": ID, "exit": CODE} per command (128 + signal if it was killed by one).
   Once a command's main process exits (or is killed), everything else in the slot's pid namespace but its init and
   this server is killed, and /tmp gets a fresh size-capped tmpfs if anything was written there, before the next
   request is read. As the subreaper it reaps the command's orphans as they die (zombies count against the slot's
   process limit). */
#include <linux/capability.h>
#include <linux/prctl.h>
#include <poll.h>
#include <sys/socket.h>

#include "spawn_sys.h"

#define EINTR 4
#define EAGAIN 11
#define EEXIST 17
#define ESRCH 3
#define SIGKILL 9
#define SIGCHLD 17
#define WNOHANG 1
#define O_RDONLY 0
#define O_WRONLY 1
#define O_RDWR 2
#define O_DIRECTORY 0200000
#define O_CLOEXEC 02000000
#define SFD_NONBLOCK 04000
#define MNT_DETACH 2
#define MS_RDONLY 1
#define MS_NOSUID 2
#define MS_NODEV 4
#define MS_REMOUNT 32
#define MS_BIND 4096
#define MS_REC 16384
#define F_GETFD 1
#define F_SETFD 2
#define KEEP_DIR "/.hermes-keep" /* isolation.KEEP_DIR: a second view of the read-only binds inside /tmp */
#define MAX_MESSAGE (256 * 1024)
#define MAX_BINDS 64
#define KILLED (128 + SIGKILL)
#define CLONE_VM 0x00000100
#define CLONE_VFORK 0x00004000

static char request[MAX_MESSAGE];
static char *strings[MAX_MESSAGE + 8]; /* argv, then envp, each NULL-terminated (an empty string is one byte) */

static char *decimal(char *end, unsigned long v);

/* The server cannot go on (a bad start or a broken host): say why on stderr (the host shows it) and exit. */
static void fail(const char *what, long err) {
    char num[24];
    num[23] = 0;
    say("hermes exec server: ");
    say(what);
    say(" (errno ");
    say(decimal(num + 23, (unsigned long)(err < 0 ? -err : err)));
    say(")\n");
    sys(SYS_exit_group, 1, 0, 0, 0);
}

static long check(long rc, const char *what) {
    if (rc < 0) fail(what, rc);
    return rc;
}

static char *decimal(char *end, unsigned long v) { /* writes v ending at `end` (exclusive); returns its start */
    do *--end = (char)('0' + v % 10), v /= 10;
    while (v);
    return end;
}

static long parse(const char *s) {
    long v = 0;
    if (*s < '0' || *s > '9') return -1;
    for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (*s - '0');
    return *s ? -1 : v;
}

static char *concat(char *out, const char *s) {
    while (*s) *out++ = *s++;
    *out = 0;
    return out;
}

static void reply(int ctl, const char *key1, long v1, const char *key2, long v2) {
    char msg[96], n1[24], n2[24], *p = msg;
    n1[23] = n2[23] = 0;
    p = concat(concat(concat(p, "{\""), key1), "\": ");
    p = concat(p, decimal(n1 + 23, (unsigned long)v1));
    if (key2) p = concat(concat(concat(concat(p, ", \""), key2), "\": "), decimal(n2 + 23, (unsigned long)v2));
    p = concat(p, "}");
    check(sys(SYS_sendto, ctl, (long)msg, p - msg, 0), "reply to the host");
}

/* What every command must not have, taken from this server once (children inherit it): a bounding set of only
   CAP_SETUID/SETGID/SETPCAP (the child then empties it and switches uid), no inheritable or ambient
   capabilities, no_new_privs. The server keeps its permitted and effective capabilities (it never execs). */
static void drop_for_children(void) {
    for (long cap = 0; cap <= 63; cap++) {
        if (cap == CAP_SETGID || cap == CAP_SETUID || cap == CAP_SETPCAP) continue;
        long rc = sys(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0);
        if (rc == -22) break; /* EINVAL: past the kernel's last capability */
        check(rc, "drop the bounding set");
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    check(sys(SYS_capget, (long)&header, (long)data, 0, 0), "read capabilities");
    data[0].inheritable = data[1].inheritable = 0;
    check(sys(SYS_capset, (long)&header, (long)data, 0, 0), "clear inheritable capabilities");
    check(sys(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0), "clear ambient capabilities");
    check(sys(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0), "no_new_privs");
}

/* The slot's IPC namespace limits (kernel/NAME; per namespace, and root here owns them). */
static void set_sysctl(const char *assignment) {
    char path[128], *p = concat(path, "/proc/sys/kernel/");
    const char *v = assignment;
    while (*v && *v != '=' && p < path + sizeof path - 1) *p++ = *v++;
    *p = 0;
    if (*v != '=') fail(assignment, -22);
    v++;
    long fd = check(sys(SYS_openat, -100, (long)path, O_WRONLY | O_CLOEXEC, 0), path);
    check(sys(SYS_write, fd, (long)v, (long)len(v), 0), path);
    sys(SYS_close, fd, 0, 0, 0);
}

struct state {
    int ctl;
    long child_pid, child_id, status, last_done, pending_kill;
    int done; /* the command's main process has been reaped: status holds its wait status */
};

static void reap(struct state *st) {
    int status;
    for (;;) {
        long pid = sys5(SYS_wait4, -1, (long)&status, WNOHANG, 0, 0);
        if (pid <= 0) return; /* 0: none exited yet; -ECHILD: no children */
        if (pid == st->child_pid && !st->done) st->status = status, st->done = 1;
    }
}

/* Monotonic nanoseconds. */
static long now_ns(void) {
    struct hermes_timespec t = {0, 0};
    sys(SYS_clock_gettime, 1 /* CLOCK_MONOTONIC */, (long)&t, 0, 0);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* SIGKILL every process in the slot's pid namespace but its init and us, until none is left.
   Bounded by time, not rounds: on a loaded machine a killed process waiting on the disk (an exec
   reading its binary) takes seconds to go. One still there after KILL_ALL_NS cannot be let outlive
   its command: the server exits, and bwrap's init takes the whole namespace down with it. */
#define KILL_ALL_NS (60L * 1000000000L)
static void kill_all(struct state *st) {
    long start = now_ns(), pause_ns = 100000;
    for (;;) {
        if (sys(SYS_kill, -1, SIGKILL, 0, 0) == -ESRCH) return;
        reap(st); /* as the subreaper the killed orphans' zombies are ours; kill(-1) counts zombies too */
        if (now_ns() - start > KILL_ALL_NS) fail("processes survived SIGKILL for 60 s; ending the slot's namespace", 0);
        struct hermes_timespec pause = {0, pause_ns};
        sys(SYS_nanosleep, (long)&pause, 0, 0, 0);
        if (pause_ns < 10000000) pause_ns *= 2; /* 0.1 ms, doubling to 10 ms */
    }
}

static struct {
    const char *path[MAX_BINDS];
    char top[MAX_BINDS][256]; /* /tmp/<top>/...: root's directories, read-only below */
    int n;
    char size_opts[64];
} tmp;

static int is_top(const char *name) {
    for (int i = 0; i < tmp.n; i++)
        if (tmp.top[i][0] && same(tmp.top[i], name)) return 1;
    return 0;
}

/* Did the command leave anything in /tmp but the read-only binds' top directories? */
static int tmp_written(void) {
    long fd = check(sys(SYS_openat, -100, (long)"/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0), "open /tmp");
    static char entries[4096];
    int written = 0;
    long n;
    while (!written && (n = sys(SYS_getdents64, fd, (long)entries, sizeof entries, 0)) > 0) {
        for (long off = 0; off < n;) {
            unsigned short reclen = *(unsigned short *)(entries + off + 16);
            const char *name = entries + off + 19;
            if (!same(name, ".") && !same(name, "..") && !is_top(name)) written = 1;
            off += reclen;
        }
    }
    sys(SYS_close, fd, 0, 0, 0);
    return written;
}

static void make_dirs(const char *path) {
    char buf[4096];
    unsigned long n = len(path);
    if (n >= sizeof buf) fail(path, -36);
    for (unsigned long i = 0; i <= n; i++) {
        buf[i] = path[i];
        if ((path[i] == '/' && i > 0) || path[i] == 0) {
            buf[i] = 0;
            long rc = sys(SYS_mkdirat, -100, (long)buf, 0755, 0);
            if (rc < 0 && rc != -EEXIST) fail(path, rc);
            buf[i] = path[i];
        }
    }
}

/* Each command gets a private /tmp: a fresh tmpfs if the last one wrote there (an unmount costs every CPU an RCU
   sync, so not when nothing was written), with the read-only binds inside it put back from their second view. */
static void fresh_tmp(void) {
    if (!tmp_written()) return;
    check(sys(SYS_umount2, (long)"/tmp", MNT_DETACH, 0, 0), "unmount /tmp");
    check(sys5(SYS_mount, (long)"tmpfs", (long)"/tmp", (long)"tmpfs", MS_NOSUID | MS_NODEV, (long)tmp.size_opts),
          "mount /tmp");
    for (int i = 0; i < tmp.n; i++) {
        char keep[64], num[24], *p = concat(keep, KEEP_DIR "/");
        num[23] = 0;
        concat(p, decimal(num + 23, (unsigned long)i));
        make_dirs(tmp.path[i]);
        check(sys5(SYS_mount, (long)keep, (long)tmp.path[i], 0, MS_BIND | MS_REC, 0), tmp.path[i]);
        check(sys5(SYS_mount, 0, (long)tmp.path[i], 0, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, 0),
              tmp.path[i]);
    }
}

/* The command's process: a session of its own, the caller's pipes as 0/1/2 (the script as 3), no signal blocked,
   in the request's directory; then hermes-spawn's own work in place, or an exec of whatever prefix was sent.
   It runs as a vfork child, on the server's memory and stack below the server's frame: it writes no memory of the
   server's and never returns (it execs or exits; the server waits until it has). Everything it changes (uid,
   limits, descriptors, filter, session) belongs to its own task. */
__attribute__((noreturn)) static void child(char **argv, char **envp, const char *cwd, long out, long in, long script) {
    sys(SYS_setsid, 0, 0, 0, 0);
    sys(SYS_dup3, in, 0, 0, 0); /* every received descriptor is above 3: the server keeps 0-3 taken */
    sys(SYS_dup3, out, 1, 0, 0);
    sys(SYS_dup3, out, 2, 0, 0);
    if (script >= 0) sys(SYS_dup3, script, 3, 0, 0);
    unsigned long none = 0;
    sys(SYS_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&none, 0, sizeof none);
    long rc = sys(SYS_chdir, (long)cwd, 0, 0, 0);
    if (rc < 0) {
        say("sandbox: cannot start the command: ");
        say(cwd);
        say(": no such directory\n");
        sys(SYS_exit_group, 126, 0, 0, 0);
    }
    int argc = 0;
    while (argv[argc]) argc++;
    if (same(argv[0], "/.hermes-spawn")) {
        sys(SYS_exit_group, hermes_spawn_run(argc, argv, envp), 0, 0, 0);
        for (;;) {
        }
    }
    /* The prlimit + setpriv prefix (--no-spawn-helper): nothing of ours passes but 0-3. */
    if (sys(SYS_close_range, script >= 0 ? 4 : 3, ~0U, 0, 0) < 0)
        for (long fd = script >= 0 ? 4 : 3; fd < 65536; fd++) sys(SYS_close, fd, 0, 0, 0);
    rc = sys(SYS_execve, (long)argv[0], (long)argv, (long)envp, 0);
    say("sandbox: cannot start the command: ");
    say(argv[0]);
    say("\n");
    sys(SYS_exit_group, 126, 0, 0, 0);
    for (;;) {
    }
}

/* One request and its descriptors (close-on-exec) from the exec socket; starts the command. 0 if the host left. */
static int start(struct state *st, int exec_fd, long null) {
    struct iovec iov = {request, sizeof request};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(3 * sizeof(int))];
    } control;
    struct msghdr msg = {0, 0, &iov, 1, control.buf, sizeof control.buf, 0};
    long n = sys(SYS_recvmsg, exec_fd, (long)&msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT, 0);
    if (n == -EAGAIN || n == -EINTR) return 1;
    if (n <= 0) return 0;
    int fds[3] = {-1, -1, -1}, nfds = 0;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < nfds && i < 3; i++) fds[i] = ((int *)CMSG_DATA(c))[i];
    }
    if (request[n - 1] != 0) fail("a request not ending in NUL", -22);
    int count = 0;
    for (char *p = request; p < request + n; p += len(p) + 1) strings[count++] = p;
    long argc = count >= 4 ? parse(strings[3]) : -1;
    if (argc < 1 || 4 + argc > count) fail("a malformed request", -22);
    long id = parse(strings[0]), out = -1, in = null, script = -1;
    for (int i = 0; strings[1][i] && i < nfds && i < 3; i++) {
        char kind = strings[1][i];
        if (kind == 'o') out = fds[i];
        else if (kind == 'i') in = fds[i];
        else if (kind == 's') script = fds[i];
    }
    if (id < 0 || out < 0) fail("a request without an id or an output", -22);
    /* argv is strings[4 .. 4+argc), envp the rest: each gets a NULL after it (strings has the room). */
    char **argv = strings + 4, **envp = strings + 4 + argc + 1;
    for (int i = count; i > 4 + argc; i--) strings[i] = strings[i - 1];
    strings[4 + argc] = 0;
    strings[count + 1] = 0;
    if (id == st->pending_kill) { /* killed before it started: it never runs */
        st->last_done = id;
        reply(st->ctl, "id", id, "exit", KILLED);
    } else {
        /* vfork: nothing of the server's memory is copied (a fork's page-table copy and the child's faults cost
           more than the exec of hermes-spawn this replaces) */
        long pid = sys5(SYS_clone, CLONE_VM | CLONE_VFORK | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) child(argv, envp, strings[2], out, in, script);
        if (pid < 0) {
            st->last_done = id;
            reply(st->ctl, "id", id, "exit", 126);
        } else {
            st->child_pid = pid, st->child_id = id, st->done = 0;
        }
    }
    for (int i = 0; i < nfds; i++) sys(SYS_close, fds[i], 0, 0, 0);
    return 1;
}

static void finish(struct state *st) {
    kill_all(st); /* the command is over: nothing it started outlives it */
    int s = (int)st->status;
    long code = (s & 0x7f) == 0 ? (s >> 8) & 0xff : 128 + (s & 0x7f);
    st->last_done = st->child_id;
    reply(st->ctl, "id", st->child_id, "exit", code);
    st->child_pid = 0;
    fresh_tmp();
}

/* A kill request: {"kill": ID}, its first number. */
static void on_kill(struct state *st, const char *msg, long n) {
    long id = -1;
    for (long i = 0; i < n; i++) {
        if (msg[i] >= '0' && msg[i] <= '9') {
            id = 0;
            for (; i < n && msg[i] >= '0' && msg[i] <= '9'; i++) id = id * 10 + (msg[i] - '0');
            break;
        }
    }
    if (id < 0) return;
    if (st->child_pid && id == st->child_id) kill_all(st);
    else if (id > st->last_done) st->pending_kill = id;
}

int hermes_serve(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 3) fail("usage: hermes-spawn --serve EXEC_FD CTL_FD TMP_BYTES [--tmp-bind PATH]... [--sysctl K=V]...", -22);
    long exec_fd = parse(argv[0]), ctl = parse(argv[1]), tmp_bytes = parse(argv[2]);
    if (exec_fd < 0 || ctl < 0 || tmp_bytes <= 0) fail("bad descriptors or /tmp size", -22);
    char *p = concat(tmp.size_opts, "size="), num[24];
    num[23] = 0;
    concat(concat(p, decimal(num + 23, (unsigned long)tmp_bytes)), ",mode=1777");
    check(sys(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0), "subreaper");
    for (int i = 3; i + 1 < argc; i += 2) {
        if (same(argv[i], "--sysctl")) {
            set_sysctl(argv[i + 1]);
        } else if (same(argv[i], "--tmp-bind") && tmp.n < MAX_BINDS) {
            const char *path = argv[i + 1];
            tmp.path[tmp.n] = path;
            if (path[0] == '/' && path[1] == 't' && path[2] == 'm' && path[3] == 'p' && path[4] == '/') {
                int k = 0;
                for (const char *q = path + 5; *q && *q != '/' && k < 255; q++) tmp.top[tmp.n][k++] = *q;
                tmp.top[tmp.n][k] = 0;
            }
            tmp.n++;
        } else {
            fail(argv[i], -22);
        }
    }
    drop_for_children();
    /* SIGCHLD arrives through a signalfd: blocked here, unblocked in each command (child()). */
    unsigned long chld = 1UL << (SIGCHLD - 1);
    check(sys(SYS_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&chld, 0, sizeof chld), "block SIGCHLD");
    long sfd = check(sys(SYS_signalfd4, -1, (long)&chld, sizeof chld, SFD_NONBLOCK | O_CLOEXEC), "signalfd");
    sys(SYS_fcntl, exec_fd, F_SETFD, 1, 0); /* passed in by bwrap; no command may hold them */
    sys(SYS_fcntl, ctl, F_SETFD, 1, 0);
    long null = check(sys(SYS_openat, -100, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0), "open /dev/null");
    for (long fd = 0; fd <= 3; fd++) /* keep 0-3 taken, so no received descriptor is one a command gets */
        if (sys(SYS_fcntl, fd, F_GETFD, 0, 0) < 0) sys(SYS_dup3, null, fd, O_CLOEXEC, 0);
    struct state st = {(int)ctl, 0, 0, 0, 0, 0, 0};
    reply(st.ctl, "ready", sys(SYS_getpid, 0, 0, 0, 0), 0, 0);
    char msg[256], drain[1024];
    for (;;) {
        /* One command at a time: while one runs, the next request waits in the socket. */
        struct pollfd fds[3] = {{(int)ctl, POLLIN, 0}, {(int)sfd, POLLIN, 0}, {st.child_pid ? -1 : (int)exec_fd, POLLIN, 0}};
        long rc = sys5(SYS_ppoll, (long)fds, 3, 0, 0, 0);
        if (rc == -EINTR) continue;
        check(rc, "poll");
        if (fds[1].revents) {
            while (sys(SYS_read, sfd, (long)drain, sizeof drain, 0) > 0) {
            }
            reap(&st);
        }
        if (fds[0].revents) {
            long n = sys(SYS_recvfrom, ctl, (long)msg, sizeof msg, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) return 0; /* the host went away */
            if (n > 0) on_kill(&st, msg, n);
        }
        if (fds[2].revents && !st.child_pid && !start(&st, (int)exec_fd, null)) return 0;
        /* The command's main process has been reaped (by a SIGCHLD's reap or a kill's): it is over. */
        if (st.child_pid && st.done) finish(&st);
    }
}
