#define _GNU_SOURCE /* SEEK_DATA, SEEK_HOLE */
/* Reading input files: one place that refuses what is not a regular file before anything
 * can block on it (a FIFO, a terminal, a device), so every reader gets the same rule. */
#include "file.h"
#include "diag.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* f's written extents, from the file system (SEEK_DATA, SEEK_HOLE): a file whose weights
 * were never written (a sparse external-data file of a model exported to plan) is then
 * known to hold zeros without a page of it being read. */
static void find_holes(int fd, TpFileMap *f) {
  enum { MAX_EXTENTS = 1024 };
  off_t size = (off_t)f->size, hole = lseek(fd, 0, SEEK_HOLE);
  if (hole < 0 || hole >= size) return; /* no hole, or no way to ask */
  f->written = malloc(MAX_EXTENTS * sizeof *f->written);
  TP_ASSERT(f->written);
  f->holes = true;
  for (off_t at = 0; at < size && f->nwritten < MAX_EXTENTS;) {
    off_t start = lseek(fd, at, SEEK_DATA);
    if (start < 0 && errno == ENXIO) break; /* holes to the end */
    off_t end = start < 0 || f->nwritten + 1 == MAX_EXTENTS ? size : lseek(fd, start, SEEK_HOLE);
    if (start < 0 || end < 0) start = at, end = size; /* the file system stopped answering */
    f->written[f->nwritten++] = (TpExtent){(uint64_t)start, (uint64_t)end};
    at = end;
  }
}

bool tp_file_map_unwritten(const TpFileMap *f, uint64_t offset, uint64_t bytes) {
  if (!f->holes || offset > f->size || bytes > f->size - offset) return false;
  for (int i = 0; i < f->nwritten; i++)
    if (f->written[i].start < offset + bytes && offset < f->written[i].end) return false;
  return true;
}

int tp_map_input(const char *path, TpFileMap *out, char *why, size_t why_size) {
  *out = (TpFileMap){.base = (const uint8_t *)""};
  int fd = tp_open_input(path, why, why_size); /* a FIFO is refused, not waited on */
  struct stat st;
  if (fd < 0) return -1;
  if (fstat(fd, &st) != 0) {
    snprintf(why, why_size, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      snprintf(why, why_size, "%s", strerror(errno));
      close(fd);
      return -1;
    }
    *out = (TpFileMap){.base = p, .size = (size_t)st.st_size, .map_base = p, .map_size = (size_t)st.st_size};
    find_holes(fd, out);
  }
  close(fd);
  return 0;
}

int tp_map_in_folder(const char *dir, const char *name, const char *folder, TpFileMap *out, char *why,
                     size_t why_size) {
  if (name[0] == '/') {
    snprintf(why, why_size, "is an absolute path");
    return -1;
  }
  for (const char *s = name; *s;) {
    size_t n = strcspn(s, "/\\");
    if (n == 2 && s[0] == '.' && s[1] == '.') {
      snprintf(why, why_size, "leaves %s", folder);
      return -1;
    }
    s += n;
    if (*s) s++;
  }
  size_t plen = strlen(dir) + strlen(name) + 2;
  char *path = malloc(plen);
  TP_ASSERT(path);
  snprintf(path, plen, "%s/%s", dir, name);
  /* no symlink may lead out of the folder */
  char *dir_real = realpath(dir, NULL), *real = dir_real ? realpath(path, NULL) : NULL;
  int rc = -1;
  char reason[200];
  if (!real) {
    snprintf(why, why_size, "cannot be opened: %s", strerror(errno));
  } else {
    size_t dl = strlen(dir_real);
    if (strncmp(real, dir_real, dl) != 0 || (real[dl] != '/' && dl != 1)) /* dl 1: the folder is "/" */
      snprintf(why, why_size, "resolves outside %s", folder);
    else if ((rc = tp_map_input(real, out, reason, sizeof reason)) <
             0) /* the path checked, not one swapped in since */
      snprintf(why, why_size, "cannot be opened: %s", reason);
  }
  free(path);
  free(dir_real);
  free(real);
  return rc;
}

void tp_unmap_input(TpFileMap *f) {
  if (f->map_base) munmap(f->map_base, f->map_size);
  free(f->written);
  *f = (TpFileMap){.base = (const uint8_t *)""};
}

char *tp_folder_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = !slash ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
  TP_ASSERT(dir);
  return dir;
}
