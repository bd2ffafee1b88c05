// The floor of one table's embedding step (bench/floor_bench.py compiles
// and runs it): the work the engine's training step does on one table,
// written as a plain loop, one thread, no TensorFlow. Per step, on a batch
// of B examples of K ids each (ids k = b * K + j):
//   forward   the step's distinct ids, in order of first appearance (an
//             open-addressing hash set sized for the batch, emptied each
//             step), where[k] = the place of id k among them, and each
//             example's activation, the sum of its K rows (combiner sum);
//             one pass, each row asked for kAhead ids before it is read;
//   backward  each distinct id's gradient: the sum of the gradient rows of
//             the examples holding it, in the order of the ids;
//   update    Adagrad on each distinct id's row, column by column:
//             a = a + g * g; w = w - (lr * g) / sqrt(a).
// The table and its accumulator are [rows, dim] float32 arrays on 2 MiB
// boundaries, advised to huge pages (as the engine's kernels advise theirs)
// and written in full before the first step, so no page fault is timed.
//
// Usage: floor_loop IDS GRAD ROWS BATCH K DIM LR ACC0 WARMUP STEPS
//                   [INIT|- [DUMP]]
//   IDS   int64 ids [batches, BATCH, K]; step s uses batch s % batches;
//   GRAD  float32 [BATCH, DIM], every step's gradient of the activations;
//   INIT  float32 [ROWS, DIM], the table's first values (else a fixed
//         pattern; the accumulator starts at ACC0 everywhere);
//   DUMP  where to write the table then the accumulator after the steps.
// Prints one line: PEER_RESULT and a JSON object (medians over the STEPS
// steps after WARMUP).

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

constexpr int64_t kAhead = 16;             // rows asked for ahead of use
constexpr size_t kHugePage = size_t{2} << 20;

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "floor_loop: %s\n", message.c_str());
  std::exit(2);
}

int64_t Integer(const char* text, const char* name) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 0) {
    Fail(std::string(name) + " must be an integer >= 0; got '" + text + "'");
  }
  return value;
}

float Number(const char* text, const char* name) {
  char* end = nullptr;
  const float value = std::strtof(text, &end);
  if (*text == '\0' || *end != '\0' || !(value > 0.0f) || std::isinf(value)) {
    Fail(std::string(name) + " must be a number > 0; got '" + text + "'");
  }
  return value;
}

template <typename T>
std::vector<T> ReadFile(const char* path, const char* name) {
  FILE* file = std::fopen(path, "rb");
  if (file == nullptr) Fail(std::string("cannot open ") + name + " " + path);
  std::fseek(file, 0, SEEK_END);
  const long bytes = std::ftell(file);
  std::fseek(file, 0, SEEK_SET);
  if (bytes <= 0 || bytes % sizeof(T) != 0) {
    Fail(std::string(name) + " " + path + " is empty or not whole values");
  }
  std::vector<T> values(bytes / sizeof(T));
  if (std::fread(values.data(), sizeof(T), values.size(), file) !=
      values.size()) {
    Fail(std::string("cannot read ") + name + " " + path);
  }
  std::fclose(file);
  return values;
}

// `count` floats on a 2 MiB boundary, advised to huge pages, all set to
// `value` (so every page is there before timing).
float* State(int64_t count, float value) {
  const size_t bytes =
      (count * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, bytes);
  if (memory == nullptr) Fail("out of memory for the table");
  madvise(memory, bytes, MADV_HUGEPAGE);  // advice: ignored where refused
  float* data = static_cast<float*>(memory);
  std::fill(data, data + bytes / sizeof(float), value);
  return data;
}

inline void Prefetch(const float* row, int64_t dim) {
  for (int64_t j = 0; j < dim; j += 16) __builtin_prefetch(row + j, 1, 3);
}

// The step's distinct ids (see the top of the file).
struct DistinctIds {
  explicit DistinctIds(int64_t n) {
    capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    shift = 64 - __builtin_ctzll(capacity);
    keys.resize(capacity);
    places.resize(capacity);
    where.resize(n);
    ids.reserve(n);
  }

