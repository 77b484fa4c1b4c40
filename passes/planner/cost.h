/* The planner's cost model: FLOPs and bytes of every kernel of a decoder-only transformer
 * layer for one slice (microbatch b, slice length l, context c, tensor-parallel degree t),
 * forward and backward, turned into seconds by a hardware profile; stage-to-stage
 * transfers, tensor- and data-parallel all-reduces, optimizer step and per-rank memory;
 * and the least-squares fit t(l,c) = t(l,0) + a0 + a1*l + a2*c + a3*l*c of measured
 * samples (TeraPipe's cost model).
 *
 * Conventions: times in seconds, sizes in bytes, one "device" is one GPU (or one CPU
 * rank). All costs are per device of a stage: tensor parallelism divides the GEMMs and
 * adds all-reduces. */
#ifndef TOKPIPE_PLANNER_COST_H
#define TOKPIPE_PLANNER_COST_H

#include <stdbool.h>

#include "codegen/rank_memory.h"
#include "ir/ir.h"
#include "json.h"

/* A hardware profile: tools/profiles/NAME.json (fields documented there and in
 * tools/profiles/README.md). */
typedef struct {
  char name[64], device[256];
  int devices_per_node;
  double memory_bytes; /* per device */
  char dtype[8];       /* training dtype: "fp16", "bf16" or "fp32" */
  int dtype_bytes;
  double peak_flops;                       /* dense peak of the training dtype, FLOP/s */
  double gemm_efficiency;                  /* fraction of peak large GEMMs sustain */
  double gemm_half_rows;                   /* GEMM rows (tokens) at which half of that is reached */
  double mem_bandwidth;                    /* sustained bytes/s */
  double kernel_overhead_s;                /* per kernel: launch plus framework dispatch */
  double intra_bandwidth, intra_latency_s; /* device to device inside a node, per device */
  double inter_bandwidth, inter_latency_s; /* node to node, per node (shared) */
} TpHardware;

/* Reads a profile file. Errors (missing or bad fields) go to d: TP_ERR_INPUT. */
int tp_hardware_load(const char *path, TpHardware *hw, TpDiag *d);
/* The same from a parsed document; errors name `path`. */
int tp_hardware_from_json(const TpJson *j, const char *path, TpHardware *hw, TpDiag *d);
/* `name` is a file path (contains '/' or ends in .json) or NAME, looked up as NAME.json in
 * the ':'-separated `dirs`. Unknown names list the profiles found. */
int tp_hardware_find(const char *name, const char *dirs, TpHardware *hw, TpDiag *d);
/* The default profile folders: `builtin` (the build tree's tools/profiles and the
 * configured PREFIX/share/tokpipec/profiles), then share/tokpipec/profiles next to the
 * running executable's bin/ (an install moved or made with --prefix). */
void tp_profile_dirs(const char *builtin, char *out, size_t size);

typedef struct {
  char name[32];
  int layers, hidden, heads, seq, vocab, ffn;
} TpModelDesc;

/* "gpt3-1b|gpt3-13b|gpt3-44b|gpt3-175b" or "layers=96,hidden=12288,heads=96,seq=2048,
 * vocab=50257[,ffn=F]" (ffn defaults to 4*hidden). */
int tp_model_parse(const char *spec, TpModelDesc *m, TpDiag *d);
#define TP_MAX_MODEL_SIZE (1 << 24) /* the largest value of a model description's key */
/* The sizes of the transformer in a module after raise-transformer (layers = its Attention
 * ops) with sequence length seq; false if it has no attention, width or head. */
bool tp_model_describe(const TpModule *m, int64_t seq, TpModelDesc *desc);
/* The parameter count of a model so described, as the cost model counts it (an untied
 * head; learned positions): an estimate within tens of percent of the real model's. */
double tp_model_params(const TpModelDesc *m);

/* Stage k holds layers [first, first + layers); the first stage also the embedding, the
 * last the final norm, LM head and loss. */
