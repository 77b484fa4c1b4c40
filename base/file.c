/* Reading input files: one place that refuses what is not a regular file before anything
 * can block on it (a FIFO, a terminal, a device), so every reader gets the same rule. */
#include "file.h"
#include "diag.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int tp_open_input(const char *path, char *why, size_t why_size) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, why_size, "%s", strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, why_size, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    const char *kind = file_kind(st.st_mode);
    snprintf(why, why_size, "%s%s", strcmp(kind, "not a regular file") ? "not a regular file: it is " : "", kind);
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    snprintf(why, why_size, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

FILE *tp_fopen_input(const char *path, char *why, size_t why_size) {
  int fd = tp_open_input(path, why, why_size);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    snprintf(why, why_size, "%s", strerror(errno));
    close(fd);
  }
  return f;
}

char *tp_read_input(const char *path, size_t *size, char *why, size_t why_size) {
  *size = 0;
  FILE *f = tp_fopen_input(path, why, why_size);
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      char *grown = cap <= SIZE_MAX / 4 ? realloc(buf, cap * 2 + 1) : NULL;
      if (!grown) free(buf);
      buf = grown;
      cap *= 2;
    }
  }
  if (!buf) {
    snprintf(why, why_size, "out of memory reading the file");
  } else if (ferror(f)) {
    snprintf(why, why_size, "read error: %s", strerror(errno));
    free(buf);
    buf = NULL;
  } else {
    buf[n] = 0;
    *size = n;
  }
  fclose(f);
  return buf;
}

char *tp_folder_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = !slash ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
  TP_ASSERT(dir);
  return dir;
}
