"""The slot syscall filter (sandbox_server/syscall_filter.h) decides every call as its rules say.

The filter is a binary search over the numbers with a rule (cheaper for the kernel to install per
command than a chain of comparisons). A harness built from the header runs the generated program
in a small classic-BPF interpreter for every syscall number (and the x32 and foreign-architecture
cases, and the arguments clone, unshare and personality are checked on) and compares each decision
with the rules written out plainly: the denied list refused (EPERM), clone3 ENOSYS, namespace flags
refused, personality only Docker's values, everything else allowed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import sandbox_server

HEADER_DIR = Path(sandbox_server.__file__).parent

HARNESS = r"""
#include <stdio.h>
#include "syscall_filter.h"

/* The rules, written out plainly (the filter must decide exactly this). */
static unsigned rule(unsigned arch, unsigned nr, unsigned arg0) {
    if (arch != HERMES_AUDIT_ARCH) return SECCOMP_RET_KILL_PROCESS;
#ifdef HERMES_X32_BIT
    if (nr >= HERMES_X32_BIT) return SECCOMP_RET_KILL_PROCESS;
#endif
    for (unsigned long i = 0; i < sizeof hermes_denied / sizeof hermes_denied[0]; i++)
        if (nr == hermes_denied[i]) return HERMES_EPERM;
    if (nr == __NR_clone3) return HERMES_ENOSYS;
    if (nr == __NR_clone) return arg0 & HERMES_CLONE_NS ? HERMES_EPERM : SECCOMP_RET_ALLOW;
    if (nr == __NR_unshare) return arg0 & (HERMES_CLONE_NS | CLONE_NEWTIME) ? HERMES_EPERM : SECCOMP_RET_ALLOW;
    if (nr == __NR_personality)
        return arg0 == 0 || arg0 == 8 || arg0 == 0x20000 || arg0 == 0x20008 || arg0 == 0xffffffffu ? SECCOMP_RET_ALLOW
                                                                                                     : HERMES_EPERM;
    return SECCOMP_RET_ALLOW;
}

/* Classic BPF as seccomp runs it, for the instructions the filter uses; -1 for anything else. */
static long run(const struct sock_filter *f, unsigned len, unsigned arch, unsigned nr, unsigned arg0, unsigned *steps) {
    unsigned a = 0;
    *steps = 0;
    for (unsigned pc = 0; pc < len; pc++) {
        const struct sock_filter *i = &f[pc];
        ++*steps;
        switch (i->code) {
        case BPF_LD | BPF_W | BPF_ABS:
            if (i->k == HERMES_NR) a = nr;
            else if (i->k == HERMES_ARCH) a = arch;
            else if (i->k == HERMES_ARG0) a = arg0;
            else return -1;
            break;
        case BPF_JMP | BPF_JEQ | BPF_K: pc += a == i->k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGE | BPF_K: pc += a >= i->k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JSET | BPF_K: pc += a & i->k ? i->jt : i->jf; break;
        case BPF_RET | BPF_K: return i->k;
        default: return -1;
        }
    }
    return -1; /* ran off the end */
}

int main(void) {
    struct sock_filter f[HERMES_FILTER_MAX];
    unsigned len = hermes_filter(f), steps, most = 0, wrong = 0, checked = 0;
    const unsigned args[] = {0, 17, 0x8, 0x20000, 0x20008, 0x0400000, 0xffffffffu, 0x00000100 | 0x00000200 | 0x00000400,
                             CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                             CLONE_NEWNET, CLONE_NEWTIME, CLONE_NEWUSER | 17};
    const unsigned arches[] = {HERMES_AUDIT_ARCH, 0x40000003u /* i386 */, 0x40000028u /* arm */, 0};
    for (unsigned x = 0; x < sizeof arches / sizeof arches[0]; x++)
        for (unsigned long nr = 0; nr < 2048 || (nr >= 0x40000000u && nr < 0x40000000u + 1024); nr++) {
            if (nr == 2048) nr = 0x40000000u;
            for (unsigned k = 0; k < sizeof args / sizeof args[0]; k++) {
                long got = run(f, len, arches[x], (unsigned)nr, args[k], &steps);
                checked++;
                if (got != (long)rule(arches[x], (unsigned)nr, args[k])) {
                    if (wrong++ < 20) printf("WRONG arch=%#x nr=%lu arg0=%#x: %#lx\n", arches[x], nr, args[k], got);
                }
                if (arches[x] == HERMES_AUDIT_ARCH && nr < 2048 && steps > most) most = steps;
            }
        }
    for (unsigned long nr = 0xfffffc00u; nr <= 0xffffffffu; nr++) { /* the top of the range */
        long got = run(f, len, HERMES_AUDIT_ARCH, (unsigned)nr, 0, &steps);
        checked++;
        if (got != (long)rule(HERMES_AUDIT_ARCH, (unsigned)nr, 0) && wrong++ < 20) printf("WRONG nr=%lu: %#lx\n", nr, got);
    }
    printf("instructions %u checked %u wrong %u most_steps %u\n", len, checked, wrong, most);
    return wrong != 0;
}
"""


def test_the_filter_decides_every_call_as_its_rules_say(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    assert cc is not None, "a C compiler is needed (scripts/setup.sh builds hermes-spawn with it)"
    (tmp_path / "harness.c").write_text(HARNESS)
    subprocess.run(
        [cc, "-O1", "-Wall", "-I", str(HEADER_DIR), "-o", str(tmp_path / "harness"), str(tmp_path / "harness.c")],
        check=True,
    )
    out = subprocess.run([str(tmp_path / "harness")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    stats = dict(zip(*[iter(out.stdout.split()[-8:])] * 2))
    assert int(stats["checked"]) > 100_000 and stats["wrong"] == "0"
    # A search, not a chain: any number is decided in a few comparisons (the kernel runs the filter for
    # every number as it installs it, per command); a chain of the ~70 rules took over 70.
    assert int(stats["most_steps"]) <= 24, out.stdout
