// The backward pass's kernels: the per-id gradient sums of a table with
// their finite check, and the step's gate on every table's check.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

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

}  // namespace estimator_spec_kernels