typedef struct {
  int first, layers;
  bool embedding, head;
} TpStage;

#define TP_MAX_STAGES 1024

/* What the planner takes (larger inputs are refused, naming the bound): generous for real
 * models, and small enough that every cost computed from valid inputs is finite and every
 * search ends in about a minute. */
#define TP_MAX_LAYERS 1024          /* balanced stage cuts cost stages x layers^2 */
#define TP_MAX_SEQ (1 << 24)        /* tokens of a sequence */
#define TP_MAX_MICROBATCH (1 << 20) /* sequences of a microbatch or profile sample */
#define TP_MAX_SECONDS 1e6          /* a measured or tabled time; shorter than 1e-9 s neither */
#define TP_MIN_SECONDS 1e-9

/* Everything the costs depend on besides (b, l, c). */
typedef struct {
  TpHardware hw;
  TpModelDesc model;
  int pipeline, tensor, data;
  int nstages; /* pipeline stages; interleaved: pipeline x chunks virtual stages */
  TpStage stage[TP_MAX_STAGES];
  TpRecompute recompute;           /* activation recomputation: its extra forward in the backward */
  TpPrecision precision;           /* what the trainer stores (memory; compute is the profile's dtype) */
  bool zero;                       /* --zero 1: the D replicas share the optimizer state */
  bool vocab_split;                /* the embedding and head split over the tensor ranks (padded to
                                      a multiple of them); else each tensor rank holds them whole
                                      when the vocabulary does not divide */
  bool untied;                     /* the LM head has its own table (else the embedding's, tied) */
  int vocab_multiple;              /* the GPU step model (tp_gpu_step) prices the head's and the
                                      loss's work padded so each tensor rank holds a multiple of
                                      this many classes (0, 1: the true vocabulary's share), as
                                      tokpipec pads --target cuda plans to 64
                                      (TpPassOptions.vocab_multiple); memory counts the true
                                      vocabulary */
  bool one_region;                 /* the trainer holds a unit's working set in each microbatch's
                                      arena (else in one transient region per rank) */
  bool uniform_stages;             /* price every stage like a middle one (the paper's model) */
  bool split_backward;             /* zb: weight parts after their input parts, reading output
                                      gradients the microbatch keeps until then */
  bool flash_attention;            /* attention as one tiled kernel each way, causal tiles skipped
                                      (else scores, softmax and mix apart, the scores in memory) */
  const struct TpCalibration *cal; /* measured stage and optimizer times, or NULL */
  int microbatch_rows;             /* > 0: the only microbatch size that can run (the profiled one, a
                                compiled plan's); others are not priced */
} TpCostModel;

/* Sets up cm with stages of equal layer counts; layers not divisible by pipeline is an
 * input error. */
int tp_cost_model_init(TpCostModel *cm, const TpHardware *hw, const TpModelDesc *m, int pipeline, int tensor,
                       int data, TpDiag *d);
/* Replaces the stage cuts: cuts[k] = first layer of stage k (cuts[0] = 0, increasing). */
void tp_cost_model_set_cuts(TpCostModel *cm, const int *cuts);
/* Interleaved schedules: the stages become pipeline x chunks virtual stages (virtual stage
 * j runs on pipeline rank j % pipeline), cut as evenly as the layers allow (the larger
 * stages first); chunks 1 gives back one stage per rank. An input error when the layers
 * are fewer than the virtual stages or these are more than TP_MAX_STAGES. */
int tp_cost_model_set_chunks(TpCostModel *cm, int chunks, TpDiag *d);

typedef enum { TP_KERNEL_GEMM, TP_KERNEL_MEMORY, TP_KERNEL_ALLREDUCE } TpKernelKind;
typedef struct {
  const char *name;
  TpKernelKind kind;
  double flops, bytes;
  double rows; /* GEMM: rows of the activation operand, sets its efficiency */
  bool weight; /* a backward kernel computing parameter gradients: a split backward's
                   backward-weight runs it, its backward-input the others */
} TpKernel;
enum { TP_MAX_KERNELS = 48 };

