"""The guard test.sh runs under, on a slot (verify.py) and in a task container (container_guard.py).

test.sh is sourced by a guard shell with a DEBUG trap: before each of its commands that names reward.txt/reward.json,
and when it exits, every process outside test.sh's own tree is killed and any reward file test.sh's own reward
commands did not write is discarded (docs/security.md, "Terminal tasks: reward integrity").
"""

from __future__ import annotations

import shlex

from sandbox_server.bundle import SYSTEM_PATH

__all__ = ["GUARD_FAILED", "STRAYS", "guard_script"]

# The processes outside test.sh's tree (`__hermes_strays`, `all`: outside this shell's ancestors) and their SIGKILL
# until none is left (`__hermes_stop_strays`), for the guard and for a task container's STOP_LEFTOVERS; their
# SIGSTOP until none runs (`__hermes_freeze_strays`, a task container's FREEZE_LEFTOVERS) and SIGCONT. The shell
# defines __hermes_own_pid_ns, __hermes_spared, __hermes_any_uid and __hermes_sys first. __hermes_thread_not: a zombie
# leader (its main thread gone alone, SYS_exit) may still have running threads, and SIGKILL to its pid reaches them.
STRAYS = r"""__hermes_thread_not() {
  # Whether a thread of process directory $1 is in a state other than those listed in $2.
  local t k v
  for t in "$1"/task/[0-9]*; do
    while read -r k v _; do
      [ "$k" = State: ] && { case " $2 " in *" $v "*) ;; *) return 0 ;; esac; break; }
    done < "$t/status" 2>/dev/null
  done
  return 1
}
__hermes_strays() {
  # Processes of this uid outside test.sh's process tree (by uid, not /proc ownership, which a
  # non-dumpable process hands to root): whatever the tested code left running. With `all` (test.sh
  # has ended): test.sh's own background jobs too, every process but this shell's ancestors.
  local -; set +eux
  local -A up=() mine=()
  local p k v st pp uid x top=$$
  [ "${1-}" = all ] && top=
  for p in /proc/[0-9]*; do
    st= pp= uid=
    while read -r k v _; do
      case $k in State:) st=$v ;; PPid:) pp=$v ;; Uid:) uid=$v; break ;; esac
    done < "$p/status" 2>/dev/null
    case " $__hermes_spared " in *" ${p#/proc/} "*) continue ;; esac
    # A zombie leader (its main thread gone alone) may still have running threads: those count.
    { [ -n "$__hermes_any_uid" ] || [ "$uid" = "$UID" ]; } && { [ "$st" != Z ] || __hermes_thread_not "$p" Z; } \
      && up[${p#/proc/}]=$pp
  done
  x=$BASHPID
  while [ -n "$x" ]; do mine[$x]=1; x=${up[$x]}; done
  for p in "${!up[@]}"; do
    [ -n "${mine[$p]}" ] && continue
    x=$p
    while [ -n "$x" ] && [ "$x" != "$top" ]; do x=${up[$x]}; done
    [ -z "$x" ] && echo "$p"
  done
  return 0
}
__hermes_stop_strays() {
  local -; set +eux
  local PATH=$__hermes_sys
  local i s
  # Only inside a pid namespace of the trajectory's own (a slot's, whose init is bubblewrap, or a task
  # container's): run anywhere else (as root on a host) this would kill processes that are not the tests'.
  __hermes_own_pid_ns || return 0
  for i in {1..50}; do
    s=$(__hermes_strays "$@")
    [ -z "$s" ] && return 0
    kill -KILL $s 2>/dev/null
  done
  return 1
}
__hermes_stopped() {
  # Every thread of process $1 stopped (T, t) or gone (Z, X), or the process has a SIGSTOP pending (ShdPnd bit
  # 19): it runs no more of its own code, only a system call already under way ends.
  local k v
  while read -r k v _; do
    [ "$k" = ShdPnd: ] && { (( 0x$v & 0x40000 )) && return 0; break; }
  done < "/proc/$1/status" 2>/dev/null
  ! __hermes_thread_not "/proc/$1" "T t Z X"
}
__hermes_freeze_strays() {
  # SIGSTOP every process but pid 1 and this shell's ancestors until a scan finds none still running (a child
  # forked by a system call under way is caught by the next scan).
  local -; set +eux
  local PATH=$__hermes_sys
  local i p left
  __hermes_own_pid_ns || return 0
  for i in {1..50}; do
    left=
    for p in $(__hermes_strays all); do
      __hermes_stopped "$p" && continue
      kill -STOP "$p" 2>/dev/null; left=1
    done
    [ -z "$left" ] && return 0
  done
  return 1
}
__hermes_thaw_strays() {
  local -; set +eux
  local p
  __hermes_own_pid_ns || return 0
  for p in $(__hermes_strays all); do kill -CONT "$p" 2>/dev/null; done
  return 0
}
"""

