/* The interface between a generated training program (codegen/ writes plan.c) and the
 * trainer runtime (runtime/train/) it links against. The generated file defines one
 * `const TpPlan tp_plan` and a main() that calls tp_trainer_main(&tp_plan, argc, argv);
 * everything else (command line, data, optimizer, communication, checkpoints, logs) is the
 * runtime's. Depends only on base/tensor.h, so plan.c needs no compiler headers.
 *
 * ---- How a step runs (ABI 2: stages x microbatches x slices x replicas; ABI 5: x tensor) ----
 * The program runs as S x N x D processes ("ranks"): S pipeline stages, each split over N
 * tensor-parallel ranks (N = plan->tensor, 1 without --tensor), times D data-parallel
 * replicas. Rank r is tensor rank t = r % N of stage k = (r / N) % S of replica
 * d = r / (N * S): the N ranks of one stage are adjacent (as on one node, where tensor
 * parallelism's all-reduces belong), then the stages of one replica. A schedule's peer
 * (TpPlanInsn.peer) is a stage of the same replica and the same tensor rank: MPI rank
 * (d * S + peer) * N + t. With N == 1 this is ABI 2's layout (rank d * S + k).
 *
 * Tensor groups (N > 1): the N ranks of one stage of one replica run the same schedule and
 * the same unit functions (SPMD) on their own parts of the parameters. A unit calls
 * io->tensor_allreduce to sum a buffer over its tensor group (Megatron's all-reduces after
 * row-parallel products and of input gradients of column-parallel ones), in the order its
 * code gives, the same on every member; stages[k].forward_reduces[i] and
 * .backward_reduces[i] count the calls the units of slice i make, which the runtime checks.
 * Boundary messages go from tensor rank t of stage k to tensor rank t of stage k + 1: each
 * member holds the whole (replicated) activation. The loss is computed by every member; the
 * step's loss is tensor rank 0's. The dp group of rank (d, k, t) is the ranks (d', k, t).
 *
 * Data: a step reads one window of global_batch * seq + 1 tokens, as in ABI 1 (row j of
 * the [global_batch, seq] tokens starts at token j * seq; targets are shifted by one).
 * Replica d takes rows [d * B/D, (d + 1) * B/D) (B = global_batch, D = dp) and splits them
 * into `microbatches` microbatches of `batch` rows each: microbatch mb of replica d is rows
 * [(d * microbatches + mb) * batch, ... + batch). So global_batch = batch * microbatches *
 * dp. Each microbatch's TpStepIO gets its own tokens/targets pointers ([batch, seq]).
 *
 * Units: the sequence is cut into `nslices` token slices (slice_len[i] tokens each, in
 * order; nslices == 1: unsliced). A unit is (microbatch, slice). Stage k has one forward
 * and one backward function per slice, stages[k].forward[i] / .backward[i]. They run in
 * the order of the stage's schedule stages[k].insns (below). For one microbatch, the
 * forwards run slice 0..N-1 and the backwards N-1..0 (later slices read the K/V of earlier
 * ones kept in the arena; their backward adds into earlier rows' dK/dV).
 *
 * Arenas (ABI 7: and the transient region): a unit function works in two regions. The
 * arena of its (stage, microbatch): io->arena points at stages[k].arena_bytes bytes,
 * 64-byte aligned. One arena holds everything a microbatch keeps on the stage between its
 * units: activations saved for backward, K/V buffers, boundary buffers (and, where the
 * rank keeps one microbatch at a time, possibly all its buffers). Stage k needs
 * stages[k].arenas of them (the most microbatches its schedule keeps alive at once);
 * microbatch mb uses arena number mb % arenas, which the compiler checked never collides
 * with a microbatch still alive. And the rank's transient region: io->transient points at
 * stages[k].transient_bytes bytes, 64-byte aligned, one per rank, which every unit of the
 * rank uses, whatever its microbatch, for what lives only while it runs. A rank's units
 * must not overlap in time: they run one after the other (a device target's in order on
 * the rank's stream, with the tensor all-reduces they call and the packs and unpacks of
 * their messages). Both are zeroed once at allocation; the plan never relies on contents
 * left by another unit's transient work or another microbatch's arena.
 *
 * Boundaries: what stage k sends to k+1 (activations) and k+1 sends back (their gradients)
 * lies in the microbatch's arena. For slice i, stages[k].send_act[i] lists the (offset,
 * bytes) buffers stage k sends after its forward of slice i; stages[k+1].recv_act[i] lists
 * where stage k+1 puts them, buffer j to buffer j (same bytes, same order), before its
 * forward of slice i. Likewise send_grad[i] (after the backward of slice i, to k-1) and
 * recv_grad[i] (before the backward of slice i, from k+1). The bytes are raw (send them as
 * bytes). A message may hold no buffers (e.g. the gradient of an activation nothing
 * trainable depends on): it is still sent and received, as a zero-byte message, so the
 * verified schedule holds. Boundary buffers are never reused inside the arena, so a send
 * may complete late: the runtime must complete every send of microbatch mb before arena
 * mb % arenas is given to another microbatch, and all of them by the step's end.
 *
 * Parameters: params[i].stage is the stage that holds, updates and (for --dump-*,
 * --export-onnx, checkpoints) owns parameter i. With N > 1 a parameter may be split over
 * the stage's tensor group (params[i].shard, as TpShard in ir/ir.h): dims are one rank's
 * part; --init, checkpoints, --dump-* and --export-onnx read and write the whole tensor
 * (dims[axis] * parts along shard.axis), which the runtime scatters to and gathers from the
 * members, so files are the same as a one-process run's and a run can resume under another
 * (S, N, D). A parameter not split is whole on every member, and every member computes the
 * same gradient bits for it (its inputs are replicated; tensor_allreduce gives every member
 * the same bits); other stages may leave io->param[i] and
 * io->grad[i] NULL. A tied parameter (tied_stage != 0: the embedding re-tied to the LM
 * head) is held by both `stage` (the first) and `tied_stage` (the last); each computes its
 * own partial gradient; the schedule's allreduce-tied sums the two partials (both ranks get
 * the sum), and both apply the same update, so the two copies stay equal.
 *
 * Gradients: the backward units of one microbatch write (=, they do not accumulate) the
 * gradient of that microbatch's mean loss into io->grad[i]: the runtime zeroes io->grad
 * before the microbatch's first backward unit on the stage, and the gradient is complete
 * after its last one (slice 0). A microbatch's backward units are contiguous on a rank (no
 * other microbatch's backward runs in between), so with microbatches > 1 one scratch set of
 * gradients suffices: after each microbatch the runtime adds it into the step's sum. The
 * step's gradient (what the update, clipping and --dump-grads see) is
 *     sum over microbatches / microbatches, averaged over the dp replicas (allreduce),
 * with tied partials summed (allreduce-tied): the same as one process with global_batch.
 *
 * Loss: the last stage's forward unit that computes the loss (the last slice) sets
 * io->loss to the microbatch's mean cross-entropy; the step's loss is the mean over
 * microbatches and replicas.
 *
 * Schedule instructions (stages[k].insns, in program order for the rank of stage k):
 *   FORWARD mb i      io for microbatch mb: stages[k].forward[i](io)
 *   BACKWARD mb i     stages[k].backward[i](io)
 *   SEND_ACT mb i     post the send of send_act[i] of mb's arena to stage peer (= k+1)
 *   RECV_ACT mb i     receive recv_act[i] into mb's arena from stage peer (= k-1); blocks
 *   SEND_GRAD mb i    post the send of send_grad[i] to peer (= k-1)
 *   RECV_GRAD mb i    receive recv_grad[i] from peer (= k+1); blocks
 *   ALLREDUCE_TIED    sum the gradients of the tied parameters with stage peer
 *   ALLREDUCE         average this stage's gradients over the dp replicas (only if dp > 1;
 *                     with zero, each replica's shard only: a reduce-scatter),
 *                     and first sum, over the tensor ranks that hold the same piece, the
 *                     gradients of params with shard.parts < N (grouped K/V heads fewer
 *                     than the ranks: each member's gradient is partial); the compiler
 *                     emits it when dp > 1 or such a param exists
 *   OPTIMIZER_STEP    update the parameters this stage holds (with zero: its shard's, then
 *                     the replicas all-gather them)
 *   BACKWARD_INPUT mb i   (ABI 8, split backwards: zero-bubble schedules)
 *                     stages[k].backward_input[i](io): the gradients of the unit's inputs
 *                     (what send_grad[i] sends, and the K/V context rows of earlier slices)
 *   BACKWARD_WEIGHT mb i  stages[k].backward_weight[i](io): the unit's parameter gradients,
 *                     from what its BACKWARD_INPUT kept in the arena; a unit runs either
 *                     BACKWARD, or BACKWARD_INPUT and later BACKWARD_WEIGHT. A split plan
 *                     has backward_input and backward_weight and no backward. Only weight
 *                     parts write io->grad, so "Gradients" above holds with the weight parts
 *                     in place of the backward units: the runtime zeroes the scratch set
 *                     before a microbatch's first weight part (slice N-1) and adds it into
 *                     the step's sum after its last (slice 0), and the weight parts of one
 *                     microbatch run in order N-1..0 with no other microbatch's weight part
 *                     between them (the compiler verified it). The input parts make all of
 *                     a split unit's tensor all-reduces: backward_reduces[i] counts them,
 *                     and a weight part makes none.
 * Interleaved plans (ABI 8, chunks V > 1): the plan's nstages are S * V virtual stages, run
 * by S pipeline ranks: rank k runs virtual stages k, k + S, ..., k + (V - 1) * S, in one
 * list, stages[k].insns (k < S; the lists of virtual stages >= S are empty). An
 * instruction's `chunk` c names virtual stage c * S + k: its units, arena and messages; a
 * peer is a virtual stage. Rank k holds the parameters of all its virtual stages.
 * Sends must not block (MPI_Isend): 1f1b schedules deadlock with blocking sends. The
 * compiler verified the lists: every send has exactly one matching receive, and running
 * all ranks with non-blocking sends ends with every rank done. The tag of a message can be
 * (kind, mb, slice): each appears once per step and direction; the runtime's also names the
 * boundary (tp_plan_message_tag, below), which NCCL's links need (it has no tags).
 *
 * Profiling probes (tokpipec --profile-grid; nprobes 0 and probes NULL without): the
 * trainer's --profile times each stage's forward and backward of one token slice on a grid
 * of (l, c). Probe p is the same model compiled for one microbatch of `b` rows (= batch)
 * sliced as [c, l, seq - c - l] (empty slices dropped), with the same stage cuts; its
 * units, per stage k in probes[p].stages[k], work in an arena and a transient region of
 * their own (arena_bytes and transient_bytes, 64-byte aligned, zeroed) and read io->param
 * and io->grad with the indices of `params` above (the gradients they write are scratch).
 * A rank of stage k runs setup[0..nsetup) (the forwards of the context slices, filling the
 * K/V of the c context rows), then the forward and backward of the probed slice. The arena
 * is planned for the whole slicing's run order, so to run them again both are zeroed and
 * the setup run again first (the probed units alone may read bytes of units not run, or
 * that their backward reused). Tokens and
 * targets are [batch, seq]. No messages: a stage > 0 reads its received activations as
 * the zeroed arena holds them. stage_cuts[k] is the first layer of stage k (NULL: not
 * recorded).
 *
 * ABI 1 plans (stages == NULL, e.g. hand-written tests): one process runs nstages stage
 * functions forward[s] in order, then backward[s] in reverse, all with one arena and one
 * transient region each (transient_bytes NULL: none) and shared param/grad buffers; one
 * microbatch, one slice. Generated unsliced plans fill these fields too (forward[s] ==
 * stages[s].forward[0]), so a one-stage, one-microbatch plan runs the same either way. */