/* The kernels of one transformer layer on one device, forward or backward. Returns the
 * count written to out[TP_MAX_KERNELS]. */
int tp_layer_kernels(const TpCostModel *cm, int b, int l, int c, bool backward, TpKernel *out);
/* The kernels of stage s's edges, forward or backward: the embedding (its first stage),
 * the final norm, LM head and loss (its last). Returns the count written to out. */
int tp_edge_kernels(const TpCostModel *cm, const TpStage *s, int b, int l, bool backward, TpKernel *out);
double tp_kernel_time(const TpCostModel *cm, const TpKernel *k);

typedef struct {
  double fwd, bwd;
  double wgt; /* the part of bwd that computes parameter gradients (a split backward's W) */
} TpTime;
/* One layer, and one whole stage (its layers plus embedding / head), for b sequences,
 * a slice of l tokens with context c. Calibrated: the stage's fitted times, INFINITY for
 * a microbatch size other than the profiled one. wgt: analytic, the weight-gradient
 * kernels' times (each weight-gradient GEMM has its forward GEMM's FLOPs; the embedding's
 * backward is all weight gradient; recomputation belongs to the input part, which runs
 * first; on the first stage, which sends no gradient, the whole backward, as tokpipec's
 * split-backward pass puts it); calibrated, the measured backward times the analytic
 * model's share. */
TpTime tp_layer_time(const TpCostModel *cm, int b, int l, int c);
TpTime tp_stage_time(const TpCostModel *cm, int stage, int b, int l, int c);
/* Activation (or its gradient) of b x l tokens from stage k to k+1 (or back; virtual
 * stages: between the ranks that run them). */
double tp_send_time(const TpCostModel *cm, int k, int b, int l);
bool tp_boundary_crosses_nodes(const TpCostModel *cm, int k);
/* After the backward: data-parallel gradient all-reduce and optimizer step of stage k. */
double tp_grad_allreduce_time(const TpCostModel *cm, int k);
double tp_optimizer_time(const TpCostModel *cm, int k); /* calibrated: measured */

/* Memory of stage k on one device, in the terms of codegen/rank_memory.h (the compiler's
 * own model; cm's precision, recomputation and tensor degree): */
double tp_stage_params(const TpCostModel *cm, int k); /* parameter elements on a device */
/* Bytes one microbatch of b sequences cut into `nslices` slices keeps from unit to unit
 * (activations saved for the backward, K/V contexts, boundary buffers). */
double tp_microbatch_kept_bytes(const TpCostModel *cm, int k, int b, int nslices);
/* Bytes of the working set of one unit (b sequences, a slice of l tokens after c), alive
 * only while it runs. */
double tp_unit_transient_bytes(const TpCostModel *cm, int k, int b, int l, int c);
/* The rank memory input of stage k (parameters, precision, ZeRO shards over cm->data,
 * kept and transient as above, `arenas` microbatches in flight). */
TpRankMemoryInput tp_stage_memory_input(const TpCostModel *cm, int k, int microbatches, double kept,
                                        double transient, int arenas);

/* ---- calibration from measured samples ----
 * Profile file (written by a generated trainer's --profile, read here):
 *   {"format": "tokpipe-profile", "version": 1,
 *    "device": "CPU model or GPU name", "threads": 2, "ranks": 2,
 *    "model": "model.onnx", "parameters": 2384, "stages": 2, "stage_cuts": [0, 2], "batch": 4, "seq": 256,
 *    "optimizer": [0.0031, 0.0042], "drift": 0.12,
 *    "samples": [{"stage": 0, "b": 4, "l": 64, "c": 0,
 *                 "forward": 0.010, "backward": 0.021, "seconds": 0.031}, ...]}
 * A sample is the median time of stage `stage`'s forward and backward of one token slice
 * of l tokens after a context of c tokens, for a microbatch of b sequences, measured while
 * every rank of the plan profiled its own stage at once (so they share the machine as in a
 * real run); seconds = forward + backward. "stage" absent: the whole model on one stage.
 * "forward"/"backward" absent: only their sum is known. "optimizer" (optional): seconds
 * of one AdamW step of each stage's parameters. "stage_cuts" (optional): the first layer of
 * each stage, as tokpipec's --stage-cuts. "drift" (optional): the spread of the trainer's
 * timed passes over the whole grid, upper / lower quartile of their times - 1 (0.12: 12%);
 * the same work each pass, so it is the machine's own drift while profiling. "parameters"
 * (optional): the model's parameter count, which the planner compares with the model it
 * prices (tp_model_params). */
