/* An LD_PRELOAD shim for the process-level tests: fdatasync on a file whose path ends with
 * FAILSYNC_SUFFIX (".seg" by default) fails with EIO, once, each time the file named by
 * FAILSYNC_TRIGGER appears. The failing call does not reach the kernel, so the test sees how the
 * broker handles the error, and the file's pages stay dirty (a later real sync writes them):
 * their records' outcome is unknown. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_chosen(int fd) {
    char link[64];
    char target[4096];
    const char *suffix = getenv("FAILSYNC_SUFFIX");
    if (!suffix) {
        suffix = ".seg";
    }
    size_t suffix_length = strlen(suffix);
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length < (ssize_t)suffix_length) {
        return 0;
    }
    target[length] = 0;
    return strcmp(target + length - suffix_length, suffix) == 0;
}

int fdatasync(int fd) {
    static int (*real_fdatasync)(int) = 0;
    if (!real_fdatasync) {
        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    const char *trigger = getenv("FAILSYNC_TRIGGER");
    /* unlink succeeds for exactly one caller: one failure per trigger. */
    if (trigger && is_chosen(fd) && unlink(trigger) == 0) {
        errno = EIO;
        return -1;
    }
    return real_fdatasync(fd);
}
