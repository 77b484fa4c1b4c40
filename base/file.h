/* Opening input files: anything but a regular file is refused before it could block. */
#ifndef TOKPIPE_BASE_FILE_H
#define TOKPIPE_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- input files (base/file.c) ----
 * Every reader opens its inputs through these: anything but a regular file (a FIFO, a
 * directory, a device) is refused before it could block. On failure they return -1/NULL
 * and say why in why[] ("No such file or directory", "not a regular file: it is a FIFO"). */
int tp_open_input(const char *path, char *why, size_t why_size);
FILE *tp_fopen_input(const char *path, char *why, size_t why_size);
/* The whole file, malloc'ed, NUL-terminated after its *size bytes. */
char *tp_read_input(const char *path, size_t *size, char *why, size_t why_size);
/* A whole input file mapped read-only: nothing is read until used. */
typedef struct {
  uint64_t start, end;
} TpExtent;
typedef struct {
  const uint8_t *base; /* the bytes ("" when the file is empty) */
  size_t size;
  void *map_base; /* what tp_unmap_input unmaps, or NULL */
  size_t map_size;
  /* A sparse file's written extents [start, end), sorted (malloc'ed; at most 1024, the
   * last one then running to the end): the bytes between them are holes, zeros that were
   * never written. holes false: every byte is written (or the file system cannot say). */
  bool holes;
  TpExtent *written;
  int nwritten;
} TpFileMap;
/* Do bytes [offset, offset + bytes) of f lie in its holes (zeros, known without reading)? */
bool tp_file_map_unwritten(const TpFileMap *f, uint64_t offset, uint64_t bytes);
/* Maps the file at path (refused as tp_open_input does); -1 with why[] on failure. */
int tp_map_input(const char *path, TpFileMap *out, char *why, size_t why_size);
/* The same for file `name` of folder `dir`, which must stay inside it: not absolute, no
 * '..', no symlink leading out (how ONNX external data and textual IR blobs name files;
 * `folder` says which folder in the reasons). -1 with why[] completing "the file 'name' ...":
 * "is an absolute path", "leaves FOLDER", "resolves outside FOLDER", "cannot be opened: ...". */
int tp_map_in_folder(const char *dir, const char *name, const char *folder, TpFileMap *out, char *why,
                     size_t why_size);
void tp_unmap_input(TpFileMap *f);
/* The folder part of a path, malloc'ed: "a/b/c" -> "a/b", "/c" -> "/", "c" -> ".". */
char *tp_folder_of(const char *path);

#endif
