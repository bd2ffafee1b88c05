// The helpers of common.h that are not templates (common.h says what each
// does).

#include "common.h"

#include <sys/mman.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace estimator_spec_kernels {

// Rows are read at random over the whole table: with 4 KiB pages, a table
// larger than what the TLB maps costs a page walk per row besides the cache
// miss. The first time a kernel meets a table or slot buffer of at least
// kHugeBytes, it asks Linux to back the buffer's whole 2 MiB blocks with
// huge pages (MADV_HUGEPAGE, then MADV_COLLAPSE, which moves the pages
// already there, keeping their contents; about 2 s per GB, once). A buffer
// the initializers of initialize.cc made is advised before its first page
// is written, so its pages are huge from the start and it is not moved. It is
// advice: where the system refuses it (no transparent huge pages, an older
// kernel, no free huge page), nothing changes but the speed.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeBytes = 2 * kHugePage;
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace {

// Records `buffer` as met; false when it was met before.
bool FirstMeeting(const Tensor* buffer) {
  static std::mutex mu;
  static std::set<std::pair<uintptr_t, size_t>>* seen =
      new std::set<std::pair<uintptr_t, size_t>>();
  std::lock_guard<std::mutex> lock(mu);
  return seen->insert({reinterpret_cast<uintptr_t>(buffer->data()),
                       buffer->TotalBytes()})
      .second;
}

// Advises huge pages over the buffer's whole 2 MiB blocks (then moves the
// pages already there into huge pages, with `collapse`).
void Advise(const Tensor* buffer, bool collapse) {
#ifdef __linux__
  const uintptr_t data = reinterpret_cast<uintptr_t>(buffer->data());
  const uintptr_t begin = (data + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (data + buffer->TotalBytes()) & ~(kHugePage - 1);
  if (end <= begin) return;
  void* start = reinterpret_cast<void*>(begin);
  if (madvise(start, end - begin, MADV_HUGEPAGE) == 0 && collapse) {
    madvise(start, end - begin, MADV_COLLAPSE);
  }
#endif
}

}  // namespace

void AdviseHugePages(const Tensor* buffer) {
  if (buffer->TotalBytes() < kHugeBytes || !FirstMeeting(buffer)) return;
  Advise(buffer, /*collapse=*/true);
}

void AdviseFreshHugePages(const Tensor* buffer) {
  if (buffer->TotalBytes() < kHugeBytes) return;
  FirstMeeting(buffer);
  Advise(buffer, /*collapse=*/false);
}

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

}  // namespace estimator_spec_kernels
