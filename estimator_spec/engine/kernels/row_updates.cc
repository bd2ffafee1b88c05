// The host embedding engine's compiled kernels (kernels/__init__.py builds
// and loads this file). Training uses them where the TensorFlow-op path
// would compute the same numbers:
//   HostEmbeddingExtremes     each feature's largest and smallest index and id;
//   HostEmbeddingDropNegativeIds  the ids of features without negative ones;
//   HostEmbeddingGatherRows   the rows of the step's ids, fetched ahead;
//   HostEmbeddingLookup       a table's distinct ids, their places and the
//                             combiners of its features, in one op;
//   HostEmbeddingCombine      the combiners of a table gathered by partition;
//   HostEmbeddingIdGradients  the per-id gradient sums of one table;
//   HostEmbeddingCheckIds     the input checks of every feature's ids;
//   HostEmbeddingCheckAll     the step's gate on every table's sums (finite);
//   HostEmbedding*Rows        in-place optimizer updates of the touched rows.
//
// One update op per optimizer rule. Each runs docs/numerics.md, 'The backward
// pass, table by table' and 'Each optimizer on a touched row' on the distinct
// row indices it is given, row by row, in the order of the graph-op path:
//   gradient clip   g = max(min(g, grad_hi), grad_lo)          (clip_gradients)
//   weight decay    w = w - factor * w                          (decay)
//   the rule        Adagrad: a = a + g*g; w = w - (lr*g)/sqrt(a)
//                   SGD:     w = w - lr*g
//   weight clip     w = max(min(w, weight_hi), weight_lo)      (clip_weights)
// Every operation is one float32 IEEE operation in that order (the build
// turns off contraction into fused multiply-adds), so the results equal the
// graph-op path bit for bit.
//
// The table and slot rows are read and written under the variables' locks,
// taken in address order. A variable whose buffer is shared with a tensor
// still alive elsewhere is copied first (copy on write), and the variable is
// put in copy-on-read mode, as TensorFlow's own sparse updates do: readers
// then copy, and later updates write in place.

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::Var;
namespace errors = tensorflow::errors;

// The pipeline steps around a rule, as the op's attributes and inputs give
// them.
struct Pipeline {
  bool clip_gradients = false;
  bool decay = false;
  bool clip_weights = false;
  float grad_lo = 0, grad_hi = 0, factor = 0, weight_lo = 0, weight_hi = 0;
};

// Adagrad: one slot, the accumulator.
struct AdagradRule {
  static constexpr int kSlots = 1;
  static inline float Apply(float w, float g, float lr, float** slots,
                            int64_t j) {
    const float a = slots[0][j] + g * g;
    slots[0][j] = a;
    return w - (lr * g) / std::sqrt(a);
  }
};

// Stochastic gradient descent: no slot.
struct SgdRule {
  static constexpr int kSlots = 0;
  static inline float Apply(float w, float g, float lr, float**, int64_t) {
    return w - lr * g;
  }
};

// Rows are touched at random: each is a cache miss. Asking for the rows
// kAhead positions on while updating this one keeps that many misses in
// flight instead of one.
constexpr int64_t kAhead = 32;

inline void PrefetchRow(const float* row, int64_t dim) {
  const char* begin = reinterpret_cast<const char*>(row);
  const char* end = reinterpret_cast<const char*>(row + dim);
  for (const char* line = begin; line < end; line += 64) {
    __builtin_prefetch(line, 1, 3);
  }
}

template <int kSlots>
inline void PrefetchRows(int64_t row, int64_t dim, const float* table,
                         float* const* slots) {
  PrefetchRow(table + row * dim, dim);
  for (int s = 0; s < kSlots; ++s) PrefetchRow(slots[s] + row * dim, dim);
}

// The hot loops (the row updates, the combiners' sums, the per-id gradient
// sums and their finite check, the ids' extremes and range checks, the
// examples' copy) are compiled twice on x86-64: for the baseline
// instruction set and for AVX2 (eight floats per instruction instead of
// four), and the AVX2 copy runs where the CPU has it. Both compute the same
// IEEE float operations in the same order for every element (the loops
// vectorize across a row's columns, or compare and copy integers, and the
// build allows no contraction into fused multiply-adds), so the results are
// the same bits. The environment variable HOST_EMBEDDING_KERNELS_BASELINE
// (set, to anything) keeps the baseline copies: how the tests run them on a
// machine with AVX2.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ESTIMATOR_SPEC_AVX2 1
#define ESTIMATOR_SPEC_INLINE inline __attribute__((always_inline))
inline bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          std::getenv("HOST_EMBEDDING_KERNELS_BASELINE") ==
                              nullptr;
  return has;
}
#else
#define ESTIMATOR_SPEC_INLINE inline
#endif

// Rows are read at random over the whole table: with 4 KiB pages, a table
// larger than what the TLB maps costs a page walk per row besides the cache
// miss. The first time a kernel meets a table or slot buffer of at least
// kHugeBytes, it asks Linux to back the buffer's whole 2 MiB blocks with
// huge pages (MADV_HUGEPAGE, then MADV_COLLAPSE, which moves the pages
// already there, keeping their contents; about 2 s per GB, once). It is
// advice: where the system refuses it (no transparent huge pages, an older
// kernel, no free huge page), nothing changes but the speed.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeBytes = 2 * kHugePage;
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

void AdviseHugePages(const Tensor* buffer) {
#ifdef __linux__
  const size_t bytes = buffer->TotalBytes();
  if (bytes < kHugeBytes) return;
  const uintptr_t data = reinterpret_cast<uintptr_t>(buffer->data());
  static std::mutex mu;
  static std::set<std::pair<uintptr_t, size_t>>* seen =
      new std::set<std::pair<uintptr_t, size_t>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen->insert({data, bytes}).second) return;
  }
  const uintptr_t begin = (data + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (data + bytes) & ~(kHugePage - 1);
  if (end <= begin) return;
  void* start = reinterpret_cast<void*>(begin);
  if (madvise(start, end - begin, MADV_HUGEPAGE) == 0) {
    madvise(start, end - begin, MADV_COLLAPSE);
  }
#endif
}

// Copies the rows ids[0..n) of a table `w` of `dim` columns into `out`, one
// after another, asking for each row kAhead positions before its copy.
template <typename Index>
void CopyRows(const float* w, int64_t dim, const Index* ids, int64_t n,
              float* out) {
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    PrefetchRow(w + static_cast<int64_t>(ids[i]) * dim, dim);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      PrefetchRow(w + static_cast<int64_t>(ids[i + kAhead]) * dim, dim);
    }
    std::memcpy(out + i * dim, w + static_cast<int64_t>(ids[i]) * dim,
                dim * sizeof(float));
  }
}

// Whether every v[i], i < n, is in [0, bound): one pass without an early
// exit, which the compiler vectorizes. Compared as unsigned numbers of T's
// width, a negative value is at least 2^(bits - 1), so a bound clamped to
// that refuses it too.
template <typename T>
using UnsignedOf = typename std::make_unsigned<T>::type;

template <typename T>
ESTIMATOR_SPEC_INLINE bool AllInRangeLoop(const T* v, int64_t n,
                                          UnsignedOf<T> limit) {
  UnsignedOf<T> outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    outside |= static_cast<UnsignedOf<T>>(v[i]) >= limit;
  }
  return outside == 0;
}

template <typename T>
bool AllInRangeBaseline(const T* v, int64_t n, UnsignedOf<T> limit) {
  return AllInRangeLoop(v, n, limit);
}

#ifdef ESTIMATOR_SPEC_AVX2
template <typename T>
__attribute__((target("avx2"))) bool AllInRangeAvx2(const T* v, int64_t n,
                                                     UnsignedOf<T> limit) {
  return AllInRangeLoop(v, n, limit);
}
#endif

template <typename T>
bool AllInRange(const T* v, int64_t n, int64_t bound) {
  static_assert(std::is_signed<T>::value, "signed values");
  if (bound <= 0) return n == 0;
  const uint64_t top = static_cast<uint64_t>(std::numeric_limits<T>::max());
  const UnsignedOf<T> limit = static_cast<UnsignedOf<T>>(
      std::min(static_cast<uint64_t>(bound), top + 1));
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) return AllInRangeAvx2(v, n, limit);
#endif
  return AllInRangeBaseline(v, n, limit);
}

// The first i < n with v[i] outside [0, bound), or n: the vectorized pass
// (AllInRange), and a search for the value outside only when there is one.
template <typename T>
int64_t FirstOutside(const T* v, int64_t n, int64_t bound) {
  if (AllInRange(v, n, bound)) return n;
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] < 0 || v[i] >= bound) return i;
  }
  return n;
}

// o[j] = o[j] * m for j < n when `multiply`; then whether every o[j] is
// finite (its exponent bits not all ones), in one vectorized pass each.
ESTIMATOR_SPEC_INLINE bool ScaleAllFiniteLoop(float* o, int64_t n, float m,
                                              bool multiply) {
  if (multiply) {
    for (int64_t j = 0; j < n; ++j) o[j] = o[j] * m;
  }
  uint32_t special = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, o + j, sizeof(bits));
    special |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return special == 0;
}

