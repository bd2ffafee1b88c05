// The row update ops, one per optimizer rule. Each runs docs/numerics.md, 'The
// backward pass, table by table' and 'Each optimizer on a touched row' on the
// distinct row indices it is given, row by row, in the order of the graph-op
// path:
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

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

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

template <int kSlots>
inline void PrefetchRows(int64_t row, int64_t dim, const float* table,
                         float* const* slots) {
  PrefetchRow(table + row * dim, dim);
  for (int s = 0; s < kSlots; ++s) PrefetchRow(slots[s] + row * dim, dim);
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

  // Copy on write: a reader holding the buffer (a ReadVariableOp's result
  // that a save or an export still uses) keeps the values it read, and the
  // table gets a copy to write. The variable is not put in copy-on-read
  // mode (as TensorFlow's sparse ops do), where every whole read copies
  // the buffer: a checkpoint's save would then hold each table twice
  // (docs/performance.md, 'Table size'). The kernels' reads of rows take
  // the variable's lock instead of holding its buffer.
  static absl::Status Writable(OpKernelContext* context, Var* var) {
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

// Ends copy-on-read mode on each variable given (a table or slot partition
// that TensorFlow's sparse ops updated or read, which puts it in that mode
// for good). Run before a checkpoint's save reads the variables: each read
// then shares the buffer instead of copying it, and the next write copies
// it only if the save still holds it (TensorFlow's sparse ops copy a
// shared buffer when they put a variable back in copy-on-read mode; the
// kernels above copy on write). Without it a save holds every such table
// twice (docs/performance.md, 'Table size'). A variable not made yet is
// left alone.
class ShareOnReadOp : public OpKernel {
 public:
  explicit ShareOnReadOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    for (int i = 0; i < context->num_inputs(); ++i) {
      tensorflow::core::RefCountPtr<Var> variable;
      if (!tensorflow::LookupResource(
               context, tensorflow::HandleFromInput(context, i), &variable)
               .ok()) {
        continue;
      }
      tensorflow::mutex_lock lock(*variable->mu());
      variable->copy_on_read_mode.store(false);
    }
  }
};

REGISTER_OP("HostEmbeddingShareOnRead")
    .Input("variables: N * resource")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext*) {
      return absl::OkStatus();
    });
REGISTER_KERNEL_BUILDER(Name("HostEmbeddingShareOnRead").Device(DEVICE_CPU),
                        ShareOnReadOp);

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
