// The lookup's kernels: rows gathered by id, the combiners of a table's
// features over rows gathered partition by partition, and a
// single-partition table's whole lookup in one op.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

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

// The sum of the squares of every entry of each variable given (table or
// slot partitions, float32 matrices), read in place under the variable's
// shared lock and summed in double: a summary's norm of a table without a
// copy of it or a full-size temporary (docs/performance.md, 'Table size').
class SquaredSumsOp : public OpKernel {
 public:
  explicit SquaredSumsOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int n = context->num_inputs();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({n}), &out));
    for (int i = 0; i < n; ++i) {
      tensorflow::core::RefCountPtr<Var> variable;
      OP_REQUIRES_OK(context, tensorflow::LookupResource(
                                  context, tensorflow::HandleFromInput(context, i),
                                  &variable));
      tensorflow::tf_shared_lock lock(*variable->mu());
      OP_REQUIRES_OK(context, CheckTable(variable.get(), "a variable"));
      const Tensor* values = variable->tensor();
      const float* v = values->flat<float>().data();
      const int64_t size = values->NumElements();
      double sum = 0;
      for (int64_t j = 0; j < size; ++j) {
        sum += static_cast<double>(v[j]) * v[j];
      }
      out->flat<float>()(i) = static_cast<float>(sum);
    }
  }
};

REGISTER_OP("HostEmbeddingSquaredSums")
    .Input("variables: N * resource")
    .Output("sums: float")
    .Attr("N: int >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    });
REGISTER_KERNEL_BUILDER(Name("HostEmbeddingSquaredSums").Device(DEVICE_CPU),
                        SquaredSumsOp);

}  // namespace estimator_spec_kernels
