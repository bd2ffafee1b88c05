// The host embedding engine's compiled kernels (kernels/__init__.py builds
// and loads this file). Training uses them where the TensorFlow-op path
// would compute the same numbers:
//   HostEmbeddingGatherRows   the rows of the step's ids, fetched ahead;
//   HostEmbeddingIdGradients  the per-id gradient sums of one table;
//   HostEmbedding*Rows        in-place optimizer updates of the touched rows.
//
// One update op per optimizer rule. Each runs SEMANTICS 4.4-4.7 on the distinct
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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
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
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) {
      return errors::InvalidArgument("row index ", ids[i], " at ", i,
                                     " is outside [0, ", rows, ")");
    }
  }
  return absl::OkStatus();
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
    float* slot_rows[kVariables];
    std::vector<float> clipped(dim);
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
          clipped[j] = std::max(std::min(g_row[j], pipe.grad_hi),
                                pipe.grad_lo);
        }
        g_row = clipped.data();
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
    const int64_t rows = table->dim_size(0);
    const int64_t dim = table->dim_size(1);
    const int64_t n = indices.dim_size(0);
    const Index* ids = indices.flat<Index>().data();
    OP_REQUIRES_OK(context, CheckIndices(ids, n, rows));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({n, dim}), &out));
    const float* w = table->flat<float>().data();
    float* o = out->flat<float>().data();
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
      PrefetchRow(w + ids[i] * dim, dim);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) PrefetchRow(w + ids[i + kAhead] * dim, dim);
      std::memcpy(o + i * dim, w + static_cast<int64_t>(ids[i]) * dim,
                  dim * sizeof(float));
    }
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

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingGatherRows")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int32_t>("Tindices"),
                        GatherRowsOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("HostEmbeddingGatherRows")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int64_t>("Tindices"),
                        GatherRowsOp<int64_t>);

// The per-id gradient sums of one table (SEMANTICS 4.2-4.3): for each
// feature f in order and each of its ids i in order,
//   out[index_f[i]] += grad_f[segment_f[i]] * weight_f[i]
// (no multiplication where feature f has no weights: an empty weights
// tensor), from zeros. This is the order and the float operations of a
// gather, a multiplication, a concatenation and an unsorted segment sum.
class IdGradientsOp : public OpKernel {
 public:
  explicit IdGradientsOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList grads, segments, weights, index;
    OP_REQUIRES_OK(context, context->input_list("grads", &grads));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OP_REQUIRES_OK(context, context->input_list("index", &index));
    const Tensor& num_ids = context->input(context->num_inputs() - 1);
    OP_REQUIRES(context, num_ids.dims() == 0,
                errors::InvalidArgument("num_ids must be a scalar"));
    const int64_t n_out = num_ids.scalar<int32_t>()();
    OP_REQUIRES(context, n_out >= 0,
                errors::InvalidArgument("num_ids must be >= 0"));
    int64_t dim = -1;
    for (int f = 0; f < grads.size(); ++f) {
      const Tensor& grad = grads[f];
      OP_REQUIRES(context, grad.dims() == 2,
                  errors::InvalidArgument("grads[", f, "] must be a matrix"));
      if (dim < 0) dim = grad.dim_size(1);
      OP_REQUIRES(context, grad.dim_size(1) == dim,
                  errors::InvalidArgument("grads[", f, "] has ",
                                          grad.dim_size(1), " columns, not ",
                                          dim));
      const int64_t n = segments[f].NumElements();
      OP_REQUIRES(context,
                  segments[f].dims() == 1 && index[f].dims() == 1 &&
                      index[f].dim_size(0) == n &&
                      (weights[f].NumElements() == 0 ||
                       weights[f].NumElements() == n),
                  errors::InvalidArgument(
                      "feature ", f, ": segments, index and weights must be "
                      "vectors of one length (weights may be empty)"));
      const int32_t* seg = segments[f].flat<int32_t>().data();
      const int32_t* idx = index[f].flat<int32_t>().data();
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(context, seg[i] >= 0 && seg[i] < grad.dim_size(0),
                    errors::InvalidArgument("feature ", f, ": segment ",
                                            seg[i], " at ", i,
                                            " is outside [0, ",
                                            grad.dim_size(0), ")"));
        OP_REQUIRES(context, idx[i] >= 0 && idx[i] < n_out,
                    errors::InvalidArgument("feature ", f, ": index ",
                                            idx[i], " at ", i,
                                            " is outside [0, ", n_out, ")"));
      }
    }
    OP_REQUIRES(context, dim >= 0,
                errors::InvalidArgument("no features"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, tensorflow::TensorShape({n_out, dim}), &out));
    float* o = out->flat<float>().data();
    std::fill(o, o + n_out * dim, 0.0f);
    for (int f = 0; f < grads.size(); ++f) {
      const float* g = grads[f].flat<float>().data();
      const int32_t* seg = segments[f].flat<int32_t>().data();
      const int32_t* idx = index[f].flat<int32_t>().data();
      const int64_t n = segments[f].NumElements();
      const bool weighted = weights[f].NumElements() > 0;
      const float* w = weighted ? weights[f].flat<float>().data() : nullptr;
      for (int64_t i = 0; i < n; ++i) {
        float* row = o + static_cast<int64_t>(idx[i]) * dim;
        const float* in = g + static_cast<int64_t>(seg[i]) * dim;
        if (weighted) {
          const float weight = w[i];
          for (int64_t j = 0; j < dim; ++j) row[j] = row[j] + in[j] * weight;
        } else {
          for (int64_t j = 0; j < dim; ++j) row[j] = row[j] + in[j];
        }
      }
    }
  }
};

REGISTER_OP("HostEmbeddingIdGradients")
    .Input("grads: F * float")
    .Input("segments: F * int32")
    .Input("weights: F * float")
    .Input("index: F * int32")
    .Input("num_ids: int32")
    .Output("sums: float")
    .Attr("F: int >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(c->input(0), 1)));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HostEmbeddingIdGradients").Device(DEVICE_CPU),
                        IdGradientsOp);

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