#ifndef TOKPIPE_PLAN_H
#define TOKPIPE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../../base/diag.h"
#include "../../base/tensor.h"

/* The plan ABI's versions:
 *   8: split backwards (TP_PLAN_BACKWARD_INPUT/WEIGHT, TpPlanStage.backward_input/weight)
 *      and interleaved virtual stages (TpPlan.chunks, TpPlanInsn.chunk);
 *   7: the transient region (TpStepIO.transient, TpPlanStage.transient_bytes,
 *      TpPlanProbeStage.transient_bytes, TpPlan.transient_bytes): an arena holds only what a
 *      microbatch keeps between its units;
 *   6: TpPlan.zero (--zero 1: the replicas shard the optimizer state);
 *   5: tensor parallelism (TpPlan.tensor, TpPlanParam.shard, TpStepIO.tensor_allreduce and
 *      tensor_rank, TpPlanStage.forward_reduces/backward_reduces);
 *   4: TpPlan gained device (3: TpStepIO gained compute and stream).
 * What "ABI 2" names below (plans with stages) and "ABI 1" (without) is unchanged. */
#define TP_PLAN_ABI 8

typedef struct TpCompute TpCompute; /* ../compute.h */
typedef struct TpStream TpStream;
typedef struct TpComm TpComm; /* ../comm/comm.h */
typedef struct TpPlan TpPlan;
typedef struct TpStepIO TpStepIO;

