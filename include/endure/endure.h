/* Endure's C API: the client library for programs in any language.
 *
 * A thin layer over the C++ client (include/endure/client.h), with the same
 * behaviour: an endure_session reports the program's progress to its node's
 * agent, fires the faults injected into this rank, saves checkpoint shards
 * into node memory and reads back the restore point the agent chose. Without
 * an agent (ENDURE_AGENT_SOCKET unset) a session is inactive and every call
 * is a cheap no-op, so the same program runs bare or under torchrun.
 *
 * Conventions:
 *   - Handles are opaque; endure_session_free releases one (NULL is fine).
 *   - Functions that can fail return an endure_status. On failure,
 *     endure_last_error() returns a message for the person who has to fix it
 *     (naming the variable, file or value), valid until the next failing call
 *     on the same thread. On success it is not changed.
 *   - Steps are 0-based indices, as in the C++ API.
 *   - Buffers that the library returns (endure_buffer) are freed with
 *     endure_buffer_free.
 *   - Thread safety: as the C++ Session; step calls from the training thread.
 *
 * Link with -lendure (build/lib/libendure.so). */
#ifndef ENDURE_ENDURE_H_
#define ENDURE_ENDURE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum endure_status {
  ENDURE_OK = 0,
  ENDURE_INVALID_ARGUMENT = 1, /* bad variable, argument or input: change something */
  ENDURE_NOT_FOUND = 2,
  ENDURE_DATA_LOSS = 3,   /* a copy exists but fails verification */
  ENDURE_IO_ERROR = 4,    /* the operating system refused a file or socket operation */
  ENDURE_UNAVAILABLE = 5, /* a peer or service cannot be reached right now */
  ENDURE_INTERNAL = 6
} endure_status;

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN" for another value. */
const char* endure_status_name(endure_status status);

/* The message of this thread's last failure; "" when there was none. */
const char* endure_last_error(void);

typedef struct endure_session endure_session;

/* Reads the ENDURE_* variables (see include/endure/client.h). On success
 * *out is a session (inactive without an agent). ENDURE_INVALID_ARGUMENT for
 * a malformed variable; *out is then NULL. */
endure_status endure_session_from_env(endure_session** out);
/* A session that reports nothing and injects nothing. Never NULL. */
endure_session* endure_session_disabled(void);
void endure_session_free(endure_session* session);

int endure_session_active(const endure_session* session); /* 1 when reporting to an agent */
int endure_session_rank(const endure_session* session);
int64_t endure_session_generation(const endure_session* session);
/* 1 when checkpoints go to node memory (endure_save_snapshot). */
int endure_session_memory_checkpoints(const endure_session* session);

/* Progress. */
/* The program computes the same loss bit for bit when it replays a step
   (call before endure_ready): a loss anomaly is then judged by replaying it
   (client.h Session::DeclareDeterministic). */
void endure_declare_deterministic(endure_session* session);
void endure_ready(endure_session* session, int64_t start_step, double restore_s, double init_s);
/* endure_ready for a program that does not know which step it restored (a
   checkpoint of its own): the first step it reports says. */
void endure_ready_at_unknown_step(endure_session* session, double restore_s, double init_s);
void endure_begin_step(endure_session* session, int64_t step);
/* Returns the loss to log: NaN when an injected `nan` fault is due. */
double endure_end_step(endure_session* session, int64_t step, double loss, double compute_s,
                       double comm_s, double ckpt_stall_s, int64_t checkpoint_step);
int endure_should_skip(const endure_session* session, int64_t step);
void endure_end_skipped_step(endure_session* session, int64_t step, double ckpt_stall_s,
                             int64_t checkpoint_step);
void endure_set_tokens_per_step(endure_session* session, int64_t tokens);
// The steps the run trains in all (Session::SetTotalSteps); 0: unknown.
void endure_set_total_steps(endure_session* session, int64_t steps);
/* Seconds since the process (or a warm standby's assignment) started. */
double endure_seconds_since_process_start(void);

/* Phases. The rank enters phase `name` ("eval", "checkpoint", "data",
 * "train" to return to training, or a name of its own matching
 * ^[a-z][a-z0-9_]{0,31}$), so that the agent times it on its own: a long
 * evaluation is not a hang. ENDURE_INVALID_ARGUMENT for a bad or NULL name
 * or session. Inactive session: only remembered. */
endure_status endure_phase(endure_session* session, const char* name);
/* The current phase: "train" until endure_phase says otherwise. Valid until
 * the next endure_phase. */
