#include "atomic.h"
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* 8 random letters and digits; only the names must differ between writers (O_EXCL refuses
 * an existing one, link or not), so a weak source is good enough when getrandom fails. */
static void random_suffix(char *out) {
  static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[8];
  if (getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != (ssize_t)sizeof bytes) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_sec;
    memcpy(bytes, &x, sizeof bytes);
  }
  for (size_t i = 0; i < sizeof bytes; i++) out[i] = chars[bytes[i] % (sizeof chars - 1)];
  out[sizeof bytes] = 0;
}

int tp_atomic_open(TpAtomicFile *a, const char *path, TpDiag *d) {
  memset(a, 0, sizeof *a);
  struct stat st; /* the rename would replace a device or FIFO (as root, /dev/null itself) */
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return tp_error(d, "cannot write '%s': %s", path,
                    S_ISDIR(st.st_mode) ? strerror(EISDIR) : "it exists and is not a regular file");
  size_t n = strlen(path) + sizeof ".tmp.XXXXXXXX";
  a->path = strdup(path);
  a->tmp = malloc(n);
  TP_ASSERT(a->path && a->tmp);
  int fd = -1, err = EEXIST;
  for (int tries = 0; fd < 0 && err == EEXIST && tries < 100; tries++) {
    char suffix[9];
    random_suffix(suffix);
    snprintf(a->tmp, n, "%s.tmp.%s", path, suffix);
    /* a fresh file, never one planted there (a link to follow, or another writer's) */
    fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    err = fd < 0 ? errno : 0;
  }
  if (fd >= 0 && !(a->f = fdopen(fd, "wb"))) {
    err = errno;
    close(fd);
    unlink(a->tmp);
  }
  if (!a->f) {
    int rc = tp_error(d, "cannot write '%s': %s", path, strerror(err));
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
  char *dir = tp_folder_of(path);
  int fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd); /* best effort: some file systems refuse it */
    close(fd);
  }
  free(dir);
}

int tp_atomic_commit(TpAtomicFile *a, TpDiag *d) {
  if (!a->err && (fflush(a->f) != 0 || ferror(a->f))) a->err = errno ? errno : EIO;
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

int tp_write_file_atomic(const char *path, const void *data, size_t size, TpDiag *d) {
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, d);
  if (rc) return rc;
  tp_atomic_write(&a, data, size);
  return tp_atomic_commit(&a, d);
}

int tp_check_folder_writable(const char *path, const char *what, TpDiag *d) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return tp_error(d, "%s '%s' is a folder", what, path);
  char *dir = tp_folder_of(path);
  int rc = TP_OK;
  if (stat(dir, &st) != 0) rc = tp_error(d, "%s '%s': folder '%s': %s", what, path, dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode)) rc = tp_error(d, "%s '%s': '%s' is not a folder", what, path, dir);
  else if (access(dir, W_OK | X_OK) != 0)
    rc = tp_error(d, "%s '%s': folder '%s' is not writable: %s", what, path, dir, strerror(errno));
  free(dir);
  return rc;
}

int tp_check_writable(const char *path, const char *what, TpDiag *d) {
  struct stat st; /* as tp_atomic_open will refuse it, but before the long work */
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return tp_error(d, "%s '%s' exists and is not a regular file", what, path);
  return tp_check_folder_writable(path, what, d);
}

/* tp_lock_path and tp_lock_path_shared: flock (exclusive or shared) of PATH.lock. */
static int lock_path(TpPathLock *l, const char *path, const char *what, bool shared, TpDiag *d) {
  memset(l, 0, sizeof *l);
  size_t n = strlen(path) + sizeof ".lock";
  char *lock = malloc(n);
  TP_ASSERT(lock);
  snprintf(lock, n, "%s.lock", path);
  for (;;) {
    int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    /* a reader in a folder it cannot write: open what is there; nothing there (or no
     * folder: the reader's own error says so), no writer has it (a writer creates it) */
    if (fd < 0 && shared && (errno == EACCES || errno == EROFS || errno == ENOENT)) {
      if (errno != ENOENT) fd = open(lock, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) {
        free(lock);
        return TP_OK;
      }
    }
    if (fd < 0) {
      int rc = tp_error(d, "%s '%s': cannot create the lock file '%s': %s", what, path, lock, strerror(errno));
      free(lock);
      return rc;
    }
    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
      int err = errno,
          rc = err == EWOULDBLOCK
                   ? tp_error(d,
                              shared
                                  ? "%s '%s' is being written by another process (it holds '%s')"
                                  : "%s '%s' is in use by another process, which writes or reads it (it holds '%s')",
                              what, path, lock)
                   : tp_error(d, "%s '%s': cannot lock '%s': %s", what, path, lock, strerror(err));
      close(fd);
      free(lock);
      return rc;
    }
    /* The holder before us may have removed the file after we opened it: then our lock
     * is on a file nobody else sees, so lock the one now at the path instead. */
    struct stat mine, now;
    if (fstat(fd, &mine) == 0 && lstat(lock, &now) == 0 && mine.st_dev == now.st_dev && mine.st_ino == now.st_ino) {
      l->fd = fd;
      l->lock_path = lock;
      return TP_OK;
    }
    close(fd);
  }
}

int tp_lock_path(TpPathLock *l, const char *path, const char *what, TpDiag *d) {
  return lock_path(l, path, what, false, d);
}

int tp_lock_path_shared(TpPathLock *l, const char *path, const char *what, TpDiag *d) {
  return lock_path(l, path, what, true, d);
}

void tp_unlock_path(TpPathLock *l) {
  if (!l->lock_path) return;
  /* Removed while held exclusively, so no one locks the removed file and believes it; a
   * shared lock that other readers hold too leaves the file to the last of them. */
  if (flock(l->fd, LOCK_EX | LOCK_NB) == 0) unlink(l->lock_path);
  close(l->fd);
  free(l->lock_path);
  memset(l, 0, sizeof *l);
}