/* How a parameter is split over the N ranks of a tensor group: the whole tensor is
 * `chunks` equal chunks along `axis` (a fused Q|K|V weight: 3), each cut into `parts` equal
 * pieces, and tensor rank t holds piece t * parts / N of every chunk, in chunk order
 * (parts == N: its own; parts < N: N / parts ranks hold the same piece). parts 0: not split.
 * The same as the compiler's TpShard (ir/ir.h). */
typedef struct {
  int axis, parts, chunks;
} TpPlanShard;

/* A trainable or frozen parameter: one ONNX initializer (or the name an exporter's
 * Identity gave a de-duplicated one). Values and gradients are f32, row-major. */
typedef struct {
  const char *name;   /* the ONNX name: what --init reads and the dumps are keyed by */
  const char *source; /* the ONNX initializer holding its initial value (== name unless it
                          was an Identity alias of a shared initializer) */
  int rank;
  int64_t dims[TP_MAX_RANK];
  int trainable;     /* 0 if frozen (--freeze): no gradient, no update */
  int stage;         /* the stage that holds it (ABI 2; 0 in one-stage plans) */
  int tied_stage;    /* 0: held by `stage` only; else the later stage that also holds it
                          (a tied embedding and head: gradients summed by allreduce-tied) */
  TpPlanShard shard; /* how it is split over the tensor group; parts 0: whole */
} TpPlanParam;

