// endure._endure: the Python binding of the C++ client library
// (include/endure/client.h), so that Python programs speak to the agent
// through the same implementation as C++ ones. The Python-facing API is in
// python/endure/__init__.py and python/endure/torch.py; this module is its
// engine and is not meant to be used directly.
//
// Tensors cross as (name, dtype, shape, address, nbytes) tuples: the caller
// (endure.torch) keeps the tensors alive for the call, and the bytes are
// copied straight from them, without pickling. Calls that block (a step's
// faults, copies, file I/O) release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "endure/client.h"

namespace py = pybind11;

namespace {

using TensorTuple = std::tuple<std::string, std::string, std::vector<int64_t>, uintptr_t, size_t>;

// Raised for a checkpoint that fails verification (kDataLoss).
PyObject* g_data_loss_error = nullptr;

// Raises the Python exception for a failed Status.
[[noreturn]] void Raise(const endure::Status& status) {
  switch (status.code()) {
    case endure::StatusCode::kInvalidArgument:
      throw py::value_error(status.message());
    case endure::StatusCode::kDataLoss:
      PyErr_SetString(g_data_loss_error, status.message().c_str());
      throw py::error_already_set();
    case endure::StatusCode::kIOError:
    case endure::StatusCode::kNotFound:
    case endure::StatusCode::kUnavailable:
      PyErr_SetString(PyExc_OSError, status.message().c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(status.message());
  }
}

template <typename T>
T Unwrap(endure::Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

std::vector<endure::TensorRef> Refs(const std::vector<TensorTuple>& tensors) {
  std::vector<endure::TensorRef> refs;
  refs.reserve(tensors.size());
  for (const auto& [name, dtype, shape, address, bytes] : tensors) {
    refs.push_back(
        endure::TensorRef{name, dtype, shape, reinterpret_cast<const void*>(address), bytes});
  }
  return refs;
}

// A stored shard as (meta_json, [(name, dtype, shape, bytearray)]): the
// bytearrays are writable, so tensors can be made over them without a copy.
py::tuple ShardTuple(endure::StoredShard shard) {
  py::list tensors;
  for (endure::StoredTensor& t : shard.tensors) {
    tensors.append(
        py::make_tuple(t.name, t.dtype, t.shape, py::bytearray(t.data.data(), t.data.size())));
    std::string().swap(t.data);  // one copy at a time in memory
  }
  return py::make_tuple(shard.meta_json, tensors);
}

py::object PlanDict(const std::optional<endure::RestorePlan>& plan) {
  if (!plan) return py::none();
  py::list sources;
  for (const endure::RestoreSource& s : plan->sources) {
    py::dict d;
    d["shard"] = s.shard;
    d["tier"] = s.tier;
    d["node"] = s.node;
    d["loader_rank"] = s.loader_rank;
    d["description"] = s.description;
    sources.append(d);
  }
  py::dict d;
  d["step"] = plan->step;
  d["sources"] = sources;
  d["notes"] = plan->notes;
  d["summary"] = plan->summary;
  return d;
}

}  // namespace

PYBIND11_MODULE(_endure, m) {
  m.doc() = "Endure's client library (use the endure package, not this module)";
  static py::exception<std::runtime_error> data_loss(m, "DataLossError", PyExc_OSError);
  g_data_loss_error = data_loss.ptr();

  using endure::Session;
  py::class_<Session>(m, "Session")
      .def_static("from_env", [] { return Unwrap(Session::FromEnvironment()); })
      .def_static("disabled", &Session::Disabled)
      .def_property_readonly("active", &Session::active)
      .def_property_readonly("rank", &Session::rank)
      .def_property_readonly("generation", &Session::generation)
      .def_property_readonly("checkpoint_dir", &Session::checkpoint_dir)
      .def_property_readonly("checkpoint_every", &Session::checkpoint_every)
      .def_property_readonly("restore_step", &Session::restore_step)
      .def_property_readonly("memory_checkpoints", &Session::memory_checkpoints)
      .def_property_readonly("stacks_file", &Session::stacks_file)
      .def_property_readonly("skip_steps", &Session::skip_steps)
      .def_property_readonly("dropped", &Session::dropped)
      .def_property_readonly("restore_plan",
                             [](const Session& s) { return PlanDict(s.restore_plan()); })
      .def("read_restore_shard",
           [](const Session& s, size_t index) {
             endure::Result<std::string> bytes = [&] {
               py::gil_scoped_release release;
               return s.ReadRestoreShard(index);
             }();
             std::string data = Unwrap(std::move(bytes));
             return py::bytearray(data.data(), data.size());
           })
      .def("local_snapshot_steps", &Session::LocalSnapshotSteps)
      .def("read_local_snapshot",
           [](const Session& s, int64_t step) {
             endure::Result<std::string> bytes = [&] {
               py::gil_scoped_release release;
               return s.ReadLocalSnapshot(step);
             }();
             std::string data = Unwrap(std::move(bytes));
             return py::bytearray(data.data(), data.size());
           })
      .def("save_snapshot",
           [](Session& s, int64_t step, int shards, const std::string& meta_json,
              const std::vector<TensorTuple>& tensors) {
             std::vector<endure::TensorRef> refs = Refs(tensors);
             endure::Result<bool> saved = [&] {
               py::gil_scoped_release release;
               return s.SaveSnapshot(step, shards, meta_json, refs);
             }();
             return Unwrap(std::move(saved));
           })
      .def("phase",
           [](Session& s, const std::string& name) {
             endure::Status st = s.Phase(name);
             if (!st.ok()) Raise(st);
           })
      .def_property_readonly("current_phase", &Session::current_phase)
      .def_property_readonly("sdc_check_every", &Session::sdc_check_every)
      .def("fingerprint_due", &Session::FingerprintDue)
      .def("report_fingerprint",
           [](Session& s, int64_t step, const std::string& fingerprint) {
             endure::Status st = s.ReportFingerprint(step, fingerprint);
             if (!st.ok()) Raise(st);
           })
      // (tensor, element, bit) or None.
      .def("bitflip_due",
           [](Session& s, int64_t step) -> py::object {
             std::optional<endure::BitFlip> flip = s.BitflipDue(step);
             if (!flip) return py::none();
             return py::make_tuple(flip->tensor, flip->element, flip->bit);
           })
      .def("before_collective", &Session::BeforeCollective,
           py::call_guard<py::gil_scoped_release>())
      .def("should_skip", &Session::ShouldSkip)
      .def_property_readonly("rejoin_offered_here", &Session::rejoin_offered_here)
      .def_property_readonly("peer_restore", &Session::peer_restore)
      .def(
          "declare_rejoin",
          [](Session& s, bool from_tiers) {
            s.DeclareRejoin(from_tiers ? Session::RejoinRestore::kFromTiers
                                       : Session::RejoinRestore::kFromPeers);
          },
          py::arg("from_tiers") = false)
      .def("rejoin_pending", &Session::RejoinPending)
      // Waits up to `timeout_s` for an offer and takes it; False when none came.
      .def("rejoin",
           [](Session& s, double timeout_s) {
             endure::Status st = [&] {
               py::gil_scoped_release release;
               return s.Rejoin(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
             }();
             if (st.code() == endure::StatusCode::kUnavailable) return false;
             if (!st.ok()) Raise(st);
             return true;
           })
      .def("declare_deterministic", &Session::DeclareDeterministic)
      .def("set_tokens_per_step", &Session::SetTokensPerStep)
      .def("set_total_steps", &Session::SetTotalSteps)
      .def("announce_stack_signal",
           [](Session& s, int signal) {
             endure::Status st = s.AnnounceStackSignal(signal);
             if (!st.ok()) Raise(st);
           })
      .def("ready", &Session::Ready, py::call_guard<py::gil_scoped_release>())
      .def("ready_at_unknown_step", &Session::ReadyAtUnknownStep,
           py::call_guard<py::gil_scoped_release>())
      .def("begin_step", &Session::BeginStep, py::call_guard<py::gil_scoped_release>())
      .def("end_step", &Session::EndStep, py::call_guard<py::gil_scoped_release>())
      .def("end_skipped_step", &Session::EndSkippedStep, py::call_guard<py::gil_scoped_release>());

  m.def("seconds_since_process_start", &endure::SecondsSinceProcessStart);
  m.def("await_standby_assignment", &endure::AwaitStandbyAssignment,
        py::call_guard<py::gil_scoped_release>());
  // The process's C environment (which the library's setenv calls change,
  // and os.environ, a copy made at start-up, does not see).
  m.def("c_environ", [] {
    py::dict d;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      const size_t eq = entry.find('=');
      if (eq != std::string::npos && eq > 0) d[py::str(entry.substr(0, eq))] = entry.substr(eq + 1);
    }
    return d;
  });
  m.def("dtype_bytes", [](const std::string& dtype) { return endure::DTypeBytes(dtype); });
  m.def("partition_by_size", &endure::PartitionBySize);
  m.def("fingerprint", [](const std::vector<TensorTuple>& tensors) {
    std::vector<endure::TensorRef> refs = Refs(tensors);
    py::gil_scoped_release release;
    return endure::Fingerprint(refs);
  });
  // Flips (element, bit) of a contiguous tensor in place; whether it did.
  m.def("flip_bit",
        [](uintptr_t address, int64_t numel, size_t element_bytes, int64_t element, int bit) {
          return endure::FlipBit(endure::BitFlip{0, element, bit}, reinterpret_cast<void*>(address),
                                 numel, element_bytes);
        });
  m.def("decode_shard", [](py::bytes bytes, const std::string& source) {
    std::string_view view = bytes;
    return ShardTuple(Unwrap(endure::DecodeShard(view, source)));
  });
  m.def("decode_shard_bytearray", [](py::bytearray bytes, const std::string& source) {
    char* data = PyByteArray_AsString(bytes.ptr());
    const size_t size = static_cast<size_t>(PyByteArray_Size(bytes.ptr()));
    return ShardTuple(Unwrap(endure::DecodeShard(std::string_view(data, size), source)));
  });
  m.def("commit_checkpoint", [](const std::string& dir, int64_t step, const std::string& meta_json,
                                const std::vector<TensorTuple>& tensors, int keep) {
    std::vector<endure::TensorRef> refs = Refs(tensors);
    endure::Status st = [&] {
      py::gil_scoped_release release;
      return endure::CommitCheckpoint(dir, step, meta_json, refs, keep);
    }();
    if (!st.ok()) Raise(st);
  });
  m.def("load_newest_checkpoint", [](const std::string& dir, int64_t limit) {
    std::vector<std::string> refused;
    endure::Result<std::optional<endure::LoadedCheckpoint>> loaded = [&] {
      py::gil_scoped_release release;
      return endure::LoadNewestCheckpoint(dir, limit, &refused);
    }();
    std::optional<endure::LoadedCheckpoint> ckpt = Unwrap(std::move(loaded));
    py::object state = py::none();
    if (ckpt) state = py::make_tuple(ckpt->step, ShardTuple(std::move(ckpt->state)));
    return py::make_tuple(state, refused);
  });
  m.def("remove_checkpoints_after", [](const std::string& dir, int64_t step) {
    return Unwrap(endure::RemoveCheckpointsAfter(dir, step));
  });
}
