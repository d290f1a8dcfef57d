// The C API (include/endure/endure.h) over the C++ client: handles wrap a
// Session, Statuses become status codes plus a per-thread message, and no
// exception crosses into C.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "endure/client.h"
#include "endure/endure.h"

struct endure_session {
  std::unique_ptr<endure::Session> session;
};

struct endure_shard {
  endure::StoredShard shard;
};

namespace {

thread_local std::string g_last_error;

endure_status CodeOf(endure::StatusCode code) {
  switch (code) {
    case endure::StatusCode::kOk:
      return ENDURE_OK;
    case endure::StatusCode::kInvalidArgument:
      return ENDURE_INVALID_ARGUMENT;
    case endure::StatusCode::kNotFound:
      return ENDURE_NOT_FOUND;
    case endure::StatusCode::kDataLoss:
      return ENDURE_DATA_LOSS;
    case endure::StatusCode::kIOError:
      return ENDURE_IO_ERROR;
    case endure::StatusCode::kUnavailable:
      return ENDURE_UNAVAILABLE;
    case endure::StatusCode::kInternal:
      return ENDURE_INTERNAL;
  }
  return ENDURE_INTERNAL;
}

endure_status Fail(const endure::Status& status) {
  g_last_error = status.message();
  return CodeOf(status.code());
}

endure_status Fail(endure_status code, const std::string& message) {
  g_last_error = message;
  return code;
}

// Runs `body`, turning an exception (out of memory) into ENDURE_INTERNAL.
template <typename F>
endure_status Guard(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(ENDURE_INTERNAL, e.what());
  }
}

}  // namespace