/* An ONNX initializer that the compiler replaced by a function of a parameter (weight
 * re-tying): its value is param (transposed when `transpose`, a 2-D swap). Written by
 * --export-onnx and --dump-weights/--dump-grads under its own name. */
typedef struct {
  const char *name;
  int param;
  int transpose;
} TpPlanDerived;

/* What one unit function reads and writes. The trainer owns all buffers. */
struct TpStepIO {
  void *arena;            /* the (stage, microbatch) arena: stages[k].arena_bytes, 64-aligned */
  void *transient;        /* the rank's transient region: stages[k].transient_bytes, 64-aligned */
  float *const *param;    /* param[i]: values of plan->params[i] (NULL where not held); 16-bit
                             arrays under TpPlan.precision bf16 and fp16 */
  float *const *grad;     /* grad[i]: gradients (see "Gradients" above), stored as param[i] */
  const int64_t *tokens;  /* [batch, seq] model input ids of the microbatch */
  const int64_t *targets; /* [batch, seq] the next token of each position */
  float loss;             /* set by the last stage's loss unit: the microbatch's mean */
  /* The compute backend whose device memory arena, param[i], grad[i], tokens and targets
   * point into (io and the arrays param and grad are host memory), and the stream the unit
   * queues its work on. Units of the CPU target compute at once and use neither. */
  TpCompute *compute;
  TpStream *stream;
  /* Tensor parallelism (plan->tensor > 1; NULL otherwise): sums `count` floats at buf (the
   * compute backend's memory, produced by work the unit queued on `stream`) over the unit's
   * tensor group, in place, ordered after that work; every member gets the same bits. */
  void (*tensor_allreduce)(TpStepIO *io, float *buf, int64_t count);
  void *tensor_ctx; /* the runtime's, for tensor_allreduce */
  /* This rank's place t = r % N in its tensor group (0 when plan->tensor == 1): the unit
   * writes it where the IR's TensorRank asks (the vocabulary range a vocabulary-parallel
   * embedding, LM head and cross-entropy hold). */
  int tensor_rank;
  /* TpPlan.precision fp16: the loss scale S (dynamic loss scaling), which the backward
   * starts from (d loss / d loss = S), so the 16-bit gradients are S times the true ones;
   * the runtime sets it and divides the step's sum by it. Other plans do not read it. */
  float loss_scale;
  /* the same scale in the compute backend's memory, which device units (whose kernels must
   * not read host memory) read in place of &loss_scale */
  const float *loss_scale_device;
};