  void Clear() {
    std::fill(places.begin(), places.end(), -1);
    ids.clear();
  }

  // The place of `id` among the distinct ids, added if new.
  int32_t Place(int64_t id) {
    uint64_t slot = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ULL) >>
                    shift;
    while (true) {
      if (places[slot] < 0) {
        keys[slot] = id;
        places[slot] = static_cast<int32_t>(ids.size());
        ids.push_back(id);
        return places[slot];
      }
      if (keys[slot] == id) return places[slot];
      slot = (slot + 1) & (capacity - 1);
    }
  }

  int64_t capacity;
  int shift;
  std::vector<int64_t> keys;
  std::vector<int32_t> places;  // -1: free
  std::vector<int32_t> where;   // per id of the batch
  std::vector<int64_t> ids;     // distinct, in order of first appearance
};

struct Shape {
  int64_t batch, k, dim;
};

// Distinct ids and activations `out` [batch, dim] of the batch `ids`.
void Forward(const Shape& s, const int64_t* ids, const float* w,
             DistinctIds* distinct, float* out) {
  const int64_t n = s.batch * s.k, dim = s.dim;
  distinct->Clear();
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    Prefetch(w + ids[i] * dim, dim);
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    float* __restrict o = out + b * dim;
    for (int64_t j = 0; j < s.k; ++j) {
      const int64_t k = b * s.k + j;
      if (k + kAhead < n) Prefetch(w + ids[k + kAhead] * dim, dim);
      distinct->where[k] = distinct->Place(ids[k]);
      const float* __restrict row = w + ids[k] * dim;
      if (j == 0) {
        std::memcpy(o, row, dim * sizeof(float));
      } else {
        for (int64_t c = 0; c < dim; ++c) o[c] += row[c];
      }
    }
  }
}

// sums [distinct, dim]: each distinct id's gradient.
void Backward(const Shape& s, const DistinctIds& distinct, const float* grad,
              std::vector<float>* sums) {
  const int64_t dim = s.dim;
  sums->assign(distinct.ids.size() * dim, 0.0f);
  float* out = sums->data();
  for (int64_t k = 0; k < s.batch * s.k; ++k) {
    float* __restrict row =
        out + static_cast<int64_t>(distinct.where[k]) * dim;
    const float* __restrict g = grad + (k / s.k) * dim;
    for (int64_t c = 0; c < dim; ++c) row[c] += g[c];
  }
}

void Update(int64_t dim, const std::vector<int64_t>& ids, const float* sums,
            float lr, float* w, float* acc) {
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    Prefetch(w + ids[i] * dim, dim);
    Prefetch(acc + ids[i] * dim, dim);
  }
  for (int64_t u = 0; u < n; ++u) {
    if (u + kAhead < n) {
      Prefetch(w + ids[u + kAhead] * dim, dim);
      Prefetch(acc + ids[u + kAhead] * dim, dim);
    }
    float* __restrict wr = w + ids[u] * dim;
    float* __restrict ar = acc + ids[u] * dim;
    const float* __restrict g = sums + u * dim;
    for (int64_t c = 0; c < dim; ++c) {
      const float a = ar[c] + g[c] * g[c];
      ar[c] = a;
      wr[c] = wr[c] - (lr * g[c]) / std::sqrt(a);
    }
  }
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

double Ms(std::chrono::steady_clock::time_point a,
          std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double CpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + 1e-9 * now.tv_nsec;
}