bool ScaleAllFiniteBaseline(float* o, int64_t n, float m, bool multiply) {
  return ScaleAllFiniteLoop(o, n, m, multiply);
}

#ifdef ESTIMATOR_SPEC_AVX2
__attribute__((target("avx2"))) bool ScaleAllFiniteAvx2(float* o, int64_t n,
                                                        float m,
                                                        bool multiply) {
  return ScaleAllFiniteLoop(o, n, m, multiply);
}
#endif

bool ScaleAllFinite(float* o, int64_t n, float m, bool multiply) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) return ScaleAllFiniteAvx2(o, n, m, multiply);
#endif
  return ScaleAllFiniteBaseline(o, n, m, multiply);
}

// out[i] = indices[i * width] as int32 for i < n: a SparseTensor's
// examples, the combiners' segments (width 2, the usual one, known to the
// compiler: it vectorizes the loop).
ESTIMATOR_SPEC_INLINE void FirstColumnLoop(const int64_t* indices, int64_t n,
                                           int64_t width, int32_t* out) {
  if (width == 2) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(indices[2 * i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(indices[i * width]);
    }
  }
}

void FirstColumnBaseline(const int64_t* indices, int64_t n, int64_t width,
                         int32_t* out) {
  FirstColumnLoop(indices, n, width, out);
}

#ifdef ESTIMATOR_SPEC_AVX2
__attribute__((target("avx2"))) void FirstColumnAvx2(const int64_t* indices,
                                                     int64_t n, int64_t width,
                                                     int32_t* out) {
  FirstColumnLoop(indices, n, width, out);
}
#endif

void FirstColumn(const int64_t* indices, int64_t n, int64_t width,
                 int32_t* out) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) {
    FirstColumnAvx2(indices, n, width, out);
    return;
  }
#endif
  FirstColumnBaseline(indices, n, width, out);
}

// Whether `variable` holds a table: initialized, a float32 matrix.
absl::Status CheckTable(const Var* variable, const char* what) {
  const Tensor* values = const_cast<Var*>(variable)->tensor();
  if (!variable->is_initialized) {
    return errors::FailedPrecondition(what, " is not initialized");
  }
  if (values->dtype() != tensorflow::DT_FLOAT || values->dims() != 2) {
    return errors::InvalidArgument(
        what, " must be a float32 matrix; got ",
        tensorflow::DataTypeString(values->dtype()), " ",
        values->shape().DebugString());
  }
  return absl::OkStatus();
}

// Whether every one of the `n` row indices is inside [0, rows).
template <typename Index>
absl::Status CheckIndices(const Index* ids, int64_t n, int64_t rows) {
  const int64_t i = FirstOutside(ids, n, rows);
  if (i == n) return absl::OkStatus();
  return errors::InvalidArgument("row index ", ids[i], " at ", i,
                                 " is outside [0, ", rows, ")");
}

// Whether feature f's `segments` (a vector) each lie in [0, count), and its
// `weights` are empty (none) or one per segment entry.
absl::Status CheckSegments(int f, const Tensor& segments,
                           const Tensor& weights, int64_t count) {
  const int64_t n = segments.NumElements();
  if (segments.dims() != 1 ||
      (weights.NumElements() != 0 && weights.NumElements() != n)) {
    return errors::InvalidArgument(
        "feature ", f, ": segments and weights must be vectors of one length "
        "(weights may be empty)");
  }
  const int32_t* seg = segments.flat<int32_t>().data();
  const int64_t i = FirstOutside(seg, n, count);
  if (i == n) return absl::OkStatus();
  return errors::InvalidArgument("feature ", f, ": segment ", seg[i], " at ",
                                 i, " is outside [0, ", count, ")");
}

// The rule on rows ids[0..n) of `w` and its slots (`slot_base`), with the
// gradient rows `g` (one per id) and the pipeline steps around it; `clipped`
// holds `dim` floats of scratch.
template <typename Rule, typename Index>
ESTIMATOR_SPEC_INLINE void UpdateRowsLoop(const Pipeline& pipe, float lr,
                                          const Index* ids, int64_t n,
                                          int64_t dim, float* w,
                                          float* const* slot_base,
                                          const float* g, float* clipped) {
  float* slot_rows[Rule::kSlots + 1];
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    PrefetchRows<Rule::kSlots>(ids[i], dim, w, slot_base);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      PrefetchRows<Rule::kSlots>(ids[i + kAhead], dim, w, slot_base);
    }
    const int64_t row = static_cast<int64_t>(ids[i]);
    float* w_row = w + row * dim;
    for (int s = 0; s < Rule::kSlots; ++s) {
      slot_rows[s] = slot_base[s] + row * dim;
    }
    const float* g_row = g + i * dim;
    if (pipe.clip_gradients) {
      for (int64_t j = 0; j < dim; ++j) {
        clipped[j] = std::max(std::min(g_row[j], pipe.grad_hi), pipe.grad_lo);
      }
      g_row = clipped;
    }
    for (int64_t j = 0; j < dim; ++j) {
      float value = w_row[j];
      if (pipe.decay) value = value - pipe.factor * value;
      value = Rule::Apply(value, g_row[j], lr, slot_rows, j);
      if (pipe.clip_weights) {
        value = std::max(std::min(value, pipe.weight_hi), pipe.weight_lo);
      }
      w_row[j] = value;
    }
  }
}

template <typename Rule, typename Index>
void UpdateRowsBaseline(const Pipeline& pipe, float lr, const Index* ids,
                        int64_t n, int64_t dim, float* w,
                        float* const* slot_base, const float* g,
                        float* clipped) {
  UpdateRowsLoop<Rule, Index>(pipe, lr, ids, n, dim, w, slot_base, g,
                              clipped);
}

#ifdef ESTIMATOR_SPEC_AVX2
template <typename Rule, typename Index>
__attribute__((target("avx2"))) void UpdateRowsAvx2(
    const Pipeline& pipe, float lr, const Index* ids, int64_t n, int64_t dim,
    float* w, float* const* slot_base, const float* g, float* clipped) {
  UpdateRowsLoop<Rule, Index>(pipe, lr, ids, n, dim, w, slot_base, g,
                              clipped);
}
#endif

template <typename Rule, typename Index>
void UpdateRows(const Pipeline& pipe, float lr, const Index* ids, int64_t n,
                int64_t dim, float* w, float* const* slot_base,
                const float* g, float* clipped) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) {
    UpdateRowsAvx2<Rule, Index>(pipe, lr, ids, n, dim, w, slot_base, g,
                                clipped);
    return;
  }
#endif
  UpdateRowsBaseline<Rule, Index>(pipe, lr, ids, n, dim, w, slot_base, g,
                                  clipped);
}

