"""A filesystem without fallocate, for the real aria2c: a preload shim that refuses fallocate and posix_fallocate
with EOPNOTSUPP (what ZFS before 2.2, NFSv3 and many FUSE mounts answer), compiled with the machine's C compiler
at test time. aria2c (--file-allocation=prealloc, its default) then writes the whole file with zeros, at disk
speed, and makes its control file only once they are flushed (measured with aria2 1.36.0: "Allocating disk
space" said, 2 GiB of zeros in 10 s, an fsync of 1 s, then the control file).

``NOFALLOC_FSYNC_S`` in the environment makes each fsync of a file of 1 MiB or more take that much longer, as the
flush of gigabytes of fresh zeros does on a slow disk (NFS, ZFS): the stretch where the file is whole, quiet, and
has no control file yet. The control file's own fsync (a few bytes) is not slowed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int fallocate(int fd, int mode, off_t offset, off_t len) {
    (void)fd; (void)mode; (void)offset; (void)len;
    errno = EOPNOTSUPP;
    return -1;
}
int fallocate64(int fd, int mode, off_t offset, off_t len) { return fallocate(fd, mode, offset, len); }
int posix_fallocate(int fd, off_t offset, off_t len) { (void)fd; (void)offset; (void)len; return EOPNOTSUPP; }
int posix_fallocate64(int fd, off_t offset, off_t len) { return posix_fallocate(fd, offset, len); }

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *delay = getenv("NOFALLOC_FSYNC_S");
    struct stat st;
    if (delay && *delay && fstat(fd, &st) == 0 && st.st_size >= (1 << 20)) {
        double s = atof(delay);
        struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        nanosleep(&t, NULL);
    }
    return real(fd);
}
"""


def nofalloc_shim(where: Path) -> Path:
    """The shim built in ``where`` (its path, for LD_PRELOAD); the test is skipped, saying why, where it cannot be."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the shim that refuses fallocate")
    source, shim = where / "nofalloc.c", where / "nofalloc.so"
    source.write_text(SOURCE)
    built = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(source), "-ldl"],
                           capture_output=True, text=True, timeout=60)
    if built.returncode != 0:
        pytest.skip(f"the shim that refuses fallocate did not build: {built.stderr.strip()[-500:]}")
    return shim
