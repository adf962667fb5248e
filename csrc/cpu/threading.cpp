// Work distribution for the kernels, compiled once without ISA flags.
//
// The kernels run on the OpenMP runtime the process already has loaded (torch's libgomp or
// libiomp5), reached through GOMP_parallel, which both export. Attention then runs on the very
// thread team that runs torch's GEMMs: a second pool would spin against the first on the
// same cores. The Python side passes the runtime's path (from /proc/self/maps); the extension
// itself links no OpenMP library. Without a runtime, work is spread over std::threads.
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <thread>
#include <vector>

#include "api.h"

namespace octavo {
namespace threading {

typedef void (*gomp_parallel_fn)(void (*)(void*), void*, unsigned, unsigned);
typedef int (*omp_int_fn)();

static gomp_parallel_fn g_parallel = nullptr;
static omp_int_fn g_thread_num = nullptr;
static omp_int_fn g_max_threads = nullptr;

bool init_openmp_from_library(const char* path, char* err, size_t err_len) {
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, err_len, "dlopen(%s) failed: %s", path, dlerror());
    return false;
  }
  void* p = dlsym(h, "GOMP_parallel");
  void* t = dlsym(h, "omp_get_thread_num");
  void* m = dlsym(h, "omp_get_max_threads");
  if (!p || !t || !m) {
    snprintf(err, err_len, "%s lacks GOMP_parallel/omp_get_thread_num/omp_get_max_threads", path);
    return false;
  }
  set_openmp(p, t, m);
  return true;
}

void set_openmp(void* gomp_parallel, void* omp_get_thread_num, void* omp_get_max_threads) {
  g_parallel = (gomp_parallel_fn)gomp_parallel;
  g_thread_num = (omp_int_fn)omp_get_thread_num;
  g_max_threads = (omp_int_fn)omp_get_max_threads;
}

bool have_openmp() { return g_parallel != nullptr; }

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (g_max_threads) return g_max_threads();
  unsigned n = std::thread::hardware_concurrency();
  return n ? (int)n : 1;
}

namespace {
struct Job {
  void (*fn)(void*, int64_t, int);
  void* ctx;
  int64_t n_items;
  std::atomic<int64_t> next{0};
};

void drain(Job* job, int tid) {
  for (;;) {
    const int64_t i = job->next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job->n_items) break;
    job->fn(job->ctx, i, tid);
  }
}

void gomp_trampoline(void* p) { drain((Job*)p, g_thread_num()); }
}  // namespace

void parallel_run(int64_t n_items, int threads, void (*fn)(void*, int64_t, int), void* ctx) {
  if (n_items <= 0) return;
  threads = resolve_threads(threads);
  if (threads > n_items) threads = (int)n_items;
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.n_items = n_items;
  if (threads <= 1) {
    drain(&job, 0);
  } else if (g_parallel) {
    g_parallel(&gomp_trampoline, &job, (unsigned)threads, 0);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (int t = 1; t < threads; ++t) pool.emplace_back(drain, &job, t);
    drain(&job, 0);
    for (auto& th : pool) th.join();
  }
}

namespace {
struct BindJob {
  const int* cpus;
  int n;
  bool pin_caller;
  std::atomic<int> ok{0};
};
bool pin_self(int cpu) {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
#else
  (void)cpu;
  return false;
#endif
}
void bind_one(void* p) {
  BindJob* j = (BindJob*)p;
  const int tid = g_thread_num();
  if (tid == 0 && !j->pin_caller) return;
  if (tid < j->n && pin_self(j->cpus[tid])) j->ok.fetch_add(1);
}
}  // namespace

int bind_threads(const int* cpus, int n, bool pin_caller) {
  if (n <= 0) return 0;
  BindJob job;
  job.cpus = cpus;
  job.n = n;
  job.pin_caller = pin_caller;
  if (g_parallel) {
    g_parallel(&bind_one, &job, (unsigned)n, 0);
    return job.ok.load();
  }
  return pin_caller && pin_self(cpus[0]) ? 1 : 0;
}

}  // namespace threading
}  // namespace octavo