template <typename Rule, typename Index>
class RowUpdateOp : public OpKernel {
 public:
  explicit RowUpdateOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context,
                   context->GetAttr("clip_gradients", &pipe_.clip_gradients));
    OP_REQUIRES_OK(context, context->GetAttr("decay", &pipe_.decay));
    OP_REQUIRES_OK(context,
                   context->GetAttr("clip_weights", &pipe_.clip_weights));
  }

  void Compute(OpKernelContext* context) override {
    constexpr int kVariables = 1 + Rule::kSlots;
    std::vector<tensorflow::core::RefCountPtr<Var>> variables(kVariables);
    for (int i = 0; i < kVariables; ++i) {
      OP_REQUIRES_OK(context, tensorflow::LookupResource(
                                  context, tensorflow::HandleFromInput(context, i),
                                  &variables[i]));
    }
    const Tensor& indices = context->input(kVariables);
    const Tensor& grad = context->input(kVariables + 1);
    Pipeline pipe = pipe_;
    float lr = 0;
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 2, "lr", &lr));
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 3, "grad_lo",
                                   &pipe.grad_lo));
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 4, "grad_hi",
                                   &pipe.grad_hi));
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 5, "factor",
                                   &pipe.factor));
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 6, "weight_lo",
                                   &pipe.weight_lo));
    OP_REQUIRES_OK(context, Scalar(context, kVariables + 7, "weight_hi",
                                   &pipe.weight_hi));
    OP_REQUIRES(context, indices.dims() == 1,
                errors::InvalidArgument("indices must be a vector; got shape ",
                                        indices.shape().DebugString()));
    OP_REQUIRES(context,
                grad.dims() == 2 && grad.dim_size(0) == indices.dim_size(0),
                errors::InvalidArgument(
                    "grad must be [len(indices), dimension]; got shape ",
                    grad.shape().DebugString(), " for ",
                    indices.dim_size(0), " indices"));

    // Locks in address order (no deadlock with another op locking the same
    // variables).
    std::vector<tensorflow::mutex*> mutexes;
    for (auto& variable : variables) mutexes.push_back(variable->mu());
    std::sort(mutexes.begin(), mutexes.end());
    mutexes.erase(std::unique(mutexes.begin(), mutexes.end()), mutexes.end());
    std::vector<std::unique_ptr<tensorflow::mutex_lock>> locks;
    for (auto* mu : mutexes) {
      locks.push_back(std::make_unique<tensorflow::mutex_lock>(*mu));
    }

    OP_REQUIRES_OK(context, CheckTable(variables[0].get(), "the table"));
    const Tensor* table = variables[0]->tensor();
    const int64_t rows = table->dim_size(0);
    const int64_t dim = table->dim_size(1);
    OP_REQUIRES(context, grad.dim_size(1) == dim,
                errors::InvalidArgument("grad has ", grad.dim_size(1),
                                        " columns; the table has ", dim));
    for (int i = 1; i < kVariables; ++i) {
      OP_REQUIRES_OK(context, CheckTable(variables[i].get(), "a slot"));
      OP_REQUIRES(context, variables[i]->tensor()->shape() == table->shape(),
                  errors::InvalidArgument(
                      "slot variable ", i, " has shape ",
                      variables[i]->tensor()->shape().DebugString(),
                      "; the table's is ", table->shape().DebugString()));
    }
    const Index* ids = indices.flat<Index>().data();
    const int64_t n = indices.dim_size(0);
    // Every index is checked before anything is written.
    OP_REQUIRES_OK(context, CheckIndices(ids, n, rows));
    for (auto& variable : variables) {
      OP_REQUIRES_OK(context, Writable(context, variable.get()));
      AdviseHugePages(variable->tensor());
    }

    float* w = variables[0]->tensor()->flat<float>().data();
    float* slot_base[kVariables];
    for (int i = 1; i < kVariables; ++i) {
      slot_base[i - 1] = variables[i]->tensor()->flat<float>().data();
    }
    const float* g = grad.flat<float>().data();
    // One thread: the engine runs one such op per table partition at once,
    // on the inter-op threads; splitting one over the others' threads makes
    // it wait for them.
    std::vector<float> clipped(dim);
    UpdateRows<Rule, Index>(pipe, lr, ids, n, dim, w, slot_base, g,
                            clipped.data());
  }

 private:
  static absl::Status Scalar(OpKernelContext* context, int index,
                             const char* name, float* out) {
    const Tensor& value = context->input(index);
    if (value.dims() != 0) {
      return errors::InvalidArgument(name, " must be a scalar; got shape ",
                                     value.shape().DebugString());
    }
    *out = value.scalar<float>()();
    return absl::OkStatus();
  }

  static absl::Status Writable(OpKernelContext* context, Var* var) {
    var->copy_on_read_mode.store(true);
    if (var->tensor()->RefCountIsOne()) return absl::OkStatus();
    Tensor copy;
    TF_RETURN_IF_ERROR(context->allocate_temp(
        var->tensor()->dtype(), var->tensor()->shape(), &copy));
    std::memcpy(copy.data(), var->tensor()->data(),
                var->tensor()->TotalBytes());
    *var->tensor() = copy;
    return absl::OkStatus();
  }

  Pipeline pipe_;
};

// Rows of a table at (possibly repeated) indices, read under the table's
// lock: what ResourceGather computes, with the rows fetched ahead.
template <typename Index>
class GatherRowsOp : public OpKernel {
 public:
  explicit GatherRowsOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    tensorflow::core::RefCountPtr<Var> variable;
    OP_REQUIRES_OK(context, tensorflow::LookupResource(
                                context, tensorflow::HandleFromInput(context, 0),
                                &variable));
    const Tensor& indices = context->input(1);
    OP_REQUIRES(context, indices.dims() == 1,
                errors::InvalidArgument("indices must be a vector; got shape ",
                                        indices.shape().DebugString()));
    tensorflow::tf_shared_lock lock(*variable->mu());
    OP_REQUIRES_OK(context, CheckTable(variable.get(), "the table"));
    const Tensor* table = variable->tensor();
    AdviseHugePages(table);
    const int64_t rows = table->dim_size(0);
    const int64_t dim = table->dim_size(1);
    const int64_t n = indices.dim_size(0);
    const Index* ids = indices.flat<Index>().data();
    OP_REQUIRES_OK(context, CheckIndices(ids, n, rows));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({n, dim}), &out));
    CopyRows(table->flat<float>().data(), dim, ids, n,
             out->flat<float>().data());
  }
};

REGISTER_OP("HostEmbeddingGatherRows")
    .Input("table: resource")
    .Input("indices: Tindices")
    .Output("rows: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Matrix(c->Dim(c->input(1), 0), c->UnknownDim()));
      return absl::OkStatus();
    });

// A kernel template over the index type, registered for int32 and int64.
#define ESTIMATOR_SPEC_REGISTER_BY_INDEX(NAME, KERNEL)                       \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                         \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<int32_t>("Tindices"),          \
                          KERNEL<int32_t>);                                  \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                         \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<int64_t>("Tindices"),          \
                          KERNEL<int64_t>)

ESTIMATOR_SPEC_REGISTER_BY_INDEX("HostEmbeddingGatherRows", GatherRowsOp);

// A hash of an id that spreads neighbouring and patterned ids over the
// slots of a power-of-two table (the finalizer of a 64-bit mixing hash).
inline uint64_t MixId(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The distinct ids of several vectors of ids (feature f's: ids_of(f), a
// (pointer, count) pair; `total` ids in all), in order of first occurrence:
// `distinct` gets each id once, where[k] the position in it of the k-th id
// (counting feature after feature), and on_new(id) runs when an id is met
// for the first time. Open addressing: slot -> place in `distinct` (-1:
// free), at most half full.
template <typename Index, typename IdsOf, typename OnNew>
void FindDistinct(int features, IdsOf ids_of, int64_t total, int32_t* where,
                  std::vector<Index>* distinct, OnNew on_new) {
  int64_t capacity = 16;
  while (capacity < 2 * total) capacity *= 2;
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  std::vector<int32_t> slots(capacity, -1);
  distinct->clear();
  distinct->reserve(total);
  int64_t k = 0;
  for (int f = 0; f < features; ++f) {
    const std::pair<const Index*, int64_t> piece = ids_of(f);
    const Index* id = piece.first;
    for (int64_t i = 0; i < piece.second; ++i, ++k) {
      uint64_t h = MixId(static_cast<uint64_t>(id[i])) & mask;
      while (true) {
        const int32_t place = slots[h];
        if (place < 0) {
          slots[h] = static_cast<int32_t>(distinct->size());
          where[k] = slots[h];
          distinct->push_back(id[i]);
          on_new(id[i]);
          break;
        }
        if ((*distinct)[place] == id[i]) {
          where[k] = place;
          break;
        }
        h = (h + 1) & mask;
      }
    }
  }
}

// The largest and smallest value of each column of several int64 tensors
// ([n] or [n, k], the same k for all): for feature f, largest[f] and
// smallest[f] (k values each). A tensor without rows gives the int64
// extremes (largest: the lowest value, smallest: the highest), as TF's
// reductions of an empty tensor do.
//
// A tensor of width 1 (ids) or 2 (a SparseTensor's indices) is read once, in
// order, into running extremes kept in locals (the compiler keeps them in
// registers and vectorizes the loop, which it cannot when the outputs might
// alias the input; 64-bit comparisons need more than the x86-64 baseline:
// the AVX2 copy is the fast one). Other widths are read column by column.
ESTIMATOR_SPEC_INLINE void TensorExtremesLoop(const int64_t* v, int64_t rows,
                                              int64_t width, int64_t* hi,
                                              int64_t* lo) {
  if (width == 1) {
    int64_t h = hi[0], l = lo[0];
    for (int64_t i = 0; i < rows; ++i) {
      h = std::max(h, v[i]);
      l = std::min(l, v[i]);
    }
    hi[0] = h;
    lo[0] = l;
  } else if (width == 2) {
    int64_t h0 = hi[0], h1 = hi[1], l0 = lo[0], l1 = lo[1];
    for (int64_t i = 0; i < rows; ++i) {
      h0 = std::max(h0, v[2 * i]);
      l0 = std::min(l0, v[2 * i]);
      h1 = std::max(h1, v[2 * i + 1]);
      l1 = std::min(l1, v[2 * i + 1]);
    }
    hi[0] = h0;
    hi[1] = h1;
    lo[0] = l0;
    lo[1] = l1;
  } else {
    for (int64_t j = 0; j < width; ++j) {
      int64_t h = hi[j], l = lo[j];
      for (int64_t i = 0; i < rows; ++i) {
        h = std::max(h, v[i * width + j]);
        l = std::min(l, v[i * width + j]);
      }
      hi[j] = h;
      lo[j] = l;
    }
  }
}

void TensorExtremesBaseline(const int64_t* v, int64_t rows, int64_t width,
                            int64_t* hi, int64_t* lo) {
  TensorExtremesLoop(v, rows, width, hi, lo);
}

#ifdef ESTIMATOR_SPEC_AVX2
__attribute__((target("avx2"))) void TensorExtremesAvx2(
    const int64_t* v, int64_t rows, int64_t width, int64_t* hi,
    int64_t* lo) {
  TensorExtremesLoop(v, rows, width, hi, lo);
}
#endif

// hi[j] = max(hi[j], column j of v), lo[j] = min(lo[j], column j of v) for
// v [rows, width].
void TensorExtremes(const int64_t* v, int64_t rows, int64_t width,
                    int64_t* hi, int64_t* lo) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) {
    TensorExtremesAvx2(v, rows, width, hi, lo);
    return;
  }
#endif
  TensorExtremesBaseline(v, rows, width, hi, lo);
}

