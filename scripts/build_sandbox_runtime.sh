#!/usr/bin/env bash
# Builds the self-contained sandbox runtime (backends/runtime.py) into OUT (default build/hermes-runtime):
#
#   sandbox-server   static launcher: the runtime's Python running `-m sandbox_server` (same CLI)
#   bwrap            static launcher: Debian's bubblewrap with the runtime's libraries
#   hermes-spawn     static uid, limits and syscall-filter helper (sandbox_server/spawn_helper.c, syscall_filter.h)
#   hermes-confine.so  the exec confinement library bound into every slot command (sandbox_server/exec_confine.c)
#   lib/             the dynamic loader and every library the above need (glibc included)
#   python/          Debian's python3.11, its standard library (trimmed), aiohttp/pydantic/uvloop, sandbox_server
#   libexec/bwrap    Debian's bubblewrap
#   manifest.json    what went in (inputs' hash, versions)
#
# No Python, package or libc of the image it runs in is used, and nothing is unpacked at run time
# (the directory is mounted read-only; a frozen single binary would unpack ~40 MB into $TMPDIR
# for every slot's exec server). Rebuilt only when its inputs change (their hash in manifest.json).
#
#   bash scripts/build_sandbox_runtime.sh [OUT]
#
# Needs (scripts/setup.sh installs them): Debian's python3.11 with venv (/usr/bin/python3.11),
# bubblewrap, gcc + libc6-dev (static), and PyPI for aiohttp/pydantic/uvloop.
set -euo pipefail
OUT=$(realpath -m "${1:-$(dirname "$0")/../build/hermes-runtime}")  # OUT as given, from where we were called
cd "$(dirname "$0")/.."
PY=/usr/bin/python3.11  # Debian's: relocatable (libpython linked in, no RUNPATH)
BWRAP=$(command -v bwrap || true)
[ -x "$PY" ] || { echo "[runtime] $PY missing: apt-get install python3.11 python3.11-venv" >&2; exit 2; }
[ -n "$BWRAP" ] || { echo "[runtime] bwrap missing: apt-get install bubblewrap" >&2; exit 2; }
command -v cc >/dev/null || { echo "[runtime] cc missing: apt-get install gcc libc6-dev" >&2; exit 2; }

mkdir -p "$(dirname "$OUT")"
exec 9>"$OUT.lock"
flock 9  # one build at a time (a test session's fixture, setup.sh)

