/* Files written all-or-nothing: the bytes go to PATH.tmp, which is synced and renamed over
 * PATH (then the folder is synced), so a crash or kill at any point leaves either the old
 * file or the new one, never a half-written one. */
#ifndef TOKPIPE_TRAIN_ATOMIC_H
#define TOKPIPE_TRAIN_ATOMIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "../../ir/ir.h"

typedef struct {
  FILE *f;
  char *path, *tmp;
  int err;        /* first errno of a failed write, 0 if none */
  bool kill_half; /* test hook: keep half the bytes, then SIGKILL the process in commit */
} TpAtomicFile;

/* Creates PATH.tmp; an error names PATH. */
int tp_atomic_open(TpAtomicFile *a, const char *path, TpDiag *d);
/* Appends bytes; errors are reported by tp_atomic_commit. */
void tp_atomic_write(TpAtomicFile *a, const void *data, size_t size);
/* Syncs and renames into place; on any error removes the temporary and reports. */
int tp_atomic_commit(TpAtomicFile *a, TpDiag *d);
/* Drops the temporary (after an error of the caller's own). */
void tp_atomic_abort(TpAtomicFile *a);

/* The whole of `data` as PATH, atomically. */
int tp_write_file_atomic(const char *path, const void *data, size_t size, TpDiag *d);

/* Whether a file could be created at PATH: its folder exists and is writable. Checked
 * before long work so that a bad output path fails at once. */
int tp_check_writable(const char *path, const char *what, TpDiag *d);

#endif