class ExtremesOp : public OpKernel {
 public:
  explicit ExtremesOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList values;
    OP_REQUIRES_OK(context, context->input_list("values", &values));
    const int features = values.size();
    const int64_t width = values[0].dims() == 2 ? values[0].dim_size(1) : 1;
    for (int f = 0; f < features; ++f) {
      const Tensor& value = values[f];
      const int64_t columns = value.dims() == 2 ? value.dim_size(1) : 1;
      OP_REQUIRES(context,
                  (value.dims() == 1 || value.dims() == 2) && columns == width,
                  errors::InvalidArgument(
                      "values[", f, "] must be a vector or a matrix of ",
                      width, " columns; got shape ",
                      value.shape().DebugString()));
    }
    Tensor *largest = nullptr, *smallest = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({features, width}),
                                &largest));
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, tensorflow::TensorShape({features, width}),
                                &smallest));
    int64_t* hi = largest->flat<int64_t>().data();
    int64_t* lo = smallest->flat<int64_t>().data();
    std::fill(hi, hi + features * width,
              std::numeric_limits<int64_t>::lowest());
    std::fill(lo, lo + features * width, std::numeric_limits<int64_t>::max());
    for (int f = 0; f < features; ++f) {
      const int64_t rows = width ? values[f].NumElements() / width : 0;
      TensorExtremes(values[f].flat<int64_t>().data(), rows, width,
                     &hi[f * width], &lo[f * width]);
    }
  }
};

REGISTER_OP("HostEmbeddingExtremes")
    .Input("values: F * int64")
    .Output("largest: int64")
    .Output("smallest: int64")
    .Attr("F: int >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int features = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("F", &features));
      const auto first = c->input(0);
      const auto width = c->RankKnown(first) && c->Rank(first) == 2
                             ? c->Dim(first, 1)
                             : (c->RankKnown(first) ? c->MakeDim(1)
                                                    : c->UnknownDim());
      c->set_output(0, c->Matrix(features, width));
      c->set_output(1, c->Matrix(features, width));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingExtremes").Device(DEVICE_CPU),
                        ExtremesOp);

// The ids of several features without their negative ids (with
// use_safe_embedding_lookup, negative ids are dropped before a lookup): for
// each feature f, the entries i of indices_f [n, 2], ids_f [n] and weights_f
// [n] (empty: none) where ids_f[i] >= 0, in order. A feature without a
// negative id passes its tensors through uncopied. smallest [F]: each
// feature's smallest id (HostEmbeddingExtremes'), or any lower bound of it:
// a feature whose bound is not negative passes through without its ids
// being read again. kept_examples_f: the first column of kept_indices_f (the
// example of each kept id) as int32, the combiners' segments.
class DropNegativeIdsOp : public OpKernel {
 public:
  explicit DropNegativeIdsOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList indices, ids, weights;
    OP_REQUIRES_OK(context, context->input_list("indices", &indices));
    OP_REQUIRES_OK(context, context->input_list("ids", &ids));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    const int features = ids.size();
    const Tensor& smallest = context->input(3 * features);
    OP_REQUIRES(context,
                smallest.dims() == 1 && smallest.NumElements() == features,
                errors::InvalidArgument(
                    "smallest must be a vector of one id per feature (",
                    features, "); got shape ",
                    smallest.shape().DebugString()));
    const auto bound = smallest.flat<int64_t>();
    for (int f = 0; f < features; ++f) {
      const int64_t n = ids[f].NumElements();
      OP_REQUIRES(context,
                  ids[f].dims() == 1 && indices[f].dims() == 2 &&
                      indices[f].dim_size(0) == n &&
                      indices[f].dim_size(1) >= 1 &&
                      (weights[f].NumElements() == 0 ||
                       weights[f].NumElements() == n),
                  errors::InvalidArgument(
                      "feature ", f, ": indices must be [n, k >= 1] for n "
                      "ids, weights empty or n"));
      const int64_t* id = ids[f].flat<int64_t>().data();
      int64_t kept = n;
      if (bound(f) < 0) {
        kept = 0;
        for (int64_t i = 0; i < n; ++i) kept += id[i] >= 0;
      }
      const int64_t width = indices[f].dim_size(1);
      const int64_t* in_index = indices[f].flat<int64_t>().data();
      Tensor* out_examples = nullptr;
      OP_REQUIRES_OK(context, context->allocate_output(
                                  3 * features + f,
                                  tensorflow::TensorShape({kept}),
                                  &out_examples));
      int32_t* example = out_examples->flat<int32_t>().data();
      if (kept == n) {
        context->set_output(f, indices[f]);
        context->set_output(features + f, ids[f]);
        context->set_output(2 * features + f, weights[f]);
        FirstColumn(in_index, n, width, example);
        continue;
      }
      const bool weighted = weights[f].NumElements() > 0;
      Tensor *out_indices = nullptr, *out_ids = nullptr,
             *out_weights = nullptr;
      OP_REQUIRES_OK(context, context->allocate_output(
                                  f, tensorflow::TensorShape({kept, width}),
                                  &out_indices));
      OP_REQUIRES_OK(context, context->allocate_output(
                                  features + f,
                                  tensorflow::TensorShape({kept}), &out_ids));
      OP_REQUIRES_OK(context,
                     context->allocate_output(
                         2 * features + f,
                         tensorflow::TensorShape({weighted ? kept : 0}),
                         &out_weights));
      const float* in_weight =
          weighted ? weights[f].flat<float>().data() : nullptr;
      int64_t* o_index = out_indices->flat<int64_t>().data();
      int64_t* o_id = out_ids->flat<int64_t>().data();
      float* o_weight = weighted ? out_weights->flat<float>().data() : nullptr;
      int64_t k = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (id[i] < 0) continue;
        std::memcpy(o_index + k * width, in_index + i * width,
                    width * sizeof(int64_t));
        o_id[k] = id[i];
        example[k] = static_cast<int32_t>(in_index[i * width]);
        if (weighted) o_weight[k] = in_weight[i];
        ++k;
      }
    }
  }
};

REGISTER_OP("HostEmbeddingDropNegativeIds")
    .Input("indices: F * int64")
    .Input("ids: F * int64")
    .Input("weights: F * float")
    .Input("smallest: int64")
    .Output("kept_indices: F * int64")
    .Output("kept_ids: F * int64")
    .Output("kept_weights: F * float")
    .Output("kept_examples: F * int32")
    .Attr("F: int >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int features = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("F", &features));
      for (int f = 0; f < features; ++f) {
        c->set_output(f, c->Matrix(c->UnknownDim(), c->Dim(c->input(f), 1)));
        c->set_output(features + f, c->Vector(c->UnknownDim()));
        c->set_output(2 * features + f, c->Vector(c->UnknownDim()));
        c->set_output(3 * features + f, c->Vector(c->UnknownDim()));
      }
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingDropNegativeIds")
                            .Device(DEVICE_CPU),
                        DropNegativeIdsOp);

// The combiners of one table's features (docs/numerics.md, 'Lookup'). For
// feature f, in the order of its ids i (id k, counting the ids of every
// feature, feature after feature), with row(f, i, k) the table's row of that
// id,
//   out_f[segment_f[i]] += row(f, i, k) * weight_f[i]  (no product: no
//                                                        weights)
// from zeros; for `mean` and `sqrtn` the scale per segment s is
//   c[s] = 1 / sum(w)  or  1 / sqrt(sum(w*w))      (0 where the sum is 0)
// with w = 1 for unweighted features, and out_f[s] is multiplied by c[s].
// `scales` gives c per feature (empty for `sum`), for the backward pass.
// These are the float operations, in order, of a multiplication, an
// unsorted segment sum, the sums of the weights and a divide_no_nan.
enum class Combiner { kSum, kMean, kSqrtn };

absl::Status ParseCombiners(OpKernelConstruction* context,
                            std::vector<Combiner>* out) {
  std::vector<std::string> names;
  TF_RETURN_IF_ERROR(context->GetAttr("combiners", &names));
  for (const auto& name : names) {
    if (name != "sum" && name != "mean" && name != "sqrtn") {
      return errors::InvalidArgument("unknown combiner ", name);
    }
    out->push_back(name == "sum" ? Combiner::kSum
                                 : (name == "mean" ? Combiner::kMean
                                                   : Combiner::kSqrtn));
  }
  return absl::OkStatus();
}