/* Where offset `at` of a shared body's list points (codegen/outline.c): the arena's, or,
 * odd, the transient region's plus 1 (offsets are multiples of 64). */
static inline char *tp_plan_at(const TpStepIO *io, int64_t at) {
  return (char *)(at & 1 ? io->transient : io->arena) + (at & ~(int64_t)1);
}

typedef void (*TpUnitFn)(TpStepIO *io);
typedef TpUnitFn TpStageFn; /* ABI 1's name */

/* A buffer of a microbatch's arena. */
typedef struct {
  int64_t offset, bytes;
} TpPlanBuffer;

/* One message between neighbouring stages: its buffers, in order (possibly none). */
typedef struct {
  int nbuffers;
  const TpPlanBuffer *buffers;
} TpPlanMessage;

/* Schedule instructions; the same order as the compiler's TpInsnKind
 * (passes/planner/schedule.h). */
typedef enum {
  TP_PLAN_FORWARD,
  TP_PLAN_BACKWARD,
  TP_PLAN_SEND_ACT,
  TP_PLAN_RECV_ACT,
  TP_PLAN_SEND_GRAD,
  TP_PLAN_RECV_GRAD,
  TP_PLAN_ALLREDUCE_TIED,
  TP_PLAN_ALLREDUCE,
  TP_PLAN_OPTIMIZER_STEP,
  TP_PLAN_BACKWARD_INPUT,
  TP_PLAN_BACKWARD_WEIGHT,
} TpPlanInsnKind;

typedef struct {
  int kind;      /* TpPlanInsnKind */
  int mb, slice; /* the unit; -1 for ALLREDUCE_TIED, ALLREDUCE, OPTIMIZER_STEP */
  int peer;      /* the other stage of a send, receive or ALLREDUCE_TIED; else -1 */
  int chunk;     /* interleaved plans: the rank's virtual stage (see above); else 0 */
} TpPlanInsn;

typedef enum { TP_PLAN_GPIPE, TP_PLAN_1F1B, TP_PLAN_ZB, TP_PLAN_INTERLEAVED } TpPlanSchedule;

