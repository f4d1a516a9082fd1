#include <atomic>

#include "core/error.h"
#include "cuda/cuda_ops.h"
#include "cuda/knobs.h"

namespace ferry::cuda {

void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  fail("cuda", what, ": ", cudaGetErrorString(err), " at ", file, ":", line);
}

namespace {
std::atomic<int> g_pdl_override{-1};  // -1: by device and environment
}  // namespace

void set_dependent_launch(std::optional<bool> on) {
  g_pdl_override.store(on ? (*on ? 1 : 0) : -1, std::memory_order_relaxed);
}

bool dependent_launch(int device) {
  const int forced = g_pdl_override.load(std::memory_order_relaxed);
  static const bool env_off = knob_off("FERRY_CUDA_PDL");
  if (forced == 0 || (forced < 0 && env_off)) return false;
  // Capability per device, asked once (0: not yet known, 1: no, 2: yes).
  static std::atomic<int> capable[64];
  if (device < 0 || device >= 64) return false;
  int c = capable[device].load(std::memory_order_relaxed);
  if (c == 0) {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
          "cudaDeviceGetAttribute", __FILE__, __LINE__);
    c = major >= 9 ? 2 : 1;
    capable[device].store(c, std::memory_order_relaxed);
  }
  return c == 2;
}

}  // namespace ferry::cuda
