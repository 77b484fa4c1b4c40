/* Opening input files: anything but a regular file is refused before it could block. */
#ifndef TOKPIPE_BASE_FILE_H
#define TOKPIPE_BASE_FILE_H

#include <stddef.h>
#include <stdio.h>

/* ---- input files (base/file.c) ----
 * Every reader opens its inputs through these: anything but a regular file (a FIFO, a
 * directory, a device) is refused before it could block. On failure they return -1/NULL
 * and say why in why[] ("No such file or directory", "not a regular file: it is a FIFO"). */
int tp_open_input(const char *path, char *why, size_t why_size);
FILE *tp_fopen_input(const char *path, char *why, size_t why_size);
/* The whole file, malloc'ed, NUL-terminated after its *size bytes. */
char *tp_read_input(const char *path, size_t *size, char *why, size_t why_size);
/* The folder part of a path, malloc'ed: "a/b/c" -> "a/b", "/c" -> "/", "c" -> ".". */
char *tp_folder_of(const char *path);

#endif