# Runs test.sh ($0) in this shell with a DEBUG trap (see the module docstring). Each guard
# function starts with `local -; set +eux`: test.sh's own set -e/-u/-x must not apply inside it.
# Exit status 97: processes the tests left could not all be stopped (a fork race), or the tests'
# own files were changed while they ran; no reward.
_GUARD = r"""
__hermes_dir=@REWARD_DIR@
__hermes_manifest=@MANIFEST@
__hermes_chain=(@CHAIN@)
__hermes_pytest=@PYTEST_BOOT@
__hermes_sys=@SYS_PATH@
declare -A __hermes_trusted=()
__hermes_spared= __hermes_any_uid=
@OWN_PID_NS@
__hermes_wrote= __hermes_trapped=
__hermes_named=  # test.sh has a command naming a reward file (else its grader writes it unseen)
__hermes_stat() { local PATH=$__hermes_sys; stat -c '%i:%s:%z' -- "$1" 2>/dev/null; }
__hermes_record() {
  local f
  for f in reward.txt reward.json; do __hermes_trusted[$f]=$(__hermes_stat "$__hermes_dir/$f"); done
}
@STRAYS@__hermes_clean() {
  # Keep only reward files test.sh's own reward commands left; put the directories back.
  local -; set +eux
  local PATH=$__hermes_sys
  local d f
  chmod u+rwx -- "${__hermes_chain[0]}" 2>/dev/null
  for d in "${__hermes_chain[@]:1}"; do
    if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f -- "$d"; fi
    mkdir -p -- "$d" 2>/dev/null; chmod u+rwx -- "$d" 2>/dev/null
  done
  for f in reward.txt reward.json; do
    d=$__hermes_dir/$f
    { [ -e "$d" ] || [ -L "$d" ]; } || continue
    if [ -L "$d" ] || [ ! -f "$d" ] || [ "$(__hermes_stat "$d")" != "${__hermes_trusted[$f]}" ]; then
      rm -rf -- "$d"
    fi
  done
  return 0
}
__hermes_void() { local PATH=$__hermes_sys; rm -rf -- "$__hermes_dir/reward.txt" "$__hermes_dir/reward.json"; exit 97; }
__hermes_final() {
  local rc=$?
  local -; set +eux
  local PATH=$__hermes_sys
  [ "$BASHPID" = "$$" ] || return 0
  [ -n "$__hermes_wrote" ] && __hermes_record
  __hermes_wrote=
  # A server test.sh started and left running would otherwise write after the clean-up below.
  __hermes_stop_strays all || __hermes_void
  # The tests' own files, as packed: code the tests ran may have edited a grader run after it.
  [ -z "$__hermes_manifest" ] || sha256sum --quiet --status -c <<<"$__hermes_manifest" || __hermes_void
  [ -n "$__hermes_named" ] && __hermes_clean
  # Above 128 means "killed by a signal" to the verifying script (a shell the tests SIGKILLed never ran
  # this): a test.sh whose own last status is that high ends with 125 instead.
  [ "$rc" -gt 128 ] && exit 125
  return 0
}
__hermes_keep_exit_trap() {
  # test.sh may set its own EXIT trap: ours then runs after it.
  local -; set +eux
  local cur
  cur=$(trap -p EXIT)
  case $cur in *__hermes_final) return 0 ;; esac
  if [ -z "$cur" ]; then trap __hermes_final EXIT; else eval "set -- $cur"; trap -- "$3"$'
'__hermes_final EXIT; fi
}
__hermes_guard() {
  local -; set +eux
  local PATH=$__hermes_sys
  [ "$BASHPID" = "$$" ] || return 0
  case ${FUNCNAME[1]-} in __hermes_*|python|python3) return 0 ;; esac  # inside our own wrappers
  if [ -n "$__hermes_wrote" ]; then __hermes_record; __hermes_wrote=; fi
  # Only a `trap` command changes the EXIT trap: look at it again after one (no fork per command).
  if [ -n "$__hermes_trapped" ]; then __hermes_keep_exit_trap; __hermes_trapped=; fi
  case $BASH_COMMAND in trap\ *|builtin\ trap\ *) __hermes_trapped=1 ;; esac
  case $BASH_COMMAND in *reward.txt*|*reward.json*) ;; *) return 0 ;; esac
  __hermes_stop_strays || __hermes_void
  [ -z "$__hermes_manifest" ] || sha256sum --quiet --status -c <<<"$__hermes_manifest" || __hermes_void
  __hermes_clean
  __hermes_wrote=1 __hermes_named=1
}
__hermes_python() {
  local exe=$1; shift
  if [ -n "$__hermes_pytest" ] && [ "$1" = -m ] && [ "$2" = pytest ]; then shift 2; command "$exe" -c "$__hermes_pytest" "$@"
  else command "$exe" "$@"; fi
}
python3() { __hermes_python python3 "$@"; }
python() { __hermes_python python "$@"; }
set -T
trap __hermes_final EXIT
trap __hermes_guard DEBUG
@START@
. "$0"
__hermes_rc=$?
trap - DEBUG
__hermes_keep_exit_trap
exit $__hermes_rc
"""
GUARD_FAILED = 97


def guard_script(
    *, reward_dir: str, chain: list[str], pytest_boot: str, manifest: str, own_pid_ns: str, start: str = ""
) -> str:
    """_GUARD for one run: `chain` the reward directory and its parents (the first only made writable again),
    `pytest_boot` '' to leave `python3 -m pytest` as it is, `manifest` '' to check the tests' files elsewhere,
    `own_pid_ns` shell code defining __hermes_own_pid_ns (and which processes to spare, of which uids), `start`
    shell code run once the guard's traps are set, just before test.sh."""
    return (
        _GUARD.replace("@REWARD_DIR@", shlex.quote(reward_dir))
        .replace("@CHAIN@", " ".join(shlex.quote(d) for d in chain))
        .replace("@PYTEST_BOOT@", shlex.quote(pytest_boot))
        .replace("@MANIFEST@", shlex.quote(manifest))
        .replace("@SYS_PATH@", SYSTEM_PATH)
        .replace("@OWN_PID_NS@", own_pid_ns)
        .replace("@STRAYS@", STRAYS)
        .replace("@START@", start)
    )