/* One sample; stage 0 and split = false where the file does not say. */
typedef struct {
  int b, l, c;
  double seconds;
  int stage;
  bool split; /* forward and backward measured separately */
  double forward, backward;
} TpSample;

/* A whole profile file. Optional fields: threads, ranks, batch, seq 0 when absent; cuts and
 * optimizer NULL; drift -1. */
typedef struct {
  char device[256], model[256];
  int threads, ranks, stages, batch, seq;
  double parameters; /* the profiled model's parameter count; 0 when absent */
  int *cuts;         /* [stages] first layer of each stage */
  double *optimizer; /* [stages] seconds of one AdamW step */
  double drift;      /* the passes' spread, -1 when absent */
  TpSample *samples;
  int nsamples;
  bool split; /* every sample has forward and backward */
} TpProfile;
/* Reads and checks a profile: one error naming the file (and the sample) for bad input. */
int tp_profile_load(const char *path, TpProfile *p, TpDiag *d);
int tp_profile_from_json(const TpJson *j, const char *path, TpProfile *p, TpDiag *d);
void tp_profile_free(TpProfile *p);

typedef struct {
  int b;
  int nlen;
  int *len;    /* measured lengths with c = 0, increasing */
  double *t0;  /* t(len[i], 0), mean of repeats */
  double a[4]; /* t_ctx = a0 + a1*l + a2*c + a3*l*c */
  int nsamples;
  double rms_rel_err, max_rel_err; /* of the fitted t(l,c) over this b's samples */
} TpFit;
/* Fits the samples of microbatch size b. Needs c = 0 samples at >= 1 length and >= 4
 * samples with c > 0 at >= 2 lengths and >= 2 contexts. */
int tp_fit_samples(const TpSample *s, int n, int b, TpFit *fit, TpDiag *d);
/* t(l, c) from a fit: t(l,0) interpolated linearly between measured lengths (and
 * extrapolated from the nearest two), plus t_ctx where c > 0. */
double tp_fit_eval(const TpFit *f, double l, double c);
void tp_fit_free(TpFit *f);

/* A cost model calibrated by a profile: per stage, forward and backward each fitted as
 * above (t(l,0) per measured length + t_ctx), for the profiled microbatch size only; the
 * optimizer step per stage where the profile has it. Transfers and memory stay analytic
 * (the hardware profile). */
typedef struct TpCalibration {
  int b; /* the profiled microbatch size: the only one priced */
  int nstages;
  bool split;        /* forward/backward measured apart; else fwd fits their sum,
                           divided by the analytic model's forward:backward ratio */
  TpFit *fwd, *bwd;  /* [nstages] (bwd unused unless split) */
  double *optimizer; /* [nstages] or NULL */
} TpCalibration;
/* Fits every stage of the profile (errors name the file, stage and quantity). */
int tp_calibrate(const TpProfile *p, const char *path, TpCalibration *cal, TpDiag *d);
void tp_calibration_free(TpCalibration *cal);
/* Attaches cal to cm and takes the profile's stage cuts (their count as the pipeline
 * degree), or with cuts NULL keeps cm's, which must have the profile's stage count; a
 * mismatch with the model is an input error. */
int tp_cost_model_calibrate(TpCostModel *cm, const TpCalibration *cal, const int *cuts, TpDiag *d);

#endif