// Whether the combiners' inputs agree: one combiner per feature, each
// num_segments a scalar >= 0 and each feature's segments inside it (see
// CheckSegments). `total` is set to the number of ids of all features.
absl::Status CheckCombineInputs(const std::vector<Combiner>& combiners,
                                const tensorflow::OpInputList& segments,
                                const tensorflow::OpInputList& weights,
                                const tensorflow::OpInputList& num_segments,
                                int64_t* total) {
  if (combiners.size() != static_cast<size_t>(segments.size())) {
    return errors::InvalidArgument("one combiner per feature");
  }
  *total = 0;
  for (int f = 0; f < segments.size(); ++f) {
    if (num_segments[f].dims() != 0) {
      return errors::InvalidArgument("feature ", f,
                                     ": num_segments must be a scalar");
    }
    const int64_t count = num_segments[f].scalar<int32_t>()();
    if (count < 0) {
      return errors::InvalidArgument("feature ", f,
                                     ": num_segments must be >= 0");
    }
    TF_RETURN_IF_ERROR(CheckSegments(f, segments[f], weights[f], count));
    *total += segments[f].NumElements();
  }
  return absl::OkStatus();
}

// out[seg[i]] += row_of(f, i, k + i) (times w[i] where w is not null), for
// i in [0, n), from out's current values.
template <typename RowOf>
ESTIMATOR_SPEC_INLINE void CombineRowsLoop(float* out, const int32_t* seg,
                                           const float* w, int64_t n,
                                           int64_t dim, int f, int64_t k,
                                           const RowOf& row_of) {
  for (int64_t i = 0; i < n; ++i) {
    float* target = out + static_cast<int64_t>(seg[i]) * dim;
    const float* row = row_of(f, i, k + i);
    if (w != nullptr) {
      const float weight = w[i];
      for (int64_t j = 0; j < dim; ++j) {
        target[j] = target[j] + row[j] * weight;
      }
    } else {
      for (int64_t j = 0; j < dim; ++j) target[j] = target[j] + row[j];
    }
  }
}

template <typename RowOf>
void CombineRowsBaseline(float* out, const int32_t* seg, const float* w,
                         int64_t n, int64_t dim, int f, int64_t k,
                         const RowOf& row_of) {
  CombineRowsLoop(out, seg, w, n, dim, f, k, row_of);
}

#ifdef ESTIMATOR_SPEC_AVX2
template <typename RowOf>
__attribute__((target("avx2"))) void CombineRowsAvx2(
    float* out, const int32_t* seg, const float* w, int64_t n, int64_t dim,
    int f, int64_t k, const RowOf& row_of) {
  CombineRowsLoop(out, seg, w, n, dim, f, k, row_of);
}
#endif

template <typename RowOf>
void CombineRows(float* out, const int32_t* seg, const float* w, int64_t n,
                 int64_t dim, int f, int64_t k, const RowOf& row_of) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) {
    CombineRowsAvx2(out, seg, w, n, dim, f, k, row_of);
    return;
  }
#endif
  CombineRowsBaseline(out, seg, w, n, dim, f, k, row_of);
}

// Computes the activations and scales outputs (the op's output lists
// "activations" and "scales") from inputs that CheckCombineInputs accepted.
template <typename RowOf>
absl::Status Combine(OpKernelContext* context,
                     const std::vector<Combiner>& combiners,
                     const tensorflow::OpInputList& segments,
                     const tensorflow::OpInputList& weights,
                     const tensorflow::OpInputList& num_segments,
                     int64_t dim, RowOf row_of) {
  tensorflow::OpOutputList activations, scales;
  TF_RETURN_IF_ERROR(context->output_list("activations", &activations));
  TF_RETURN_IF_ERROR(context->output_list("scales", &scales));
  int64_t k = 0;
  for (int f = 0; f < segments.size(); ++f) {
    const int64_t n = segments[f].NumElements();
    const int64_t count = num_segments[f].scalar<int32_t>()();
    const int32_t* seg = segments[f].flat<int32_t>().data();
    const bool weighted = weights[f].NumElements() > 0;
    const float* w = weighted ? weights[f].flat<float>().data() : nullptr;
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(activations.allocate(
        f, tensorflow::TensorShape({count, dim}), &out));
    float* o = out->flat<float>().data();
    std::fill(o, o + count * dim, 0.0f);
    CombineRows(o, seg, w, n, dim, f, k, row_of);
    k += n;
    Tensor* scale = nullptr;
    if (combiners[f] == Combiner::kSum) {
      TF_RETURN_IF_ERROR(
          scales.allocate(f, tensorflow::TensorShape({0}), &scale));
      continue;
    }
    TF_RETURN_IF_ERROR(
        scales.allocate(f, tensorflow::TensorShape({count}), &scale));
    float* c = scale->flat<float>().data();
    std::fill(c, c + count, 0.0f);
    const bool mean = combiners[f] == Combiner::kMean;
    for (int64_t i = 0; i < n; ++i) {
      const float weight = weighted ? w[i] : 1.0f;
      c[seg[i]] = c[seg[i]] + (mean ? weight : weight * weight);
    }
    for (int64_t s = 0; s < count; ++s) {
      const float sum = mean ? c[s] : std::sqrt(c[s]);
      c[s] = sum == 0.0f ? 0.0f : 1.0f / sum;
      float* target = o + s * dim;
      for (int64_t j = 0; j < dim; ++j) target[j] = target[j] * c[s];
    }
  }
  return absl::OkStatus();
}

// The combiners of one table's features from `rows`, the table's rows of
// the distinct ids, and index[k], the row of id k (see Combine): a table
// whose rows were gathered partition by partition.
class CombineOp : public OpKernel {
 public:
  explicit CombineOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, ParseCombiners(context, &combiners_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(0);
    const Tensor& index = context->input(1);
    tensorflow::OpInputList segments, weights, num_segments;
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OP_REQUIRES_OK(context,
                   context->input_list("num_segments", &num_segments));
    OP_REQUIRES(context, rows.dims() == 2,
                errors::InvalidArgument("rows must be a matrix; got shape ",
                                        rows.shape().DebugString()));
    int64_t total = 0;
    OP_REQUIRES_OK(context, CheckCombineInputs(combiners_, segments, weights,
                                               num_segments, &total));
    OP_REQUIRES(context, index.dims() == 1 && index.dim_size(0) == total,
                errors::InvalidArgument("index has shape ",
                                        index.shape().DebugString(), " for ",
                                        total, " ids"));
    const int32_t* idx = index.flat<int32_t>().data();
    OP_REQUIRES_OK(context, CheckIndices(idx, total, rows.dim_size(0)));
    const int64_t dim = rows.dim_size(1);
    const float* r = rows.flat<float>().data();
    OP_REQUIRES_OK(context,
                   Combine(context, combiners_, segments, weights,
                           num_segments, dim, [&](int, int64_t, int64_t k) {
                             return r + static_cast<int64_t>(idx[k]) * dim;
                           }));
  }

 private:
  std::vector<Combiner> combiners_;
};

REGISTER_OP("HostEmbeddingCombine")
    .Input("rows: float")
    .Input("index: int32")
    .Input("segments: F * int32")
    .Input("weights: F * float")
    .Input("num_segments: F * int32")
    .Output("activations: F * float")
    .Output("scales: F * float")
    .Attr("F: int >= 1")
    .Attr("combiners: list(string)")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int features = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("F", &features));
      const auto dim = c->Dim(c->input(0), 1);
      for (int f = 0; f < features; ++f) {
        c->set_output(f, c->Matrix(c->UnknownDim(), dim));
        c->set_output(features + f, c->Vector(c->UnknownDim()));
      }
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingCombine").Device(DEVICE_CPU),
                        CombineOp);

