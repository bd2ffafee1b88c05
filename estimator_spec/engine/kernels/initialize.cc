// New table and slot partitions (docs/numerics.md, 'Initializers';
// docs/performance.md, 'Table size'). Each op makes a new float32 matrix
// and advises huge pages over it before its first page is written
// (AdviseFreshHugePages), so a large partition is backed by huge pages as
// it is filled: no later move of its pages (MADV_COLLAPSE, about 2 s per
// GB on the first step), and one page fault per 2 MiB instead of per 4 KiB
// while it is filled. The values are those of TensorFlow's own ops:
//   HostEmbeddingFill             every entry `value` (as Fill);
//   HostEmbeddingTruncatedNormal  TensorFlow's TruncatedNormal draws for
//                                 the same `seed` and `seed2`, from TF's
//                                 own generator and distribution classes
//                                 (its public kernel headers), so the
//                                 numbers are the same bits.

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/random_op.h"
#include "tensorflow/core/kernels/random_op_cpu.h"
#include "tensorflow/core/lib/random/random_distributions.h"
#include "tensorflow/core/util/guarded_philox_random.h"
#include "tensorflow/core/util/work_sharder.h"

namespace estimator_spec_kernels {

namespace {

// Allocates output 0 as a [rows, columns] float32 matrix given by the
// `shape` input (a vector of two non-negative integers), advised for huge
// pages.
template <typename Int>
absl::Status NewMatrix(OpKernelContext* context, Tensor** out) {
  const Tensor& shape = context->input(0);
  if (shape.dims() != 1 || shape.NumElements() != 2) {
    return errors::InvalidArgument(
        "shape must be a vector of two sizes; got a tensor of shape ",
        shape.shape().DebugString());
  }
  const auto dims = shape.flat<Int>();
  if (dims(0) < 0 || dims(1) < 0) {
    return errors::InvalidArgument("shape must not be negative; got [",
                                   dims(0), ", ", dims(1), "]");
  }
  tensorflow::TensorShape matrix;
  TF_RETURN_IF_ERROR(tensorflow::TensorShape::BuildTensorShape(
      {static_cast<int64_t>(dims(0)), static_cast<int64_t>(dims(1))},
      &matrix));
  TF_RETURN_IF_ERROR(context->allocate_output(0, matrix, out));
  AdviseFreshHugePages(*out);
  return absl::OkStatus();
}

}  // namespace

template <typename Int>
class FillOp : public OpKernel {
 public:
  explicit FillOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& value = context->input(1);
    OP_REQUIRES(context, value.dims() == 0,
                errors::InvalidArgument("value must be a scalar; got shape ",
                                        value.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, NewMatrix<Int>(context, &out));
    const float fill = value.scalar<float>()();
    float* data = out->flat<float>().data();
    // Split over the intra-op threads: writing the pages is the work.
    const auto* workers =
        context->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(workers->num_threads, workers->workers,
                      out->NumElements(), /*cost_per_unit=*/4,
                      [data, fill](int64_t begin, int64_t end) {
                        std::fill(data + begin, data + end, fill);
                      });
  }
};

template <typename Int>
class TruncatedNormalOp : public OpKernel {
 public:
  explicit TruncatedNormalOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, generator_.Init(context));
  }

  void Compute(OpKernelContext* context) override {
    using Distribution = tensorflow::random::TruncatedNormalDistribution<
        tensorflow::random::SingleSampleAdapter<
            tensorflow::random::PhiloxRandom>,
        float>;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, NewMatrix<Int>(context, &out));
    auto flat = out->flat<float>();
    // As TensorFlow's TruncatedNormal kernel: 256 samples reserved per
    // output, the draws split over the intra-op threads by the functor.
    tensorflow::functor::FillPhiloxRandom<tensorflow::functor::CPUDevice,
                                          Distribution>()(
        context, context->eigen_device<tensorflow::functor::CPUDevice>(),
        /*key=*/nullptr, /*counter=*/nullptr,
        generator_.ReserveRandomOutputs(flat.size(), 256), flat.data(),
        flat.size(), Distribution());
  }

 private:
  tensorflow::GuardedPhiloxRandom generator_;
};

// The output's shape: the `shape` input's value, where it is known.
absl::Status ShapeFromInput(tensorflow::shape_inference::InferenceContext* c) {
  tensorflow::shape_inference::ShapeHandle out;
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

REGISTER_OP("HostEmbeddingFill")
    .Input("shape: Tshape")
    .Input("value: float")
    .Output("output: float")
    .Attr("Tshape: {int32, int64}")
    // Stateful: graph optimization must not fold it into a constant (which
    // the session would keep beside the variable).
    .SetIsStateful()
    .SetShapeFn(ShapeFromInput);

REGISTER_OP("HostEmbeddingTruncatedNormal")
    .Input("shape: Tshape")
    .Output("output: float")
    .Attr("seed: int = 0")
    .Attr("seed2: int = 0")
    .Attr("Tshape: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(ShapeFromInput);

#define ESTIMATOR_SPEC_REGISTER_INIT(NAME, OP, INT)                          \
  REGISTER_KERNEL_BUILDER(                                                  \
      Name(NAME).Device(DEVICE_CPU).TypeConstraint<INT>("Tshape"), OP<INT>)

ESTIMATOR_SPEC_REGISTER_INIT("HostEmbeddingFill", FillOp, int32_t);
ESTIMATOR_SPEC_REGISTER_INIT("HostEmbeddingFill", FillOp, int64_t);
ESTIMATOR_SPEC_REGISTER_INIT("HostEmbeddingTruncatedNormal",
                             TruncatedNormalOp, int32_t);
ESTIMATOR_SPEC_REGISTER_INIT("HostEmbeddingTruncatedNormal",
                             TruncatedNormalOp, int64_t);
#undef ESTIMATOR_SPEC_REGISTER_INIT

}  // namespace estimator_spec_kernels