extern "C" {

const char* endure_status_name(endure_status status) {
  switch (status) {
    case ENDURE_OK:
      return "OK";
    case ENDURE_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case ENDURE_NOT_FOUND:
      return "NOT_FOUND";
    case ENDURE_DATA_LOSS:
      return "DATA_LOSS";
    case ENDURE_IO_ERROR:
      return "IO_ERROR";
    case ENDURE_UNAVAILABLE:
      return "UNAVAILABLE";
    case ENDURE_INTERNAL:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

const char* endure_last_error(void) { return g_last_error.c_str(); }

endure_status endure_session_from_env(endure_session** out) {
  if (out == nullptr) return Fail(ENDURE_INVALID_ARGUMENT, "endure_session_from_env: out is NULL");
  *out = nullptr;
  return Guard([&] {
    endure::Result<std::unique_ptr<endure::Session>> s = endure::Session::FromEnvironment();
    if (!s.ok()) return Fail(s.status());
    *out = new endure_session{std::move(s).value()};
    return ENDURE_OK;
  });
}

endure_session* endure_session_disabled(void) {
  return new endure_session{endure::Session::Disabled()};
}

void endure_session_free(endure_session* session) { delete session; }

int endure_session_active(const endure_session* s) { return s && s->session->active() ? 1 : 0; }
int endure_session_rank(const endure_session* s) { return s ? s->session->rank() : 0; }
int64_t endure_session_generation(const endure_session* s) {
  return s ? s->session->generation() : 0;
}
int endure_session_memory_checkpoints(const endure_session* s) {
  return s && s->session->memory_checkpoints() ? 1 : 0;
}

void endure_declare_deterministic(endure_session* s) {
  if (s) s->session->DeclareDeterministic();
}

void endure_ready_at_unknown_step(endure_session* s, double restore_s, double init_s) {
  if (s) s->session->ReadyAtUnknownStep(restore_s, init_s);
}

void endure_ready(endure_session* s, int64_t start_step, double restore_s, double init_s) {
  if (s) s->session->Ready(start_step, restore_s, init_s);
}

void endure_begin_step(endure_session* s, int64_t step) {
  if (s) s->session->BeginStep(step);
}

double endure_end_step(endure_session* s, int64_t step, double loss, double compute_s,
                       double comm_s, double ckpt_stall_s, int64_t checkpoint_step) {
  if (!s) return loss;
  return s->session->EndStep(step, loss, compute_s, comm_s, ckpt_stall_s, checkpoint_step)
      .value_or(loss);
}

int endure_should_skip(const endure_session* s, int64_t step) {
  return s && s->session->ShouldSkip(step) ? 1 : 0;
}

void endure_end_skipped_step(endure_session* s, int64_t step, double ckpt_stall_s,
                             int64_t checkpoint_step) {
  if (s) s->session->EndSkippedStep(step, ckpt_stall_s, checkpoint_step);
}

void endure_set_tokens_per_step(endure_session* s, int64_t tokens) {
  if (s) s->session->SetTokensPerStep(tokens);
}

void endure_set_total_steps(endure_session* s, int64_t steps) {
  if (s) s->session->SetTotalSteps(steps);
}

double endure_seconds_since_process_start(void) { return endure::SecondsSinceProcessStart(); }

endure_status endure_phase(endure_session* s, const char* name) {
  if (s == nullptr || name == nullptr) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_phase: NULL argument");
  }
  return Guard([&] {
    endure::Status st = s->session->Phase(name);
    return st.ok() ? ENDURE_OK : Fail(st);
  });
}

const char* endure_current_phase(const endure_session* s) {
  return s ? s->session->current_phase().c_str() : "train";
}

int64_t endure_sdc_check_every(const endure_session* s) {
  return s ? s->session->sdc_check_every() : 0;
}

int endure_fingerprint_due(const endure_session* s, int64_t step) {
  return s && s->session->FingerprintDue(step) ? 1 : 0;
}

endure_status endure_report_fingerprint(endure_session* s, int64_t step, const char* fingerprint) {
  if (s == nullptr || fingerprint == nullptr) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_report_fingerprint: NULL argument");
  }
  return Guard([&] {
    endure::Status st = s->session->ReportFingerprint(step, fingerprint);
    return st.ok() ? ENDURE_OK : Fail(st);
  });
}

int endure_bitflip_due(endure_session* s, int64_t step, endure_bitflip* out) {
  if (s == nullptr || out == nullptr) return 0;
  std::optional<endure::BitFlip> flip = s->session->BitflipDue(step);
  if (!flip) return 0;
  *out = endure_bitflip{flip->tensor, flip->element, flip->bit};
  return 1;
}

int endure_flip_bit(const endure_bitflip* flip, void* data, int64_t numel, size_t element_bytes) {
  if (flip == nullptr) return 0;
  return endure::FlipBit(endure::BitFlip{flip->tensor, flip->element, flip->bit}, data, numel,
                         element_bytes)
             ? 1
             : 0;
}

void endure_before_collective(endure_session* s, int64_t step) {
  if (s) s->session->BeforeCollective(step);
}

endure_status endure_save_snapshot(endure_session* s, int64_t step, int shards,
                                   const char* meta_json, const endure_tensor* tensors,
                                   size_t count, int* saved) {
  if (s == nullptr || meta_json == nullptr || saved == nullptr || (count > 0 && !tensors)) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_save_snapshot: NULL argument");
  }
  return Guard([&] {
    std::vector<endure::TensorRef> refs;
    refs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const endure_tensor& t = tensors[i];
      if (t.name == nullptr || t.dtype == nullptr || (t.ndim > 0 && t.shape == nullptr)) {
        return Fail(ENDURE_INVALID_ARGUMENT,
                    "endure_save_snapshot: tensor " + std::to_string(i) + " has a NULL field");
      }
      refs.push_back(endure::TensorRef{
          t.name, t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim), t.data, t.bytes});
    }
    endure::Result<bool> r = s->session->SaveSnapshot(step, shards, meta_json, refs);
    if (!r.ok()) return Fail(r.status());
    *saved = *r ? 1 : 0;
    return ENDURE_OK;
  });
}

