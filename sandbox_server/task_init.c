/* `hermes-spawn --init`: pid 1 of a task container (backends/task_container.py), in place of docker's init and
   Harbor's `sleep infinity` keep-alive.

   It is the one process of the container the verifier's guard spares, so the agent must not be able to make it
   run anything else. It makes itself non-dumpable first: ptrace, /proc/1/mem and process_vm_writev on it then
   need CAP_SYS_PTRACE, which a task container never has (the engine's default set), whatever uid the agent
   has in it. Inside its pid namespace, pid 1 gets no signal it has no handler for, SIGKILL included, and it
   installs none: only the engine (from outside) stops it. It never execs (an exec would make it dumpable again).
   Its work is init's: reap what is reparented to it. */
#include <linux/prctl.h>
#include <sys/syscall.h>

#include "spawn_sys.h"

/* The same numbers on x86-64 and arm64 (the freestanding targets; libc builds use the host's). */
#define HERMES_SIGCHLD 17
#define HERMES_SIG_BLOCK 0
#define HERMES_WNOHANG 1

int hermes_task_init(void) {
    long rc = sys(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0);
    if (rc < 0) die("PR_SET_DUMPABLE", rc);
    if (sys(SYS_prctl, PR_GET_DUMPABLE, 0, 0, 0) != 0) die("PR_SET_DUMPABLE did not hold", 22);
    /* SIGCHLD blocked and waited for: a blocked signal is queued even for pid 1 (an ignored default is not). */
    unsigned long chld = 1UL << (HERMES_SIGCHLD - 1);
    if ((rc = sys(SYS_rt_sigprocmask, HERMES_SIG_BLOCK, (long)&chld, 0, sizeof chld)) < 0) die("sigprocmask", rc);
    struct hermes_timespec tick = {5, 0}; /* a lost wake-up costs a zombie at most this long */
    for (;;) {
        while (sys5(SYS_wait4, -1, 0, HERMES_WNOHANG, 0, 0) > 0) {
        }
        sys(SYS_rt_sigtimedwait, (long)&chld, 0, (long)&tick, sizeof chld);
    }
}
