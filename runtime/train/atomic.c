#include "atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *folder_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = strdup(!slash ? "." : slash == path ? "/" : path);
  TP_ASSERT(dir);
  if (slash && slash != path) dir[slash - path] = 0;
  return dir;
}

int tp_atomic_open(TpAtomicFile *a, const char *path, TpDiag *d) {
  memset(a, 0, sizeof *a);
  size_t n = strlen(path);
  a->path = strdup(path);
  a->tmp = malloc(n + 5);
  TP_ASSERT(a->path && a->tmp);
  memcpy(a->tmp, path, n);
  memcpy(a->tmp + n, ".tmp", 5);
  a->f = fopen(a->tmp, "wb");
  if (!a->f) {
    int rc = tp_error(d, "cannot write '%s': %s", path, strerror(errno));
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
    return rc;
  }
  return TP_OK;
}

void tp_atomic_write(TpAtomicFile *a, const void *data, size_t size) {
  if (!a->err && size && fwrite(data, 1, size, a->f) != size) a->err = errno ? errno : EIO;
}

/* The folder entry of a rename is durable only once the folder itself is synced. */
static void sync_folder(const char *path) {
  char *dir = folder_of(path);
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd); /* best effort: some file systems refuse it */
    close(fd);
  }
  free(dir);
}

int tp_atomic_commit(TpAtomicFile *a, TpDiag *d) {
  if (!a->err && fflush(a->f) != 0) a->err = errno;
  if (a->kill_half) { /* the test of an interrupted write: a partial temporary, no rename */
    long size = ftell(a->f);
    if (ftruncate(fileno(a->f), size / 2) == 0) fsync(fileno(a->f));
    raise(SIGKILL);
  }
  if (!a->err && fsync(fileno(a->f)) != 0) a->err = errno;
  if (fclose(a->f) != 0 && !a->err) a->err = errno;
  a->f = NULL;
  if (!a->err && rename(a->tmp, a->path) != 0) a->err = errno;
  int rc = TP_OK;
  if (a->err) {
    unlink(a->tmp);
    rc = tp_error(d, "cannot write '%s': %s", a->path, strerror(a->err));
  } else {
    sync_folder(a->path);
  }
  free(a->path);
  free(a->tmp);
  memset(a, 0, sizeof *a);
  return rc;
}

void tp_atomic_abort(TpAtomicFile *a) {
  if (a->f) fclose(a->f);
  if (a->tmp) unlink(a->tmp);
  free(a->path);
  free(a->tmp);
  memset(a, 0, sizeof *a);
}

int tp_write_file_atomic(const char *path, const void *data, size_t size, TpDiag *d) {
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, d);
  if (rc) return rc;
  tp_atomic_write(&a, data, size);
  return tp_atomic_commit(&a, d);
}

int tp_check_writable(const char *path, const char *what, TpDiag *d) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return tp_error(d, "%s '%s' is a folder", what, path);
  char *dir = folder_of(path);
  int rc = TP_OK;
  if (stat(dir, &st) != 0)
    rc = tp_error(d, "%s '%s': folder '%s': %s", what, path, dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    rc = tp_error(d, "%s '%s': '%s' is not a folder", what, path, dir);
  else if (access(dir, W_OK) != 0)
    rc = tp_error(d, "%s '%s': folder '%s' is not writable: %s", what, path, dir, strerror(errno));
  free(dir);
  return rc;
}
