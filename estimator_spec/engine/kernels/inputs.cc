// The input kernels, run on the step's features before any lookup: each
// feature's extremes, the dropping of negative ids and the checks of every
// feature's indices and ids.

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

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

}  // namespace estimator_spec_kernels