void Dump(const char* path, const float* w, const float* acc, int64_t count) {
  FILE* file = std::fopen(path, "wb");
  if (file == nullptr ||
      std::fwrite(w, sizeof(float), count, file) != size_t(count) ||
      std::fwrite(acc, sizeof(float), count, file) != size_t(count) ||
      std::fclose(file) != 0) {
    Fail(std::string("cannot write ") + path);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 11 || argc > 13) {
    Fail("usage: floor_loop IDS GRAD ROWS BATCH K DIM LR ACC0 WARMUP STEPS "
         "[INIT|- [DUMP]]");
  }
  const int64_t rows = Integer(argv[3], "ROWS");
  const Shape s{Integer(argv[4], "BATCH"), Integer(argv[5], "K"),
                Integer(argv[6], "DIM")};
  const float lr = Number(argv[7], "LR");
  const float acc0 = Number(argv[8], "ACC0");
  const int64_t warmup = Integer(argv[9], "WARMUP");
  const int64_t steps = Integer(argv[10], "STEPS");
  const std::vector<int64_t> ids = ReadFile<int64_t>(argv[1], "IDS");
  const std::vector<float> grad = ReadFile<float>(argv[2], "GRAD");
  const int64_t per_batch = s.batch * s.k;
  if (per_batch == 0 || ids.size() % per_batch != 0) {
    Fail("IDS does not hold whole batches of BATCH x K ids");
  }
  if (static_cast<int64_t>(grad.size()) != s.batch * s.dim) {
    Fail("GRAD must hold BATCH x DIM floats");
  }
  for (const int64_t id : ids) {
    if (id < 0 || id >= rows) Fail("an id is outside [0, ROWS)");
  }
  const int64_t count = rows * s.dim;
  float* w = State(count, 0.0f);
  float* acc = State(count, acc0);
  if (argc > 11 && std::string(argv[11]) != "-") {
    const std::vector<float> init = ReadFile<float>(argv[11], "INIT");
    if (static_cast<int64_t>(init.size()) != count) {
      Fail("INIT must hold ROWS x DIM floats");
    }
    std::copy(init.begin(), init.end(), w);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      w[i] = 1e-4f * static_cast<float>((i * 2654435761LL) % 2001 - 1000);
    }
  }

  const int64_t batches = ids.size() / per_batch;
  DistinctIds distinct(per_batch);
  std::vector<float> out(s.batch * s.dim), sums;
  std::vector<double> total, forward, backward, update;
  double checksum = 0.0, distinct_sum = 0.0, cpu_start = 0.0;
  auto wall_start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      cpu_start = CpuSeconds();
      wall_start = std::chrono::steady_clock::now();
    }
    const int64_t* batch = ids.data() + (step % batches) * per_batch;
    const auto t0 = std::chrono::steady_clock::now();
    Forward(s, batch, w, &distinct, out.data());
    const auto t1 = std::chrono::steady_clock::now();
    Backward(s, distinct, grad.data(), &sums);
    const auto t2 = std::chrono::steady_clock::now();
    Update(s.dim, distinct.ids, sums.data(), lr, w, acc);
    const auto t3 = std::chrono::steady_clock::now();
    checksum += out[step % out.size()];  // keeps the activations computed
    if (step < warmup) continue;
    total.push_back(Ms(t0, t3));
    forward.push_back(Ms(t0, t1));
    backward.push_back(Ms(t1, t2));
    update.push_back(Ms(t2, t3));
    distinct_sum += distinct.ids.size();
  }
  const double wall = Ms(wall_start, std::chrono::steady_clock::now()) / 1e3;
  const double cpus = wall > 0 ? (CpuSeconds() - cpu_start) / wall : 0.0;
  if (argc > 12) Dump(argv[12], w, acc, count);
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "PEER_RESULT {\"step_ms\": %.6f, \"phases_ms\": {\"forward\": %.6f, "
      "\"backward\": %.6f, \"update\": %.6f}, \"distinct_ids\": %.1f, "
      "\"steps\": %lld, \"cpus\": %.3f, \"peak_rss_mb\": %.1f, "
      "\"checksum\": %.6g}\n",
      Median(total), Median(forward), Median(backward), Median(update),
      steps ? distinct_sum / steps : 0.0, static_cast<long long>(steps), cpus,
      usage.ru_maxrss / 1024.0, checksum);
  return 0;
}