/* How the units store parameters, gradients and activations (tokpipec --precision).
 * TP_PLAN_FP32: io->param[i] and io->grad[i] are f32. TP_PLAN_BF16 and
 * TP_PLAN_FP16: they are 16-bit (uint16_t, bf16 or IEEE half) arrays: the runtime keeps
 * f32 master weights (what AdamW updates and checkpoints hold) and writes their
 * round-to-nearest-even copy into io->param after each update; it adds each microbatch's
 * 16-bit gradients into an f32 step sum. */
typedef enum { TP_PLAN_FP32, TP_PLAN_BF16, TP_PLAN_FP16 } TpPlanPrecision;

/* One pipeline stage (the rank that runs it, in every replica). */
typedef struct {
  const TpUnitFn *forward;  /* [nslices] */
  const TpUnitFn *backward; /* [nslices] */
  /* [nslices] each: the two parts of backward[i], for schedules that split it (ABI 8);
   * NULL when the plan's schedule does not */
  const TpUnitFn *backward_input, *backward_weight;
  size_t arena_bytes;     /* one microbatch's arena */
  int arenas;             /* arenas to allocate; microbatch mb uses mb % arenas */
  size_t transient_bytes; /* the rank's transient region (one, whatever `arenas`) */
  /* [nslices] each; NULL where there is no neighbour (recv_act and send_grad of stage 0,
   * send_act and recv_grad of the last stage) */
  const TpPlanMessage *recv_act, *send_act, *recv_grad, *send_grad;
  int ninsns;
  const TpPlanInsn *insns; /* the rank's schedule for one step */
  int64_t memory_bytes;    /* the compiler's estimate of the rank's peak: parameters,
                                gradients, AdamW state, arenas * arena_bytes +
                                transient_bytes */
  /* [nslices] each: the io->tensor_allreduce calls the forward (backward) unit of slice i
   * makes; NULL when tensor == 1 */
  const int *forward_reduces, *backward_reduces;
} TpPlanStage;

/* One stage's units of a profiling probe (see "Profiling probes" above). */
typedef struct {
  size_t arena_bytes, transient_bytes;
  int nsetup;
  const TpUnitFn *setup;      /* [nsetup]: the forwards of the context slices, in order */
  TpUnitFn forward, backward; /* the probed slice's */
} TpPlanProbeStage;

typedef struct {
  int64_t b, l, c;                /* microbatch rows, slice length, context length */
  const TpPlanProbeStage *stages; /* [nstages] */
} TpPlanProbe;

/* The device a plan's units run on, other than the CPU (tokpipec --target cuda: the
 * runtime/cuda library's tp_plan_device_cuda). A CPU plan's device is NULL: the CPU compute
 * backend and the host transport (MPI or local). */
typedef struct {
  const char *name; /* "cuda" */
  /* The compute backend for this process (local_rank: its index among the processes of
   * its node, which picks the GPU). Without a usable device: one error naming it, TP_ERR_INPUT
   * (the trainer prints it and exits 1 before reading anything). */
  int (*open_compute)(TpCompute **out, int local_rank, TpDiag *d);
  /* The transport between ranks over device memory, built on the host transport `host`
   * (which it may use to bootstrap), with every communicator the plan's schedules need
   * created here, in a fixed order. *out NULL: the host transport serves (one process, or
   * several processes sharing a GPU), with host copies. */
  int (*open_comm)(TpComm *host, TpCompute *compute, const TpPlan *plan, TpComm **out, TpDiag *d);
} TpPlanDevice;

