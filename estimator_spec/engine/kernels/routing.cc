// The routing of a table's distinct ids to its partitions.

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace estimator_spec_kernels {

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

}  // namespace estimator_spec_kernels
