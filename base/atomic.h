/* Files written all-or-nothing: the bytes go to a temporary PATH.tmp.XXXXXXXX of a fresh
 * random name in PATH's folder, created exclusively (never an existing file, never through
 * a symbolic link), which is synced and renamed over PATH (then the folder is synced). A
 * crash or kill at any point leaves either the old file or the new one, never a half-written
 * one, and two processes writing one PATH each write their own temporary: the last rename
 * wins, whole. Also a lock on a path against a second writing process. The one writer of
 * output files for the trainer, tokpipe-tokens and the tools (tools/cli.c). */
#ifndef TOKPIPE_TRAIN_ATOMIC_H
#define TOKPIPE_TRAIN_ATOMIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "diag.h"

typedef struct {
  FILE *f; /* the temporary; callers may also fprintf to it */
  char *path, *tmp;
  int err;        /* first errno of a failed write, 0 if none */
  bool kill_half; /* test hook: keep half the bytes, then SIGKILL the process in commit */
} TpAtomicFile;

/* Creates the temporary; an error names PATH. A PATH that exists and is not a regular file
 * (a device, a FIFO, a folder; through a link too) is refused: the rename would replace it. */
int tp_atomic_open(TpAtomicFile *a, const char *path, TpDiag *d);
/* Appends bytes; errors are reported by tp_atomic_commit. */
void tp_atomic_write(TpAtomicFile *a, const void *data, size_t size);
/* Syncs and renames into place; on any error (a failed write or fprintf included) removes
 * the temporary and reports. */
int tp_atomic_commit(TpAtomicFile *a, TpDiag *d);

/* The whole of `data` as PATH, atomically. */
int tp_write_file_atomic(const char *path, const void *data, size_t size, TpDiag *d);

/* Whether tp_atomic_open could write PATH: not a folder, nor an existing file that is not
 * a regular one (a FIFO, a device), in a folder that exists and is writable. Checked before
 * long work so that a bad output path fails at once; errors name `what` ("--exe"). */
int tp_check_writable(const char *path, const char *what, TpDiag *d);
/* The same but for the existing file's kind, for outputs written in place (--log may be a
 * FIFO that someone reads). */
int tp_check_folder_writable(const char *path, const char *what, TpDiag *d);

/* An exclusive lock of PATH against other processes: flock on PATH.lock (created, never
 * through a link), held until tp_unlock_path, which removes the lock file. A lock held by
 * another process is one error naming `what` and PATH. */
typedef struct {
  int fd;
  char *lock_path; /* NULL: not held (a zeroed TpPathLock) */
} TpPathLock;
int tp_lock_path(TpPathLock *l, const char *path, const char *what, TpDiag *d);
/* A shared lock of PATH.lock, for readers: it excludes an exclusive holder (a writer), not
 * other readers. In a folder the reader cannot write, an absent lock file means no writer:
 * then nothing is held (l->lock_path NULL) and TP_OK. */
int tp_lock_path_shared(TpPathLock *l, const char *path, const char *what, TpDiag *d);
void tp_unlock_path(TpPathLock *l);

#endif
