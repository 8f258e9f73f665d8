/* The entry points of the self-contained sandbox runtime (scripts/build_sandbox_runtime.sh).

   The runtime directory holds its own dynamic loader and libraries (lib/), a Python with
   sandbox_server and its packages (python/) and Debian's bubblewrap (libexec/). An image's own
   loader and libc are never used: this static launcher execs the runtime's loader on the real
   program with the runtime's libraries, so the same directory runs in any x86-64/arm64 image,
   with or without glibc or Python. Nothing is unpacked and nothing is written.

   Built once per entry point: -DPYTHON_SERVER (sandbox-server: `python/bin/python3 -I -S -B -X
   hermes_runtime=DIR -m sandbox_server ARGS`) or -DTARGET='"libexec/bwrap"' (bwrap), with
   -DLOADER='"<the loader's file name>"'. The loader's --library-path is not inherited: what the
   program execs (bash, the image's tools) uses the image's own libraries. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if !defined(TARGET) && !defined(PYTHON_SERVER)
#error "build with -DPYTHON_SERVER or -DTARGET=..."
#endif
#ifndef LOADER
#error "build with -DLOADER=..."
#endif

static char *concat(const char *a, const char *sep, const char *b) {
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *s = malloc(n);
    if (s == NULL) {
        perror("hermes runtime");
        exit(127);
    }
    snprintf(s, n, "%s%s%s", a, sep, b);
    return s;
}

int main(int argc, char **argv) {
    char dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
        fprintf(stderr, "hermes runtime: cannot read /proc/self/exe (is /proc mounted?)\n");
        return 127;
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return 127;
    *slash = '\0';
    char *lib = concat(dir, "/", "lib");
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (args == NULL) return 127;
    int i = 0;
    args[i++] = concat(lib, "/", LOADER);
    args[i++] = "--library-path";
    args[i++] = lib;
#ifdef PYTHON_SERVER
    args[i++] = concat(dir, "/", "python/bin/python3");
    args[i++] = "-I"; /* no environment variable, user site or current directory changes what runs */
    args[i++] = "-S";
    args[i++] = "-B";
    args[i++] = "-X";
    args[i++] = concat("hermes_runtime=", "", dir);
    args[i++] = "-m";
    args[i++] = "sandbox_server";
#else
    args[i++] = concat(dir, "/", TARGET);
#endif
    for (int k = 1; k < argc; k++) args[i++] = argv[k];
    args[i] = NULL;
    execv(args[0], args);
    fprintf(stderr, "hermes runtime: cannot exec %s: ", args[0]);
    perror(NULL);
    return 127;
}