// A table's lookup, in one pass over its features' ids: what a
// concatenation of the ids, Unique, a gather of the distinct ids' rows and
// Combine compute, read under the table's lock. For the ids of all features
// in feature order (k counts them), unique_ids holds each distinct id once
// in the order of its first appearance, index[k] is the place of id k in
// unique_ids, num_ids counts the distinct ids (for the gradient sums, which
// then need no op of their own to count them), and the activations and
// scales are Combine's (above), with each id's row read from the table.
// With keep_rows, rows[u] is the table's row of unique_ids[u] (for an
// update that is not compiled); else rows is empty [0, dimension]. An id
// outside the table fails the op before anything is computed.
template <typename Index>
class LookupOp : public OpKernel {
 public:
  explicit LookupOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, ParseCombiners(context, &combiners_));
    OP_REQUIRES_OK(context, context->GetAttr("keep_rows", &keep_rows_));
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::core::RefCountPtr<Var> variable;
    OP_REQUIRES_OK(context, tensorflow::LookupResource(
                                context, tensorflow::HandleFromInput(context, 0),
                                &variable));
    tensorflow::OpInputList ids, segments, weights, num_segments;
    OP_REQUIRES_OK(context, context->input_list("ids", &ids));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OP_REQUIRES_OK(context,
                   context->input_list("num_segments", &num_segments));
    int64_t total = 0;
    OP_REQUIRES_OK(context, CheckCombineInputs(combiners_, segments, weights,
                                               num_segments, &total));
    for (int f = 0; f < ids.size(); ++f) {
      OP_REQUIRES(context,
                  ids[f].dims() == 1 &&
                      ids[f].NumElements() == segments[f].NumElements(),
                  errors::InvalidArgument(
                      "ids[", f, "] must be a vector of one id per segment "
                      "entry; got shape ", ids[f].shape().DebugString(),
                      " for ", segments[f].NumElements(), " entries"));
    }
    OP_REQUIRES(context, total <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("more than 2^31 - 1 ids: ", total));
    tensorflow::tf_shared_lock lock(*variable->mu());
    OP_REQUIRES_OK(context, CheckTable(variable.get(), "the table"));
    const Tensor* table = variable->tensor();
    AdviseHugePages(table);
    const int64_t rows = table->dim_size(0);
    const int64_t dim = table->dim_size(1);
    std::vector<const Index*> id_of(ids.size());
    for (int f = 0; f < ids.size(); ++f) {
      id_of[f] = ids[f].flat<Index>().data();
      const absl::Status status =
          CheckIndices(id_of[f], ids[f].NumElements(), rows);
      OP_REQUIRES(context, status.ok(),
                  errors::InvalidArgument("ids[", f, "]: ", status.message()));
    }
    Tensor* index = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, tensorflow::TensorShape({total}), &index));
    int32_t* where = index->flat<int32_t>().data();
    const float* w = table->flat<float>().data();
    std::vector<Index> distinct;
    FindDistinct<Index>(
        ids.size(),
        [&](int f) {
          return std::make_pair(id_of[f], ids[f].NumElements());
        },
        total, where, &distinct, [&](Index id) {
          // Its row is read below: ask for it now.
          PrefetchRow(w + static_cast<int64_t>(id) * dim, dim);
        });
    const int64_t u = static_cast<int64_t>(distinct.size());
    Tensor *unique_ids = nullptr, *out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({u}), &unique_ids));
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       2, tensorflow::TensorShape({keep_rows_ ? u : 0, dim}),
                       &out));
    std::copy(distinct.begin(), distinct.end(),
              unique_ids->flat<Index>().data());
    Tensor* count = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                3, tensorflow::TensorShape({}), &count));
    count->scalar<int32_t>()() = static_cast<int32_t>(u);
    if (keep_rows_) {
      CopyRows(w, dim, distinct.data(), u, out->flat<float>().data());
    }
    OP_REQUIRES_OK(context,
                   Combine(context, combiners_, segments, weights,
                           num_segments, dim, [&](int f, int64_t i, int64_t) {
                             return w + static_cast<int64_t>(id_of[f][i]) *
                                            dim;
                           }));
  }

 private:
  std::vector<Combiner> combiners_;
  bool keep_rows_ = false;
};

REGISTER_OP("HostEmbeddingLookup")
    .Input("table: resource")
    .Input("ids: F * Tindices")
    .Input("segments: F * int32")
    .Input("weights: F * float")
    .Input("num_segments: F * int32")
    .Output("unique_ids: Tindices")
    .Output("index: int32")
    .Output("rows: float")
    .Output("num_ids: int32")
    .Output("activations: F * float")
    .Output("scales: F * float")
    .Attr("F: int >= 1")
    .Attr("Tindices: {int32, int64}")
    .Attr("combiners: list(string)")
    .Attr("keep_rows: bool")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int features = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("F", &features));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      c->set_output(3, c->Scalar());
      for (int f = 0; f < features; ++f) {
        c->set_output(4 + f, c->Matrix(c->UnknownDim(), c->UnknownDim()));
        c->set_output(4 + features + f, c->Vector(c->UnknownDim()));
      }
      return absl::OkStatus();
    });

ESTIMATOR_SPEC_REGISTER_BY_INDEX("HostEmbeddingLookup", LookupOp);

// The distinct ids of one table's features routed to the table's
// partitions, for a step's requests (docs/cluster.md, 'Requests per step'):
// the ids of every feature (ids_f, in feature order), each distinct id once,
// grouped by partition in partition order and, within a partition, in the
// order of first occurrence (what tf.unique gives, grouped stably).
//   unique_ids [U]: the distinct ids in that order;
//   index [N]: each id's position in unique_ids;
//   local_ids_p: the local row of each of partition p's distinct ids, in
//     unique_ids' order (the layout's rule: 'div' gives partition p the
//     rows [offset_p, offset_p + size_p), the first vocabulary_size % K
//     partitions one row more; 'mod' gives it the ids with id % K == p, at
//     id / K);
//   sizes_p: their number.
// Ids outside [0, vocabulary_size) are refused (the step's range check
// refused them before).
template <typename Out>
class RouteIdsOp : public OpKernel {
 public:
  explicit RouteIdsOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string strategy;
    OP_REQUIRES_OK(context, context->GetAttr("strategy", &strategy));
    OP_REQUIRES_OK(context,
                   context->GetAttr("vocabulary_size", &vocabulary_size_));
    OP_REQUIRES_OK(context, context->GetAttr("K", &partitions_));
    OP_REQUIRES(context, strategy == "div" || strategy == "mod",
                errors::InvalidArgument("strategy must be 'div' or 'mod'; "
                                        "got '", strategy, "'"));
    OP_REQUIRES(context,
                vocabulary_size_ >= 1 && partitions_ <= vocabulary_size_,
                errors::InvalidArgument(
                    "K (", partitions_, ") partitions of ", vocabulary_size_,
                    " rows: every partition must hold a row"));
    mod_ = strategy == "mod";
    base_ = vocabulary_size_ / partitions_;
    extra_ = vocabulary_size_ % partitions_;
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList ids;
    OP_REQUIRES_OK(context, context->input_list("ids", &ids));
    int64_t total = 0;
    for (int f = 0; f < ids.size(); ++f) {
      OP_REQUIRES(context, ids[f].dims() == 1,
                  errors::InvalidArgument("ids[", f, "] must be a vector; "
                                          "got shape ",
                                          ids[f].shape().DebugString()));
      const int64_t* id = ids[f].flat<int64_t>().data();
      const int64_t n = ids[f].NumElements();
      const int64_t i = FirstOutside(id, n, vocabulary_size_);
      OP_REQUIRES(context, i == n,
                  errors::InvalidArgument("ids[", f, "]: id ", id[i], " at ",
                                          i, " is outside [0, ",
                                          vocabulary_size_, ")"));
      total += n;
    }
    OP_REQUIRES(context, total <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("more than 2^31 - 1 ids: ", total));
    // Distinct ids in order of first occurrence, then each one's partition
    // and local row.
    std::vector<int32_t> first(total);
    std::vector<int64_t> distinct;
    FindDistinct<int64_t>(
        ids.size(),
        [&](int f) {
          return std::make_pair(ids[f].flat<int64_t>().data(),
                                ids[f].NumElements());
        },
        total, first.data(), &distinct, [](int64_t) {});
    const int64_t u = static_cast<int64_t>(distinct.size());
    std::vector<int32_t> partition(u);
    std::vector<int64_t> local(u);
    std::vector<int64_t> start(partitions_ + 1, 0);
    const int64_t threshold = extra_ * (base_ + 1);
    for (int64_t j = 0; j < u; ++j) {
      const int64_t id = distinct[j];
      int64_t p;
      if (mod_) {
        p = id % partitions_;
        local[j] = id / partitions_;
      } else if (id < threshold) {
        p = id / (base_ + 1);
        local[j] = id - p * (base_ + 1);
      } else {
        p = extra_ + (id - threshold) / base_;
        local[j] = id - threshold - (p - extra_) * base_;
      }
      partition[j] = static_cast<int32_t>(p);
      ++start[p + 1];
    }
    for (int p = 0; p < partitions_; ++p) start[p + 1] += start[p];
    Tensor *unique_ids = nullptr, *index = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({u}), &unique_ids));
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, tensorflow::TensorShape({total}), &index));
    std::vector<Out*> local_out(partitions_);
    for (int p = 0; p < partitions_; ++p) {
      Tensor* piece = nullptr;
      OP_REQUIRES_OK(context,
                     context->allocate_output(
                         2 + p,
                         tensorflow::TensorShape({start[p + 1] - start[p]}),
                         &piece));
      local_out[p] = piece->flat<Out>().data();
      Tensor* size = nullptr;
      OP_REQUIRES_OK(context,
                     context->allocate_output(2 + partitions_ + p,
                                              tensorflow::TensorShape({}),
                                              &size));
      size->scalar<Out>()() = static_cast<Out>(start[p + 1] - start[p]);
    }
    // Stable grouping: each distinct id's place in the request order.
    std::vector<int32_t> place(u);
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    int64_t* unique_out = unique_ids->flat<int64_t>().data();
    for (int64_t j = 0; j < u; ++j) {
      const int p = partition[j];
      const int64_t at = next[p]++;
      place[j] = static_cast<int32_t>(at);
      unique_out[at] = distinct[j];
      local_out[p][at - start[p]] = static_cast<Out>(local[j]);
    }
    int32_t* index_out = index->flat<int32_t>().data();
    for (int64_t i = 0; i < total; ++i) index_out[i] = place[first[i]];
  }

 private:
  int64_t vocabulary_size_ = 0;
  int partitions_ = 0;
  bool mod_ = false;
  int64_t base_ = 0, extra_ = 0;
};