endure_status endure_fingerprint(const endure_tensor* tensors, size_t count, char out[17]) {
  if (out == nullptr || (count > 0 && tensors == nullptr)) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_fingerprint: NULL argument");
  }
  return Guard([&] {
    std::vector<endure::TensorRef> refs;
    refs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const endure_tensor& t = tensors[i];
      if (t.name == nullptr || (t.bytes > 0 && t.data == nullptr)) {
        return Fail(ENDURE_INVALID_ARGUMENT,
                    "endure_fingerprint: tensor " + std::to_string(i) + " has a NULL field");
      }
      refs.push_back(endure::TensorRef{t.name, t.dtype ? t.dtype : "", {}, t.data, t.bytes});
    }
    const std::string hex = endure::Fingerprint(refs);
    std::memcpy(out, hex.c_str(), hex.size() + 1);
    return ENDURE_OK;
  });
}

int64_t endure_restore_plan_step(const endure_session* s) {
  if (s == nullptr || !s->session->restore_plan()) return -1;
  return s->session->restore_plan()->step;
}

size_t endure_restore_plan_sources(const endure_session* s) {
  if (s == nullptr || !s->session->restore_plan()) return 0;
  return s->session->restore_plan()->sources.size();
}

int endure_restore_plan_loader(const endure_session* s, size_t index) {
  if (index >= endure_restore_plan_sources(s)) return -1;
  return s->session->restore_plan()->sources[index].loader_rank;
}

void endure_buffer_free(endure_buffer* buffer) {
  if (buffer == nullptr) return;
  std::free(buffer->data);
  buffer->data = nullptr;
  buffer->size = 0;
}

endure_status endure_read_restore_shard(const endure_session* s, size_t index, endure_buffer* out) {
  if (s == nullptr || out == nullptr) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_read_restore_shard: NULL argument");
  }
  out->data = nullptr;
  out->size = 0;
  return Guard([&] {
    endure::Result<std::string> bytes = s->session->ReadRestoreShard(index);
    if (!bytes.ok()) return Fail(bytes.status());
    out->data = static_cast<char*>(std::malloc(bytes->size() > 0 ? bytes->size() : 1));
    if (out->data == nullptr) return Fail(ENDURE_INTERNAL, "out of memory");
    std::memcpy(out->data, bytes->data(), bytes->size());
    out->size = bytes->size();
    return ENDURE_OK;
  });
}

endure_status endure_decode_shard(const char* bytes, size_t size, endure_shard** out) {
  if (out == nullptr || (size > 0 && bytes == nullptr)) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_decode_shard: NULL argument");
  }
  *out = nullptr;
  return Guard([&] {
    endure::Result<endure::StoredShard> shard =
        endure::DecodeShard(std::string_view(bytes, size), "shard");
    if (!shard.ok()) return Fail(shard.status());
    *out = new endure_shard{std::move(shard).value()};
    return ENDURE_OK;
  });
}

const char* endure_shard_meta_json(const endure_shard* shard) {
  return shard ? shard->shard.meta_json.c_str() : "";
}

size_t endure_shard_tensor_count(const endure_shard* shard) {
  return shard ? shard->shard.tensors.size() : 0;
}

endure_status endure_shard_tensor(const endure_shard* shard, size_t index, endure_tensor* out) {
  if (shard == nullptr || out == nullptr || index >= shard->shard.tensors.size()) {
    return Fail(ENDURE_INVALID_ARGUMENT, "endure_shard_tensor: no tensor " + std::to_string(index));
  }
  const endure::StoredTensor& t = shard->shard.tensors[index];
  *out = endure_tensor{t.name.c_str(), t.dtype.c_str(), t.shape.data(),
                       t.shape.size(), t.data.data(),   t.data.size()};
  return ENDURE_OK;
}

void endure_shard_free(endure_shard* shard) { delete shard; }

}  // extern "C"