# The inputs: this script, sandbox_server's sources and requirements, the interpreter and bwrap.
hash=$(
  {
    sha256sum scripts/build_sandbox_runtime.sh sandbox_server/*.py sandbox_server/*.c sandbox_server/*.h sandbox_server/*.sh sandbox_server/requirements.txt
    sha256sum "$PY" "$BWRAP"
  } | sha256sum | cut -c1-16
)
if [ -f "$OUT/manifest.json" ] && grep -q "\"inputs\": \"$hash\"" "$OUT/manifest.json" \
  && [ -x "$OUT/sandbox-server" ] && [ -x "$OUT/bwrap" ] && [ -x "$OUT/hermes-spawn" ] && [ -f "$OUT/hermes-confine.so" ]; then
  echo "[runtime] $OUT is up to date ($hash)"
  exit 0
fi
echo "[runtime] building $OUT ($hash)"
start=$(date +%s)

VENV=.venv-runtime  # only pip lives here; the packages go straight into the runtime
[ -x "$VENV/bin/pip" ] || "$PY" -m venv "$VENV"

stage="$OUT.tmp.$$"
trap 'rm -rf "$stage"' EXIT
rm -rf "$stage"
mkdir -p "$stage/lib" "$stage/libexec" "$stage/python/bin"
ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
stdlib=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
dynload=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("platstdlib"))')/lib-dynload
[ -d "$dynload" ] || dynload=$("$PY" -c 'import _json, os; print(os.path.dirname(_json.__file__))')
dest="$stage/python/lib/python$ver"

# The standard library without what a server never imports (tests, GUIs, build files, installers).
tar -C "$stdlib" -c \
  --exclude=./test --exclude=./idlelib --exclude=./tkinter --exclude=./turtledemo --exclude=./lib2to3 \
  --exclude=./ensurepip --exclude=./distutils --exclude=./pydoc_data --exclude='./config-*' \
  --exclude=./site-packages --exclude=./dist-packages --exclude=./lib-dynload --exclude='__pycache__' \
  --exclude=./EXTERNALLY-MANAGED . | tar -C "$(mkdir -p "$dest" && echo "$dest")" -x
mkdir -p "$dest/lib-dynload"
for so in "$dynload"/*.so; do
  case $(basename "$so") in
    # Never imported by the server: tests, terminals, databases, audio, CJK codecs, compressors other
    # than zlib, OpenSSL's hashes (hashlib falls back to its built-in ones). _ssl stays: uvloop imports
    # ssl, though the server serves plain HTTP.
    _test* | _xx* | xxlimited* | _ctypes_test* | _curses* | readline* | _dbm* | _gdbm* | nis* | ossaudiodev* \
      | _tkinter* | _sqlite3* | _codecs_* | _multibytecodec* | audioop* | _bz2* | _lzma* | _crypt* \
      | _hashlib* | _uuid*) ;;
    *) cp "$so" "$dest/lib-dynload/" ;;
  esac
done
cp "$PY" "$stage/python/bin/python3"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-compile --target "$dest" -r sandbox_server/requirements.txt \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2 || true)
rm -rf "$dest"/bin
find "$dest" -type f \( -name '*.c' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.h' -o -name '*.pyi' \) -delete
# Wheels ship their extensions with debug symbols (uvloop's: 13 MB, 1.6 MB stripped).
find "$dest" -type f -name '*.so' -exec strip --strip-unneeded {} +
mkdir -p "$dest/sandbox_server"
cp sandbox_server/*.py "$dest/sandbox_server/"
# Bytecode that never checks its source's time: a read-only runtime could not rewrite stale .pyc,
# and a COPY into an image changes files' times.
"$PY" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$dest" >/dev/null

cp "$BWRAP" "$stage/libexec/bwrap"
# Every shared library of the interpreter, its extension modules and bwrap, and the loader itself.
loader=""
while read -r name path; do
  case $name in
    */ld-linux*) loader=$name ;;
    *) [ -n "$path" ] && [ ! -e "$stage/lib/$name" ] && cp -L "$path" "$stage/lib/$name" ;;
  esac
done < <(
  find "$stage/python" "$stage/libexec" -type f \( -name '*.so' -o -name '*.so.*' -o -path '*/bin/*' -o -path '*/libexec/*' \) \
    -exec ldd {} \; 2>/dev/null \
    | awk '/=> \// {print $1, $3} /^\t\/.*ld-linux/ {print $1, ""}' | sort -u
)
[ -n "$loader" ] || { echo "[runtime] could not find the dynamic loader in ldd's output" >&2; exit 1; }
loader_name=$(basename "$loader")
cp -L "$loader" "$stage/lib/$loader_name"

cc -O2 -Wall -static -DPYTHON_SERVER -DLOADER="\"$loader_name\"" -o "$stage/sandbox-server" sandbox_server/runtime_launcher.c
cc -O2 -Wall -static -DTARGET='"libexec/bwrap"' -DLOADER="\"$loader_name\"" -o "$stage/bwrap" sandbox_server/runtime_launcher.c
bash sandbox_server/build_spawn_helper.sh "$stage/hermes-spawn"
bash sandbox_server/build_exec_confine.sh "$stage/hermes-confine.so"
strip "$stage/sandbox-server" "$stage/bwrap" 2>/dev/null || true

cat >"$stage/manifest.json" <<EOF
{"inputs": "$hash", "python": "$("$PY" -c 'import platform; print(platform.python_version())')", "bwrap": "$("$BWRAP" --version | awk '{print $2}')", "loader": "$loader_name", "arch": "$(uname -m)"}
EOF
# It must run before it is handed out.
"$stage/sandbox-server" --help >/dev/null
"$stage/bwrap" --version >/dev/null
chmod -R a+rX,go-w "$stage"
# The previous build moves aside rather than away: containers started on it have it bind-mounted
# and keep working until the next build.
rm -rf "$OUT.prev"
[ -e "$OUT" ] && mv "$OUT" "$OUT.prev"
mv "$stage" "$OUT"
trap - EXIT
echo "[runtime] built $OUT in $(($(date +%s) - start)) s ($(du -sh "$OUT" | cut -f1))"