const char* endure_current_phase(const endure_session* session);

/* Silent data corruption check (ENDURE_SDC_CHECK_EVERY, 0: off). */
int64_t endure_sdc_check_every(const endure_session* session);
/* 1 when the parameters after the optimizer step of step `step` are to be
 * fingerprinted and reported. */
int endure_fingerprint_due(const endure_session* session, int64_t step);
/* Reports the parameters' fingerprint (16 lowercase hex digits, as
 * endure_fingerprint writes it) after the optimizer step of step `step`.
 * ENDURE_INVALID_ARGUMENT for another string. */
endure_status endure_report_fingerprint(endure_session* session, int64_t step,
                                        const char* fingerprint);

/* Injected faults inside the step. A bit to flip: parameter tensor `tensor`
 * (in the trainer's named order, modulo their count), element `element`
 * (modulo its elements), bit `bit` (modulo its dtype's width). */
typedef struct endure_bitflip {
  int tensor;
  int64_t element;
  int bit;
} endure_bitflip;
/* After the optimizer step of step `step`: 1 and *out filled when a bitflip
 * fault of this rank is due (once), 0 otherwise. */
int endure_bitflip_due(endure_session* session, int64_t step, endure_bitflip* out);
/* Flips out's element and bit in `numel` elements of `element_bytes` (1, 2,
 * 4 or 8) bytes at `data`; 0 when nothing was flipped (empty tensor). */
int endure_flip_bit(const endure_bitflip* flip, void* data, int64_t numel, size_t element_bytes);
/* Right before each collective of step `step` (inside the time reported as
 * comm_s): an injected comm-fail exits the process with 1 here, a comm-slow
 * sleeps. */
void endure_before_collective(endure_session* session, int64_t step);

/* Checkpoints. A tensor seen in place: `bytes` bytes at `data`, row-major
 * and contiguous, of dtype "float32", "float64", "float16", "bfloat16",
 * "int64", "int32", "int16", "int8", "uint8" or "bool". */
typedef struct endure_tensor {
  const char* name;
  const char* dtype;
  const int64_t* shape;
  size_t ndim;
  const void* data;
  size_t bytes;
} endure_tensor;

/* Saves this rank's shard of step `step` of a `shards`-way state into node
 * memory (meta_json: a JSON object). *saved is 1 when it was saved, 0 when
 * the agent held the slot for 30 s and the save was skipped. */
endure_status endure_save_snapshot(endure_session* session, int64_t step, int shards,
                                   const char* meta_json, const endure_tensor* tensors,
                                   size_t count, int* saved);

/* XXH3-64 over each tensor's name and bytes, in order, as 16 hex digits and
 * a NUL in out[0..16]: the fingerprint endure_report_fingerprint takes. */
endure_status endure_fingerprint(const endure_tensor* tensors, size_t count, char out[17]);

/* The agent's restore point: the step (0: fresh start; -1: the agent gave no
 * plan) and its sources, one per shard. */
int64_t endure_restore_plan_step(const endure_session* session);
size_t endure_restore_plan_sources(const endure_session* session);
/* The rank that reads source `index` and broadcasts it; -1 out of range. */
int endure_restore_plan_loader(const endure_session* session, size_t index);

typedef struct endure_buffer {
  char* data;
  size_t size;
} endure_buffer;
void endure_buffer_free(endure_buffer* buffer);

/* Reads source `index` of the restore plan and verifies it: the bytes of a
 * shard (decode them with endure_decode_shard). ENDURE_DATA_LOSS naming the
 * copy when it does not verify. */
endure_status endure_read_restore_shard(const endure_session* session, size_t index,
                                        endure_buffer* out);

/* A shard's bytes, decoded. The tensors point into the shard; both are
 * valid until endure_shard_free. */
typedef struct endure_shard endure_shard;
endure_status endure_decode_shard(const char* bytes, size_t size, endure_shard** out);
const char* endure_shard_meta_json(const endure_shard* shard);
size_t endure_shard_tensor_count(const endure_shard* shard);
/* Fills *out with tensor `index`; ENDURE_INVALID_ARGUMENT out of range. */
endure_status endure_shard_tensor(const endure_shard* shard, size_t index, endure_tensor* out);
void endure_shard_free(endure_shard* shard);

#ifdef __cplusplus
}
#endif

#endif /* ENDURE_ENDURE_H_ */
