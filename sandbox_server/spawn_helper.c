/* hermes-spawn: become a slot's user with its limits, then exec the command.

   hermes-spawn UID RESOURCE:SOFT:HARD... -- COMMAND [ARG...]

   A slot's exec server (exec_server.py) posix_spawns this as root with only CAP_SETUID,
   CAP_SETGID and CAP_SETPCAP. It sets the rlimits, empties the bounding set, drops every
   supplementary group, switches real/effective/saved uid and gid to UID (which clears the
   permitted, effective and ambient capabilities), clears the inheritable ones, sets
   no_new_privs, closes every descriptor above 3 and execs COMMAND (PATH search). It does what
   `prlimit ... setpriv ...` does (the fallback when this is not built) in one exec instead of
   three. Any failure exits 127 before the command runs.

   Built by scripts/setup.sh and the Dockerfile: cc -O2 -static -o hermes-spawn spawn_helper.c */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static void die(const char *what) {
    dprintf(2, "sandbox: cannot start the command: %s: %s\n", what, strerror(errno));
    _exit(127);
}

static long number(const char *text, const char *what) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || (*end && *end != ':') || v < 0) {
        errno = EINVAL;
        die(what);
    }
    return (long)v;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        errno = EINVAL;
        die("usage: hermes-spawn UID RESOURCE:SOFT:HARD... -- COMMAND");
    }
    long uid = number(argv[1], "uid");
    if (uid == 0) {
        errno = EINVAL;
        die("uid 0");
    }
    int i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        char *soft = strchr(argv[i], ':');
        char *hard = soft ? strchr(soft + 1, ':') : NULL;
        if (!hard) {
            errno = EINVAL;
            die(argv[i]);
        }
        struct rlimit lim = {(rlim_t)number(soft + 1, argv[i]), (rlim_t)number(hard + 1, argv[i])};
        if (setrlimit((int)number(argv[i], argv[i]), &lim) != 0) die(argv[i]);
    }
    if (i + 1 >= argc) {
        errno = EINVAL;
        die("no command after --");
    }
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) die("drop bounding set");
    }
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0) die("setresgid");
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) die("setresuid");
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &header, none) != 0) die("clear capabilities");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs");
    uid_t r, e, s;
    if (getresuid(&r, &e, &s) != 0 || r != (uid_t)uid || e != (uid_t)uid || s != (uid_t)uid) die("uid check");
    /* 0-2 are the command's pipes, 3 its script if it has one; nothing of the server's passes. */
    if (syscall(SYS_close_range, 4U, ~0U, 0) != 0) {
        for (int fd = 4; fd < 65536; fd++) close(fd);
    }
    execvp(argv[i + 1], argv + i + 1);
    dprintf(2, "sandbox: cannot run %s: %s\n", argv[i + 1], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
}
