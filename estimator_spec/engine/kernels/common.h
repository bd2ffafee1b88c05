// What the host embedding engine's compiled kernels share. The kernels are
// the .cc files of this folder, one for each phase of a step, compiled
// together into one library (library.cc includes them all;
// kernels/builder.py builds and loads it, kernels/__init__.py wraps each
// op). Training uses them where the TensorFlow-op path would compute the
// same numbers:
//   initialize.cc
//     HostEmbeddingFill         a new table or slot partition, every entry
//                               one value;
//     HostEmbeddingTruncatedNormal  a new table partition drawn as
//                               TruncatedNormal draws it, scaled and moved;
//   inputs.cc
//     HostEmbeddingExtremes     each feature's largest and smallest index
//                               and id;
//     HostEmbeddingDropNegativeIds  the ids of features without negative
//                               ones;
//     HostEmbeddingCheckIds     the input checks of every feature's ids;
//   lookup.cc
//     HostEmbeddingGatherRows   the rows of the step's ids, fetched ahead;
//     HostEmbeddingLookup       a table's distinct ids, their places and the
//                               combiners of its features, in one op;
//     HostEmbeddingCombine      the combiners of a table gathered by
//                               partition;
//     HostEmbeddingSquaredSums  each partition's sum of squares, read in
//                               place (a summary's norm);
//   routing.cc
//     HostEmbeddingRouteIds     a table's distinct ids grouped by partition;
//   gradients.cc
//     HostEmbeddingIdGradients  the per-id gradient sums of one table;
//     HostEmbeddingCheckAll     the step's gate on every table's sums
//                               (finite);
//   updates.cc
//     HostEmbedding*Rows        in-place optimizer updates of the touched
//                               rows;
//     HostEmbeddingShareOnRead  variables out of copy-on-read mode before a
//                               checkpoint's save reads them.
// The helpers below that are not templates are defined in common.cc.

#ifndef ESTIMATOR_SPEC_ENGINE_KERNELS_COMMON_H_
#define ESTIMATOR_SPEC_ENGINE_KERNELS_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"

namespace estimator_spec_kernels {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::Var;
namespace errors = tensorflow::errors;

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

// Asks Linux, the first time a kernel meets a large table or slot buffer,
// to back it with huge pages (common.cc says when and why).
void AdviseHugePages(const Tensor* buffer);
// The same for a buffer not written yet: its pages are made huge as they
// are first written, and AdviseHugePages then leaves it as it is.
void AdviseFreshHugePages(const Tensor* buffer);

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

// Whether `variable` holds a table: initialized, a float32 matrix.
absl::Status CheckTable(const Var* variable, const char* what);

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
                           const Tensor& weights, int64_t count);

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

// messages[i] for each i of `selected`, in order, with `separator` between.
std::string Joined(const std::vector<std::string>& messages,
                   const std::vector<int>& selected,
                   const std::string& separator);

}  // namespace estimator_spec_kernels

#endif  // ESTIMATOR_SPEC_ENGINE_KERNELS_COMMON_H_