struct TpPlan {
  int abi;           /* TP_PLAN_ABI */
  const char *model; /* the ONNX file it was compiled from (--export-onnx rewrites it
                              unless --init names another) */
  const char *tokpipec_version;
  int64_t batch, seq, vocab; /* batch: rows of one microbatch (the compiled batch dim) */
  /* Token ids (inputs and targets) must be below token_limit: the fewest rows of every
   * table they index (embedding and Gather tables, the loss's classes), which
   * token_limit_of names for errors ("the 100 rows of table 'wte'"). 0 and NULL: vocab.
   * Both count whole tables and the whole vocabulary, also where tensor ranks split them. */
  int64_t token_limit;
  const char *token_limit_of;
  int nparams;
  const TpPlanParam *params;
  /* A padded vocabulary (TpShard.pad), per parameter: the whole tensor's last param_pad[i]
   * slices along shard.axis, on the last tensor rank, are zeros that files never hold (the
   * whole is dims[axis] * parts - param_pad[i] there). NULL: no padding (the plans of
   * vocabularies the ranks divide, and every plan before it). */
  const int *param_pad;
  int nderived;
  const TpPlanDerived *derived;
  /* ABI 1 view (see above): per stage; forward and backward NULL when sliced */
  int nstages;
  const size_t *arena_bytes;
  const size_t *transient_bytes; /* NULL: no transient regions */
  const TpStageFn *forward;
  const TpStageFn *backward;
  /* ABI 2: the pipeline (stages NULL in ABI 1 plans) */
  int64_t global_batch;      /* B = batch * microbatches * dp: the rows of one step */
  int microbatches;          /* M per replica */
  int dp;                    /* D replicas */
  int nslices;               /* N */
  const int64_t *slice_len;  /* [nslices], summing to seq */
  int schedule;              /* TpPlanSchedule the lists were built with (informative) */
  const TpPlanStage *stages; /* [nstages] */
  /* Profiling (tokpipec --profile-grid; absent: 0 / NULL) */
  const int *stage_cuts; /* [nstages]: the first layer of each stage */
  int nprobes;
  const TpPlanProbe *probes;  /* [nprobes] */
  const TpPlanDevice *device; /* NULL: the CPU (see TpPlanDevice) */
  int tensor;                 /* N: tensor-parallel ranks per stage (ABI 5; 1: none) */
  /* 1 (tokpipec --zero 1, with dp > 1): each of the D replicas of a rank keeps the AdamW
   * state of 1/D of its gradient block (its shard: a contiguous range cut on the gradient
   * norm's pieces, runtime/train/step.h). ALLREDUCE then reduce-scatters the gradients
   * (each member gets the sum of its shard, in the order of the all-reduce), the optimizer
   * step updates the values of the shard, and the replicas all-gather the updated values
   * (under bf16 and fp16: the fp32 masters of the shard, which only it keeps, rounded to
   * the 16-bit working copies, which are gathered): the same bits as without it. 0: every
   * replica keeps all of it. */
  int zero;
  int precision; /* TpPlanPrecision (0 when absent: fp32) */
  int chunks;    /* virtual stages per pipeline rank (ABI 8; 0 or 1: not interleaved) */
};

/* The tag of the message of unit (mb, slice) across the boundary between virtual stages j
 * and j + 1, the runtime's on a transport with tags (MPI): (c, mb, slice, grad), where
 * c = j / S is the boundary's chunk (S pipeline ranks; 0 unless interleaved) and grad 1 for
 * gradients (j + 1 to j), 0 for activations (j to j + 1). Unique per step, and with the
 * sender and receiver it names the boundary: j = c * S + (the activation's sender, the
 * gradient's receiver), a rank below S. A transport without tags (NCCL) reads c and grad
 * back to pick the boundary's own communicator. */
static inline int tp_plan_message_tag(const TpPlan *P, int chunk, int mb, int slice, int grad) {
  return ((chunk * P->microbatches + mb) * P->nslices + slice) * 2 + grad;
}
static inline int tp_plan_tag_chunk(const TpPlan *P, int tag) { return tag / 2 / (P->microbatches * P->nslices); }
static inline int tp_plan_tag_grad(int tag) { return tag % 2; }

/* The trainer: parses the command line, runs training, returns the process exit code
 * (0 ok, 1 bad input, 2 bad usage). */
int tp_trainer_main(const TpPlan *plan, int argc, char **argv);

#endif