REGISTER_OP("HostEmbeddingRouteIds")
    .Input("ids: F * int64")
    .Output("unique_ids: int64")
    .Output("index: int32")
    .Output("local_ids: K * out_type")
    .Output("sizes: K * out_type")
    .Attr("F: int >= 1")
    .Attr("K: int >= 1")
    .Attr("vocabulary_size: int >= 1")
    .Attr("strategy: {'div', 'mod'}")
    .Attr("out_type: {int32, int64}")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int partitions = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("K", &partitions));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      for (int p = 0; p < partitions; ++p) {
        c->set_output(2 + p, c->Vector(c->UnknownDim()));
        c->set_output(2 + partitions + p, c->Scalar());
      }
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingRouteIds")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int32_t>("out_type"),
                        RouteIdsOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("HostEmbeddingRouteIds")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int64_t>("out_type"),
                        RouteIdsOp<int64_t>);

// The per-id gradient sums of one table (docs/numerics.md, 'The backward pass,
// table by table'): for each feature f in order and each of its ids i in order,
//   out[index[k]] += (grad_f[segment_f[i]] * scale_f[segment_f[i]])
//                    * weight_f[i]
// from zeros, where k counts the ids over all features (no multiplication
// by a scale or a weight that is empty: `sum`, unweighted); then, given a
// `multiplier` (a scalar; empty: none), out = out * multiplier. `finite`
// says whether every sum is finite. A gradient of any rank is read as rows
// of its last dimension. This is the order and the float operations of the
// scaled gradients, a gather, a multiplication, a concatenation, an
// unsorted segment sum and the multiplication by the multiplier.
//
// With `offsets` (one per feature), grad_f[s] is instead columns
// [offsets[f], offsets[f] + dim) of row s of grads[f] (rows of its last
// dimension): the features' gradients are read where they lie in a wider
// gradient, such as that of a concatenation of the activations, which then
// need not be split.
// out[idx[i]] += (g[seg[i]] * c[seg[i]]) * w[i] for i in [0, n), each
// product only where its scale c or weight w is not null; gradient row s
// starts at g + s * stride.
ESTIMATOR_SPEC_INLINE void SumGradientsLoop(float* out, const int32_t* idx,
                                            const int32_t* seg,
                                            const float* g, int64_t stride,
                                            const float* w, const float* c,
                                            int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + static_cast<int64_t>(idx[i]) * dim;
    const int64_t s = seg[i];
    const float* in = g + s * stride;
    const float weight = w != nullptr ? w[i] : 1.0f;
    const float scale = c != nullptr ? c[s] : 1.0f;
    for (int64_t j = 0; j < dim; ++j) {
      float value = in[j];
      if (c != nullptr) value = value * scale;
      if (w != nullptr) value = value * weight;
      row[j] = row[j] + value;
    }
  }
}

void SumGradientsBaseline(float* out, const int32_t* idx, const int32_t* seg,
                          const float* g, int64_t stride, const float* w,
                          const float* c, int64_t n, int64_t dim) {
  SumGradientsLoop(out, idx, seg, g, stride, w, c, n, dim);
}

#ifdef ESTIMATOR_SPEC_AVX2
__attribute__((target("avx2"))) void SumGradientsAvx2(
    float* out, const int32_t* idx, const int32_t* seg, const float* g,
    int64_t stride, const float* w, const float* c, int64_t n, int64_t dim) {
  SumGradientsLoop(out, idx, seg, g, stride, w, c, n, dim);
}
#endif

void SumGradients(float* out, const int32_t* idx, const int32_t* seg,
                  const float* g, int64_t stride, const float* w,
                  const float* c, int64_t n, int64_t dim) {
#ifdef ESTIMATOR_SPEC_AVX2
  if (HasAvx2()) {
    SumGradientsAvx2(out, idx, seg, g, stride, w, c, n, dim);
    return;
  }
#endif
  SumGradientsBaseline(out, idx, seg, g, stride, w, c, n, dim);
}

class IdGradientsOp : public OpKernel {
 public:
  explicit IdGradientsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("offsets", &offsets_));
    OP_REQUIRES_OK(context, context->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList grads, segments, weights, scales;
    OP_REQUIRES_OK(context, context->input_list("grads", &grads));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OP_REQUIRES_OK(context, context->input_list("scales", &scales));
    const Tensor& index = context->input(context->num_inputs() - 3);
    const Tensor& num_ids = context->input(context->num_inputs() - 2);
    const Tensor& multiplier = context->input(context->num_inputs() - 1);
    OP_REQUIRES(context, num_ids.dims() == 0 && index.dims() == 1,
                errors::InvalidArgument(
                    "index must be a vector and num_ids a scalar"));
    OP_REQUIRES(context, multiplier.NumElements() <= 1,
                errors::InvalidArgument(
                    "multiplier must be a scalar or empty (none)"));
    const int64_t n_out = num_ids.scalar<int32_t>()();
    OP_REQUIRES(context, n_out >= 0,
                errors::InvalidArgument("num_ids must be >= 0"));
    const int32_t* idx = index.flat<int32_t>().data();
    const bool windows = !offsets_.empty();
    OP_REQUIRES(context,
                !windows || (static_cast<int>(offsets_.size()) ==
                                 grads.size() && dim_ >= 0),
                errors::InvalidArgument(
                    "offsets must be empty or one per feature (", grads.size(),
                    "; got ", offsets_.size(), "), with dim >= 0 (got ", dim_,
                    ")"));
    int64_t dim = windows ? dim_ : -1;
    int64_t total = 0;
    // Feature f's gradient row s starts at grads[f] + s * stride[f] +
    // offset[f].
    std::vector<int64_t> stride(grads.size()), offset(grads.size(), 0);
    for (int f = 0; f < grads.size(); ++f) {
      const Tensor& grad = grads[f];
      OP_REQUIRES(context, grad.dims() >= 2,
                  errors::InvalidArgument("grads[", f,
                                          "] must have rank >= 2"));
      const int64_t columns = grad.dim_size(grad.dims() - 1);
      if (windows) {
        offset[f] = offsets_[f];
        OP_REQUIRES(context, offset[f] >= 0 && offset[f] + dim <= columns,
                    errors::InvalidArgument(
                        "grads[", f, "] has ", columns, " columns; columns [",
                        offset[f], ", ", offset[f] + dim,
                        ") are outside them"));
      } else {
        if (dim < 0) dim = columns;
        OP_REQUIRES(context, columns == dim,
                    errors::InvalidArgument("grads[", f, "] has ", columns,
                                            " columns, not ", dim));
      }
      stride[f] = columns;
      const int64_t grad_rows = columns ? grad.NumElements() / columns : 0;
      OP_REQUIRES(context,
                  scales[f].NumElements() == 0 ||
                      scales[f].NumElements() == grad_rows,
                  errors::InvalidArgument("feature ", f,
                                          ": scales must be empty or one per "
                                          "gradient row"));
      OP_REQUIRES_OK(context,
                     CheckSegments(f, segments[f], weights[f], grad_rows));
      const int64_t n = segments[f].NumElements();
      OP_REQUIRES(context, total + n <= index.dim_size(0),
                  errors::InvalidArgument("index has ", index.dim_size(0),
                                          " entries; the features have more "
                                          "ids"));
      const int64_t outside = FirstOutside(idx + total, n, n_out);
      OP_REQUIRES(context, outside == n,
                  errors::InvalidArgument("feature ", f, ": index ",
                                          idx[total + outside], " at ",
                                          outside, " is outside [0, ", n_out,
                                          ")"));
      total += n;
    }
    OP_REQUIRES(context, dim >= 0, errors::InvalidArgument("no features"));
    OP_REQUIRES(context, total == index.dim_size(0),
                errors::InvalidArgument("index has ", index.dim_size(0),
                                        " entries for ", total, " ids"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, tensorflow::TensorShape({n_out, dim}), &out));
    float* o = out->flat<float>().data();
    std::fill(o, o + n_out * dim, 0.0f);
    int64_t k = 0;
    for (int f = 0; f < grads.size(); ++f) {
      const float* g = grads[f].NumElements() > 0
                           ? grads[f].flat<float>().data() + offset[f]
                           : nullptr;
      const int32_t* seg = segments[f].flat<int32_t>().data();
      const int64_t n = segments[f].NumElements();
      const bool weighted = weights[f].NumElements() > 0;
      const bool scaled = scales[f].NumElements() > 0;
      const float* w = weighted ? weights[f].flat<float>().data() : nullptr;
      const float* c = scaled ? scales[f].flat<float>().data() : nullptr;
      SumGradients(o, idx + k, seg, g, stride[f], w, c, n, dim);
      k += n;
    }
    const bool multiply = multiplier.NumElements() == 1;
    const float m = multiply ? multiplier.flat<float>()(0) : 1.0f;
    const bool finite = ScaleAllFinite(o, n_out * dim, m, multiply);
    Tensor* all_finite = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, tensorflow::TensorShape({}), &all_finite));
    all_finite->scalar<bool>()() = finite;
  }

 private:
  std::vector<int64_t> offsets_;
  int64_t dim_ = -1;
};

REGISTER_OP("HostEmbeddingIdGradients")
    .Input("grads: F * float")
    .Input("segments: F * int32")
    .Input("weights: F * float")
    .Input("scales: F * float")
    .Input("index: int32")
    .Input("num_ids: int32")
    .Input("multiplier: float")
    .Output("sums: float")
    .Output("finite: bool")
    .Attr("F: int >= 1")
    .Attr("offsets: list(int) = []")
    .Attr("dim: int = -1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      const auto grad = c->input(0);
      std::vector<int64_t> offsets;
      int64_t dim = -1;
      TF_RETURN_IF_ERROR(c->GetAttr("offsets", &offsets));
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->UnknownDim(),
                                 !offsets.empty() ? c->MakeDim(dim)
                                 : c->RankKnown(grad)
                                     ? c->Dim(grad, c->Rank(grad) - 1)
                                     : c->UnknownDim()));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingIdGradients").Device(DEVICE_CPU),
                        IdGradientsOp);

// messages[i] for each i of `selected`, in order, with `separator` between.
std::string Joined(const std::vector<std::string>& messages,
                   const std::vector<int>& selected,
                   const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < selected.size(); ++i) {
    if (i > 0) out += separator;
    out += messages[selected[i]];
  }
  return out;
}

// The step's gate on several boolean scalars (one per table): fails with
// InvalidArgument, naming messages[i] for every false ok[i] in order, when
// any is false. One op where an Assert would need its flags stacked and
// its failing messages gathered on every step.
class CheckAllOp : public OpKernel {
 public:
  explicit CheckAllOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("messages", &messages_));
  }

  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList ok;
    OP_REQUIRES_OK(context, context->input_list("ok", &ok));
    OP_REQUIRES(context, static_cast<size_t>(ok.size()) == messages_.size(),
                errors::InvalidArgument("ok has ", ok.size(),
                                        " flags for ", messages_.size(),
                                        " messages"));
    std::vector<int> failing;
    for (int i = 0; i < ok.size(); ++i) {
      OP_REQUIRES(context, ok[i].NumElements() == 1,
                  errors::InvalidArgument("ok[", i, "] must be a scalar"));
      if (!ok[i].flat<bool>()(0)) failing.push_back(i);
    }
    OP_REQUIRES(context, failing.empty(),
                errors::InvalidArgument(Joined(messages_, failing, "\n")));
  }

 private:
  std::vector<std::string> messages_;
};

REGISTER_OP("HostEmbeddingCheckAll")
    .Input("ok: N * bool")
    .Attr("N: int >= 1")
    .Attr("messages: list(string)")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingCheckAll").Device(DEVICE_CPU),
                        CheckAllOp);

// The values of `rows` as the Assert op prints a vector ([1 2]) or a matrix
// of `width` columns ([[1 2][3 4]]), rows in the order given.
std::string Printed(const int64_t* values, const std::vector<int>& rows,
                    int width, bool matrix) {
  std::string out = "[";
  for (size_t r = 0; r < rows.size(); ++r) {
    if (matrix) out += "[";
    for (int c = 0; c < width; ++c) {
      if (c > 0 || (!matrix && r > 0)) out += " ";
      out += std::to_string(values[rows[r] * width + c]);
    }
    if (matrix) out += "]";
  }
  return out + "]";
}

// The input checks of F features from their extremes (HostEmbeddingExtremes'
// of the indices [F, 2] and of the ids [F]), in one op, as the two Asserts
// of the TF-op path report them (docs/numerics.md, 'Checks before any
// write'):
//   1. every index inside its feature's dense shape (shapes [F, 2]);
//   2. every id below its feature's vocabulary size and, where
//      refuse_negative[f], not negative.
// The first check that fails names every feature at fault (its message),
// then their dense shapes and largest indices (1) or their smallest and
// largest ids (2).
class CheckIdsOp : public OpKernel {
 public:
  explicit CheckIdsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("vocabulary", &vocabulary_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("refuse_negative", &refuse_negative_));
    OP_REQUIRES_OK(context, context->GetAttr("structure_messages",
                                             &structure_messages_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("range_messages", &range_messages_));
    const size_t features = vocabulary_.size();
    OP_REQUIRES(context,
                refuse_negative_.size() == features &&
                    structure_messages_.size() == features &&
                    range_messages_.size() == features,
                errors::InvalidArgument(
                    "vocabulary, refuse_negative, structure_messages and "
                    "range_messages must have one entry per feature"));
  }

  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* context) override {
    const int64_t features = static_cast<int64_t>(vocabulary_.size());
    const Tensor& index_largest = context->input(0);
    const Tensor& index_smallest = context->input(1);
    const Tensor& shapes = context->input(2);
    const Tensor& id_largest = context->input(3);
    const Tensor& id_smallest = context->input(4);
    for (const Tensor* t : {&index_largest, &index_smallest, &shapes}) {
      OP_REQUIRES(context,
                  t->dims() == 2 && t->dim_size(0) == features &&
                      t->dim_size(1) == 2,
                  errors::InvalidArgument(
                      "index extremes and shapes must be [", features,
                      ", 2]; got shape ", t->shape().DebugString()));
    }
    for (const Tensor* t : {&id_largest, &id_smallest}) {
      OP_REQUIRES(context, t->NumElements() == features,
                  errors::InvalidArgument(
                      "id extremes must have ", features,
                      " values; got shape ", t->shape().DebugString()));
    }
    const int64_t* hi = index_largest.flat<int64_t>().data();
    const int64_t* lo = index_smallest.flat<int64_t>().data();
    const int64_t* shape = shapes.flat<int64_t>().data();
    std::vector<int> failing;
    for (int f = 0; f < features; ++f) {
      bool ok = true;
      for (int c = 0; c < 2; ++c) {
        ok = ok && hi[2 * f + c] < shape[2 * f + c] && lo[2 * f + c] >= 0;
      }
      if (!ok) failing.push_back(f);
    }
    OP_REQUIRES(context, failing.empty(),
                errors::InvalidArgument(
                    Named(structure_messages_, failing), " ",
                    Printed(shape, failing, 2, true), " ",
                    Printed(hi, failing, 2, true)));
    const int64_t* id_hi = id_largest.flat<int64_t>().data();
    const int64_t* id_lo = id_smallest.flat<int64_t>().data();
    for (int f = 0; f < features; ++f) {
      if (id_hi[f] >= vocabulary_[f] ||
          (refuse_negative_[f] && id_lo[f] < 0)) {
        failing.push_back(f);
      }
    }
    OP_REQUIRES(context, failing.empty(),
                errors::InvalidArgument(
                    Named(range_messages_, failing), " ",
                    Printed(id_lo, failing, 1, false), " ",
                    Printed(id_hi, failing, 1, false)));
  }

 private:
  static std::string Named(const std::vector<std::string>& messages,
                           const std::vector<int>& failing) {
    return "assertion failed: [" + Joined(messages, failing, " ") + "]";
  }

  std::vector<int64_t> vocabulary_;
  std::vector<bool> refuse_negative_;
  std::vector<std::string> structure_messages_, range_messages_;
};

REGISTER_OP("HostEmbeddingCheckIds")
    .Input("index_largest: int64")
    .Input("index_smallest: int64")
    .Input("shapes: int64")
    .Input("id_largest: int64")
    .Input("id_smallest: int64")
    .Attr("vocabulary: list(int)")
    .Attr("refuse_negative: list(bool)")
    .Attr("structure_messages: list(string)")
    .Attr("range_messages: list(string)")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingCheckIds").Device(DEVICE_CPU),
                        CheckIdsOp);

#define ESTIMATOR_SPEC_ROW_UPDATE_OP(NAME, SLOT_INPUTS)                      \
  REGISTER_OP(NAME)                                                          \
      .Input("table: resource") SLOT_INPUTS                                  \
      .Input("indices: Tindices")                                            \
      .Input("grad: float")                                                  \
      .Input("lr: float")                                                    \
      .Input("grad_lo: float")                                               \
      .Input("grad_hi: float")                                               \
      .Input("factor: float")                                                \
      .Input("weight_lo: float")                                             \
      .Input("weight_hi: float")                                             \
      .Attr("Tindices: {int32, int64}")                                      \
      .Attr("clip_gradients: bool")                                          \
      .Attr("decay: bool")                                                   \
      .Attr("clip_weights: bool")                                            \
      .SetShapeFn([](tensorflow::shape_inference::InferenceContext*) {       \
        return absl::OkStatus();                                         \
      })

ESTIMATOR_SPEC_ROW_UPDATE_OP("HostEmbeddingAdagradRows",
                             .Input("accumulator: resource"));
ESTIMATOR_SPEC_ROW_UPDATE_OP("HostEmbeddingSgdRows", );

#define ESTIMATOR_SPEC_REGISTER(NAME, RULE, INDEX)                           \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                         \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<INDEX>("Tindices"),            \
                          RowUpdateOp<RULE, INDEX>)

ESTIMATOR_SPEC_REGISTER("HostEmbeddingAdagradRows", AdagradRule, int32_t);
ESTIMATOR_SPEC_REGISTER("HostEmbeddingAdagradRows", AdagradRule, int64_t);
ESTIMATOR_SPEC_REGISTER("HostEmbeddingSgdRows", SgdRule, int32_t);
ESTIMATOR_SPEC_REGISTER("HostEmbeddingSgdRows", SgdRule, int64_t);

}  // namespace estimator_spec_kernels
