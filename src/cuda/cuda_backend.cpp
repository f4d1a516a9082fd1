#include "cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_ops.h"
#include "cuda/fp8.h"
#include "cuda/knobs.h"
#include "cuda/matmul_tc.cuh"
#include "cuda/step_profile.h"

namespace ferry::cuda {

namespace {

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuda", what, ": cuBLAS status ", static_cast<int>(st));
}

// The KV memory pools alive in the process (KvPool), so that an
// allocation that finds the device full can take back what they hold
// unused before it reports exhaustion.
std::mutex g_pools_mutex;
std::vector<cudaMemPool_t> g_pools;

// Gives every KV pool's unused memory back to the device; false if none
// held any pool. Waits for the device first (frees still in flight).
bool trim_kv_pools() {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  if (g_pools.empty()) return false;
  (void)cudaDeviceSynchronize();
  for (cudaMemPool_t pool : g_pools) (void)cudaMemPoolTrimTo(pool, 0);
  return true;
}

// An allocation (alloc(&p)) that reports exhaustion as std::bad_alloc (what
// KV allocators promise), after one retry with the KV pools trimmed, and
// other failures as ferry::Error.
template <class Alloc>
void* alloc_or_throw(Alloc&& alloc) {
  void* p = nullptr;
  cudaError_t e = alloc(&p);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the error state
    if (trim_kv_pools()) e = alloc(&p);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
  }
  FERRY_CUDA_CHECK(e);
  return p;
}

// cudaMalloc, failing as alloc_or_throw says.
void* device_alloc(size_t bytes) {
  return alloc_or_throw([&](void** p) { return cudaMalloc(p, std::max<size_t>(bytes, 1)); });
}

// A memory pool for KV planes, allocated and freed in the stream's order
// (cudaMallocFromPoolAsync, cudaFreeAsync). A row operation between steps
// (requests joining or leaving, the planes growing) replaces every layer's
// planes; with cudaMalloc and cudaFree each new plane was a driver call and
// each old one a device-wide synchronisation, up to 94 ms between two
// decode steps at 256 streams (FERRY_CUDA_PROFILE). The pool keeps what is
// freed for the next planes (release threshold: everything) and gives it
// back when an allocation anywhere finds the device full (trim_kv_pools).
// A device without memory pools gets cudaMalloc and cudaFree (pool null).
struct KvPool {
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;  // null once the backend's stream is gone
  KvPool(int device, cudaStream_t s) : stream(s) {
    int pools = 0;
    if (knob_off("FERRY_CUDA_KV_POOL") ||  // off: tests the fallback
        cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
        pools == 0) {
      (void)cudaGetLastError();
      return;
    }
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    FERRY_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    uint64_t keep = UINT64_MAX;
    FERRY_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    std::lock_guard<std::mutex> lock(g_pools_mutex);
    g_pools.push_back(pool);
  }
  ~KvPool() {
    if (!pool) return;
    {
      std::lock_guard<std::mutex> lock(g_pools_mutex);
      std::erase(g_pools, pool);
    }
    cudaMemPoolDestroy(pool);  // (after the last plane: every buffer holds the pool)
  }
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
};

struct DeviceBuffer final : kv::KvBuffer {
  std::shared_ptr<KvPool> pool;
  // In stream order while the backend's stream lives (after the work that
  // reads the plane), else at once.
  ~DeviceBuffer() override {
    if (pool->pool && pool->stream)
      cudaFreeAsync(data, pool->stream);
    else
      cudaFree(data);  // waits for work in flight
  }
};

// KV bytes in device memory (a KvPool); every move is a device copy on the
// backend's stream, ordered with the kernels that read and write the planes.
class DeviceKvAllocator final : public kv::KvAllocator {
 public:
  DeviceKvAllocator(int device, cudaStream_t stream)
      : stream_(stream), pool_(std::make_shared<KvPool>(device, stream)) {}
  ~DeviceKvAllocator() override {
    cudaFree(temp_);
    cudaFree(descs_dev_);
  }

  std::shared_ptr<kv::KvBuffer> allocate(size_t bytes) override {
    auto b = allocate_raw(bytes);
    FERRY_CUDA_CHECK(cudaMemsetAsync(b->data, 0, bytes, stream_));
    return b;
  }

  // The backend's stream is about to go: later frees are synchronous.
  void detach_stream() { pool_->stream = nullptr; }

  // A rebuild's copies in one kernel (kv_copy) instead of a driver call
  // each (a rebuild of 256 rows of the 8B cache is 16,384 copies).
  void copy_batch(std::span<const Copy2d> copies) override {
    if (copies.size() < kBatchFrom) return KvAllocator::copy_batch(copies);
    launch_copies(copies, [](const Copy2d& c) { return c; });
  }

  // A filter's moves: every source into a bounce from the pool, then the
  // bounce into every destination (two kernels); one by one if no bounce
  // can be had.
  void copy_moves(std::span<const Copy2d> moves) override {
    if (moves.size() < kBatchFrom) return KvAllocator::copy_moves(moves);
    size_t total = 0;
    for (const Copy2d& c : moves) total += c.width * c.height;
    std::shared_ptr<kv::KvBuffer> bounce;
    try {
      bounce = allocate_raw(total);
    } catch (const std::bad_alloc&) {
      return KvAllocator::copy_moves(moves);
    }
    size_t at = 0;
    launch_copies(moves, [&](const Copy2d& c) {
      Copy2d in{bounce->data + at, c.width, c.src, c.spitch, c.width, c.height};
      at += c.width * c.height;
      return in;
    });
    at = 0;
    launch_copies(moves, [&](const Copy2d& c) {
      Copy2d out{c.dst, c.dpitch, bounce->data + at, c.width, c.width, c.height};
      at += c.width * c.height;
      return out;
    });
  }

  void copy_2d(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch, size_t width,
               size_t height) override {
    if (width == 0 || height == 0 || dst == src) return;
    if (height == 1) {
      // cudaMemcpyAsync handles overlap within one run only through a
      // bounce; do that for a move of overlapping bytes.
      if (dst < src + width && src < dst + width) {
        uint8_t* t = temp(width);
        FERRY_CUDA_CHECK(cudaMemcpyAsync(t, src, width, cudaMemcpyDeviceToDevice, stream_));
        src = t;
      }
      FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    const uint8_t* s_end = src + (height - 1) * spitch + width;
    const uint8_t* d_end = dst + (height - 1) * dpitch + width;
    if (dst < s_end && src < d_end) {  // a move within one buffer: bounce
      uint8_t* t = temp(width * height);
      FERRY_CUDA_CHECK(cudaMemcpy2DAsync(t, width, src, spitch, width, height,
                                         cudaMemcpyDeviceToDevice, stream_));
      src = t;
      spitch = width;
    }
    FERRY_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                       cudaMemcpyDeviceToDevice, stream_));
  }

  bool host_accessible() const override { return false; }

  size_t memory_hint() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    // Leave a tenth (at least 1 GiB) for activations, cuBLAS workspaces and
    // row-operation rebuilds.
    const size_t keep = std::max<size_t>(free / 10, size_t{1} << 30);
    return free > keep ? free - keep : 0;
  }

 private:
  uint8_t* temp(size_t bytes) {
    if (bytes > temp_size_) {
      FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old bounce may be in use
      cudaFree(temp_);
      temp_ = nullptr;
      temp_ = static_cast<uint8_t*>(device_alloc(bytes));
      temp_size_ = bytes;
    }
    return temp_;
  }
  static constexpr size_t kBatchFrom = 2;  // (a lone copy stays one driver call)

  // Pool memory, not zeroed.
  std::shared_ptr<kv::KvBuffer> allocate_raw(size_t bytes) {
    auto b = std::make_shared<DeviceBuffer>();
    void* p = nullptr;
    if (pool_->pool)
      p = alloc_or_throw([&](void** q) {
        return cudaMallocFromPoolAsync(q, std::max<size_t>(bytes, 1), pool_->pool, stream_);
      });
    else
      p = device_alloc(bytes);
    b->data = static_cast<uint8_t*>(p);
    b->size = bytes;
    b->pool = pool_;
    return b;
  }

  // One kv_copy launch of copies[i] as `map` gives them.
  template <class Map>
  void launch_copies(std::span<const Copy2d> copies, Map&& map) {
    descs_.clear();
    uint32_t max_height = 0;
    for (const Copy2d& c0 : copies) {
      const Copy2d c = map(c0);
      if (c.width == 0 || c.height == 0) continue;
      FERRY_CHECK(c.width <= UINT32_MAX && c.height <= UINT32_MAX, "kv", "copy of ", c.width, " x ",
                  c.height, " bytes");
      descs_.push_back({c.dst, c.src, c.dpitch, c.spitch, static_cast<uint32_t>(c.width),
                        static_cast<uint32_t>(c.height)});
      max_height = std::max(max_height, static_cast<uint32_t>(c.height));
    }
    if (descs_.empty()) return;
    const size_t bytes = descs_.size() * sizeof(KvCopy);
    if (bytes > descs_dev_size_) {
      FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old list may be in use
      const size_t grown = std::max(bytes, 2 * descs_dev_size_);
      cudaFree(descs_dev_);
      descs_dev_ = nullptr;
      descs_dev_size_ = 0;
      descs_dev_ = device_alloc(grown);
      descs_dev_size_ = grown;
    }
    // (From pageable memory: the call returns once descs_ may be reused.)
    FERRY_CUDA_CHECK(
        cudaMemcpyAsync(descs_dev_, descs_.data(), bytes, cudaMemcpyHostToDevice, stream_));
    kv_copy(static_cast<const KvCopy*>(descs_dev_), descs_.size(), max_height, stream_);
  }

  cudaStream_t stream_;
  std::shared_ptr<KvPool> pool_;
  uint8_t* temp_ = nullptr;
  size_t temp_size_ = 0;
  std::vector<KvCopy> descs_;
  void* descs_dev_ = nullptr;
  size_t descs_dev_size_ = 0;
};

// A device buffer that grows (contents are not kept) and is freed with
// its owner.
struct Growable {
  void* ptr = nullptr;
  size_t size = 0;
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > size) {
      FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
      const size_t grown = std::max(bytes, size * 2);
      cudaFree(ptr);
      ptr = nullptr;
      size = 0;
      ptr = device_alloc(grown);
      size = grown;
    }
    return ptr;
  }
  ~Growable() { cudaFree(ptr); }
};

// Up to tc::kMaxWeights weights of one type waiting for one launch
// (launch(*this)); adding one of another type, or one too many, launches
// those waiting first. Made by pending<T>(launch).
template <class T, class Launch>
class Pending {
 public:
  explicit Pending(Launch launch) : launch_(std::move(launch)) {}
  void add(const kernels::WeightView& w, const T* data, float* y) {
    if (n_ > 0 && (w.type != type || n_ == tc::kMaxWeights)) flush();
    type = w.type;
    w_[n_] = data;
    n_out_[n_] = w.n_out;
    y_[n_++] = y;
  }
  void flush() {
    if (n_ > 0) launch_(*this);
    n_ = 0;
  }
  std::span<const T* const> w() const { return {w_, n_}; }
  std::span<const size_t> n_out() const { return {n_out_, n_}; }
  std::span<float* const> y() const { return {y_, n_}; }
  DType type = DType::F32;

 private:
  Launch launch_;
  const T* w_[tc::kMaxWeights];
  size_t n_out_[tc::kMaxWeights];
  float* y_[tc::kMaxWeights];
  size_t n_ = 0;
};
template <class T, class Launch>
Pending<T, Launch> pending(Launch launch) {
  return Pending<T, Launch>(std::move(launch));
}

class CudaBackend final : public model::Backend {
 public:
  explicit CudaBackend(const CudaOptions& opts) : opts_(opts) {
    // "0": attention reads nothing before its dependency wait; "stage": it
    // stages settled keys there but folds none (AttentionFormats).
    const char* early = std::getenv("FERRY_CUDA_ATTN_EARLY");
    early_ = !early                             ? Early::Fold
             : std::strcmp(early, "0") == 0     ? Early::Off
             : std::strcmp(early, "stage") == 0 ? Early::Stage
                                                : Early::Fold;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      fail("cuda", "no CUDA device is usable (",
           e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")");
    if (opts.device < 0 || opts.device >= n)
      fail("cuda", "device ", opts.device, " does not exist (", n, " visible)");
    FERRY_CUDA_CHECK(cudaSetDevice(opts.device));
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    // A workspace of our own: cuBLAS then allocates nothing inside a CUDA
    // graph capture (fast-mode steps are captured like the others).
    blas_workspace_ = device_alloc(kBlasWorkspace);
    check_blas(cublasSetWorkspace(blas_, blas_workspace_, kBlasWorkspace), "cublasSetWorkspace");
    cudaDeviceProp prop{};
    FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, opts.device));
    name_ = std::string("cuda:") + std::to_string(opts.device) + " (" + prop.name + ")";
    kv_alloc_ = std::make_shared<DeviceKvAllocator>(opts.device, stream_);
    if (opts.fp8) {
      if (opts.deterministic)
        fail("cuda",
             "--fp8 runs with --no-deterministic: cuBLASLt picks its FP8 kernels by batch "
             "size, so a row's logits would depend on the batch");
      if (!fp8_supported(opts.device))
        fail("cuda", "--fp8 needs FP8 tensor cores (compute capability 8.9 or newer); ", prop.name,
             " is ", prop.major, ".", prop.minor);
      fp8_ = std::make_unique<Fp8Gemm>(blas_workspace_, kBlasWorkspace);
    }
    if (StepProfile::requested()) profile_ = std::make_unique<StepProfile>(stream_);
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    profile_.reset();  // prints its summary
    for (auto& [key, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (void* p : owned_) cudaFree(p);
    release_retired();
    cudaFreeHost(pinned_);
    cudaFree(staging_dev_);
    cublasDestroy(blas_);
    cudaFree(blas_workspace_);
    kv_alloc_->detach_stream();  // KV planes may outlive the backend
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }

  kernels::WeightView weight(const kernels::WeightView& host) override {
    kernels::WeightView d = host;
    const size_t bytes = host.row_bytes() * host.n_out;
    // 16 bytes of zero padding: matmul_q8 reads Q6_K rows in 16-byte-aligned
    // windows that may reach up to 15 bytes past the last row.
    void* p = device_alloc(bytes + kWeightPad);
    owned_.push_back(p);
    FERRY_CUDA_CHECK(cudaMemcpy(p, host.data, bytes, cudaMemcpyHostToDevice));
    FERRY_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(p) + bytes, 0, kWeightPad));
    d.data = static_cast<const uint8_t*>(p);
    dense_weights_ = dense_weights_ || host.type == DType::BF16 || host.type == DType::F16;
    return d;
  }

  // --fp8: a layer's dense weight as E4M3 codes with one scale per output
  // column (quantize_fp8_rows on the device, from a temporary copy of the
  // file's values), in one allocation: the scales (padded to 256 bytes),
  // then the codes. Its view has type kFp8, which only matmul_many takes.
  kernels::WeightView layer_weight(const kernels::WeightView& host) override {
    if (!fp8_ ||
        !(host.type == DType::BF16 || host.type == DType::F16 || host.type == DType::F32) ||
        host.n_in % 16 != 0)
      return weight(host);
    const size_t bytes = host.row_bytes() * host.n_out;
    const size_t head = (host.n_out * sizeof(float) + 255) / 256 * 256;
    auto* p = static_cast<uint8_t*>(device_alloc(head + host.n_in * host.n_out));
    owned_.push_back(p);
    void* tmp = device_alloc(bytes);
    FERRY_CUDA_CHECK(cudaMemcpy(tmp, host.data, bytes, cudaMemcpyHostToDevice));
    quantize_fp8_rows(tmp, host.type, host.n_out, host.n_in, p + head, reinterpret_cast<float*>(p),
                      stream_);
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaFree(tmp);
    kernels::WeightView d = host;
    d.type = kFp8;
    d.data = p;
    return d;
  }
  static constexpr DType kFp8 = static_cast<DType>(0xF8E4u);  // not a GGML type
  static const float* fp8_scales(const kernels::WeightView& w) {
    return reinterpret_cast<const float*>(w.data);
  }
  static const uint8_t* fp8_codes(const kernels::WeightView& w) {
    return w.data + (w.n_out * sizeof(float) + 255) / 256 * 256;
  }
  // Whether matmul_fp8 (rather than cuBLASLt) takes an FP8 product of
  // n_rows > fp8_gemv_rows_ rows.
  bool fp8_mma_takes(size_t n_in, size_t n_rows) const {
    return n_rows <= fp8_mma_rows_ && matmul_fp8_applies(n_in);
  }
  struct Fp8Rows {
    uint8_t* codes = nullptr;
    float* scales = nullptr;
    void* scratch = nullptr;  // for Fp8Gemm::product, when it needs some
  };
  // --fp8: the E4M3 codes of a norm's output that its kernel wrote for
  // the FP8 products reading it next (steps above gemv_fp8's rows, which
  // read bf16), in place of a quantize_fp8_rows launch (the same bits);
  // dropped by every other op (mark), as the bf16 copy is.
  // FERRY_CUDA_FP8_CODES=0: not made.
  struct Fp8Copy {
    const float* x = nullptr;
    size_t n_rows = 0, n = 0;
    Fp8RowsOut rows;
  };
  Fp8RowsOut fp8_copy_for(const float* out, size_t n_rows, size_t dim) {
    if (!fp8_ || !fp8_codes_ || !dense_weights_ || n_rows <= fp8_gemv_rows_ || dim % 16 != 0)
      return {};
    const size_t codes = (n_rows * dim + 255) / 256 * 256;
    auto* p = static_cast<uint8_t*>(x8n_.get(codes + n_rows * sizeof(float), stream_));
    fp8_copy_ = {out, n_rows, dim, {p, reinterpret_cast<float*>(p + codes)}};
    return fp8_copy_.rows;
  }

  // A call's activations as E4M3 codes (one scale per row): the codes its
  // producer wrote (fp8_copy_) or made here; and the scratch the largest
  // product of the call's weights needs.
  Fp8Rows quantize_fp8(const float* x, size_t n_rows, size_t n_in,
                       std::span<const kernels::WeightView> ws) {
    const size_t codes = (n_rows * n_in + 255) / 256 * 256;
    const size_t scales = (n_rows * sizeof(float) + 255) / 256 * 256;
    size_t scratch = 0;
    for (const kernels::WeightView& w : ws)
      scratch =
          std::max({scratch, fp8_->scratch_bytes(w.n_out, n_rows),
                    fp8_mma_takes(n_in, n_rows) ? matmul_fp8_scratch(n_in, w.n_out, n_rows) : 0});
    auto* p = static_cast<uint8_t*>(x8_.get(codes + scales + scratch, stream_));
    Fp8Rows r{p, reinterpret_cast<float*>(p + codes), scratch ? p + codes + scales : nullptr};
    if (fp8_copy_.x == x && fp8_copy_.n_rows == n_rows && fp8_copy_.n == n_in) {
      r.codes = fp8_copy_.rows.codes;
      r.scales = fp8_copy_.rows.scales;
      return r;
    }
    quantize_fp8_rows(x, DType::F32, n_rows, n_in, r.codes, r.scales, stream_);
    return r;
  }

  const float* vector(const float* host, size_t n) override {
    void* p = device_alloc(n * sizeof(float));
    owned_.push_back(p);
    FERRY_CUDA_CHECK(cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return static_cast<const float*>(p);
  }

  std::shared_ptr<kv::KvAllocator> kv_allocator() const override { return kv_alloc_; }

  void activations(std::span<const size_t> sizes, std::span<float*> out) override {
    FERRY_CHECK(sizes.size() == out.size(), "cuda", "activations: ", sizes.size(), " sizes for ",
                out.size(), " buffers");
    // A step starts here: the previous one has been read back (to_host
    // synchronised), so the staging area can be reused from its start.
    abandon_graph();  // a step that failed mid-capture left its capture open
    if (profile_) profile_->opening();
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    staged_ = 0;
    used_in_step_ = 0;
    release_retired();
    staged_pos_ = nullptr;
    auto rounded = [](size_t n) { return (n + 63) / 64 * 64; };  // 256-byte aligned
    size_t total = 0;
    for (size_t n : sizes) total += rounded(n);
    float* p = static_cast<float*>(arena_.get(total * sizeof(float), stream_));
    for (size_t i = 0; i < sizes.size(); ++i) {
      out[i] = p;
      p += rounded(sizes[i]);
    }
    shifts_state_ = 0;
    step_writes_ = nullptr;
    step_jobs_ = nullptr;
    pending_rope_ = {};                    // (a step that failed left it)
    qkv_ = {};                             // (the same)
    if (profile_) profile_->begin_step();  // (before a capture starts)
    begin_graph(sizes);
  }

  void embed(const kernels::WeightView& table, std::span<const int32_t> host_tokens,
             float* out) override {
    const int32_t* tokens = upload(host_tokens);
    if (replaying()) return;
    mark("embed");
    cuda::embed(table.data, table.type, table.n_in, tokens, host_tokens.size(), out, stream_);
  }

  void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps,
               float* out) override {
    if (replaying()) return;
    mark("rmsnorm");
    uint16_t* b = bf16_copy_for(out, n_rows * dim);
    cuda::rmsnorm(x, w, n_rows, dim, eps, out, stream_, b, fp8_copy_for(out, n_rows, dim));
  }

  void add_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim, float eps,
                   float* out) override {
    if (replaying()) return;
    mark("add_rmsnorm");
    uint16_t* b = bf16_copy_for(out, n_rows * dim);
    cuda::add_rmsnorm(x, y, w, n_rows, dim, eps, out, b, stream_, fp8_copy_for(out, n_rows, dim));
  }

  // A bf16 rounding of an activation that a norm or silu_mul has just
  // written, made by that kernel for the tensor-core product that reads it
  // next (matmul_many takes it instead of converting x again; so do fast
  // mode's cuBLAS products of bf16 weights). Only for models with dense
  // weights; every other op drops it (mark), so it is never older than the
  // f32 values it copies.
  struct Bf16Copy {
    const float* x = nullptr;
    size_t n = 0;
    const uint16_t* b = nullptr;
  };
  uint16_t* bf16_copy_for(const float* x, size_t n) {
    uint16_t* b = bf16_buffer(n);
    if (b) bf16_copy_ = {x, n, b};
    return b;
  }
  // The bf16 copy of x's n values its producer made, or null.
  const uint16_t* bf16_copy_of(const float* x, size_t n) const {
    return bf16_copy_.x == x && bf16_copy_.n == n ? bf16_copy_.b : nullptr;
  }
  // x's n values rounded to bf16 by a conversion launch, into xtc_ (where
  // a producer's copy would be: that one is dropped).
  const uint16_t* to_bf16(const float* x, size_t n) {
    flush_qkv();  // (as bf16_buffer)
    bf16_copy_ = {};
    auto* b = static_cast<uint16_t*>(xtc_.get(n * 2, stream_));
    cuda::f32_to_bf16(x, n, b, stream_);
    return b;
  }
  // Where such a copy of n values goes, or null when no product would read
  // it (no dense weights). Fast mode's cuBLAS products read it too (bf16
  // weights), so it is made at every row count.
  uint16_t* bf16_buffer(size_t n) {
    flush_qkv();  // (a held product reads its input from xtc_, which may move)
    if (!dense_weights_) return nullptr;
    return static_cast<uint16_t*>(xtc_.get(n * 2, stream_));
  }

  void matmul(const kernels::WeightView& w, const float* x, size_t n_rows, float* y) override {
    matmul_many(std::span<const kernels::WeightView>(&w, 1), x, n_rows,
                std::span<float* const>(&y, 1));
  }

  // Which kernel takes a product (docs/CUDA.md): dense bf16/f16 weights go
  // to the tensor-core kernel (activations rounded to bf16 once for all
  // the weights of the call, which share one launch), Q4_K / Q6_K in int8
  // mode to matmul_q8, other types to matmul_gguf; in fast mode,
  // steps of more than kFastMatvecRows rows go to cuBLAS instead. Within
  // the deterministic mode the choice never depends on n_rows.
  void matmul_many(std::span<const kernels::WeightView> ws, const float* x, size_t n_rows,
                   std::span<float* const> ys) override {
    if (replaying()) return;
    profile_mark("matmul");
    // x in bf16: the copy its producer made, or made here on first use.
    const uint16_t* xb = bf16_copy_of(x, n_rows * ws[0].n_in);
    if (qkv_fusable(ws, n_rows)) {
      // Held back for rope and the KV write (PendingQkv).
      if (!xb) xb = to_bf16(x, n_rows * ws[0].n_in);
      qkv_ = PendingQkv{};
      for (size_t i = 0; i < 3; ++i) {
        qkv_.w[i] = reinterpret_cast<const uint16_t*>(ws[i].data);
        qkv_.n_out[i] = ws[i].n_out;
        qkv_.y[i] = ys[i];
      }
      qkv_.n_in = ws[0].n_in;
      qkv_.n_rows = n_rows;
      qkv_.xb = xb;
      return;
    }
    Int8Rows xq;  // x quantized for int8 mode, made on first use
    Fp8Rows x8;   // x quantized for --fp8, made on first use
    // Weights of one type wait here to share one launch: dense ones for
    // the tensor-core kernel, Q4_K / Q6_K ones for int8 mode's.
    auto tc_wait = pending<uint16_t>([&](const auto& p) {
      cuda::matmul_tc_many(p.w(), p.type == DType::F16, ws[0].n_in, p.n_out(), xb, n_rows, p.y(),
                           stream_);
    });
    auto q8_wait = pending<uint8_t>([&](const auto& p) {
      cuda::matmul_q8_many(p.w(), p.type, ws[0].n_in, p.n_out(), xq.codes, xq.d, xq.dsum, n_rows,
                           p.y(), stream_);
    });
    for (size_t i = 0; i < ws.size(); ++i) {
      const kernels::WeightView& w = ws[i];
      const bool small = opts_.deterministic || n_rows <= kFastMatvecRows;
      if (w.type == kFp8 && n_rows <= fp8_gemv_rows_) {
        // Decode: the codes against x's bf16 copy, one launch.
        if (!xb) xb = to_bf16(x, n_rows * w.n_in);
        gemv_fp8(fp8_codes(w), fp8_scales(w), xb, w.n_in, w.n_out, n_rows, ys[i], stream_);
      } else if (w.type == kFp8) {
        if (!x8.codes) x8 = quantize_fp8(x, n_rows, w.n_in, ws);
        if (fp8_mma_takes(w.n_in, n_rows))
          matmul_fp8(fp8_codes(w), fp8_scales(w), x8.codes, x8.scales, w.n_in, w.n_out, n_rows,
                     ys[i], x8.scratch, stream_);
        else
          fp8_->product(fp8_codes(w), fp8_scales(w), x8.codes, x8.scales, w.n_in, w.n_out, n_rows,
                        ys[i], x8.scratch, stream_);
      } else if (int8_takes(w)) {
        if (!xq.codes) xq = quantize_rows(x, n_rows, w.n_in);
        q8_wait.add(w, w.data, ys[i]);
      } else if (!small) {
        // bf16 operands read x's bf16 copy (its producer's, or one made
        // here once for the call's weights); f16 weights convert to f16.
        if (!xb && w.type != DType::F16 && w.type != DType::F32) xb = to_bf16(x, n_rows * w.n_in);
        matmul_cublas(w, x, xb, n_rows, ys[i]);
      } else if (w.type == DType::BF16 || w.type == DType::F16) {
        if (!xb) xb = to_bf16(x, n_rows * w.n_in);
        tc_wait.add(w, reinterpret_cast<const uint16_t*>(w.data), ys[i]);
      } else {
        cuda::matmul_gguf(w.data, w.type, w.n_in, w.n_out, x, n_rows, ys[i], stream_);
      }
    }
    tc_wait.flush();
    q8_wait.flush();
  }

  // Int8 mode (--matmul int8, the CLI's default) takes Q4_K and Q6_K weights
  // to matmul_q8 in both modes: its results never depend on the batch.
  bool int8_takes(const kernels::WeightView& w) const {
    return opts_.matmul == kernels::MatmulMode::Int8 && cuda::q8_supported(w.type) &&
           w.n_in % 256 == 0;
  }
  struct Int8Rows {
    int8_t* codes = nullptr;
    float *d = nullptr, *dsum = nullptr;
  };
  // x quantized once per product call (shared by the weights of a call).
  Int8Rows quantize_rows(const float* x, size_t n_rows, size_t n_in) {
    const size_t codes = (n_rows * n_in + 255) / 256 * 256, blocks = n_rows * (n_in / 32);
    const size_t block_bytes = (blocks * sizeof(float) + 255) / 256 * 256;
    uint8_t* p = static_cast<uint8_t*>(xq_.get(codes + 2 * block_bytes, stream_));
    Int8Rows r{reinterpret_cast<int8_t*>(p), reinterpret_cast<float*>(p + codes),
               reinterpret_cast<float*>(p + codes + block_bytes)};
    cuda::quantize_q8(x, n_rows, n_in, r.codes, r.d, r.dsum, stream_);
    return r;
  }

  void rope(float* x, size_t n_heads, size_t head_dim, std::span<const int32_t> host_pos,
            const float* inv_freq) override {
    // q and k rotate by the same positions: upload them once per step.
    if (staged_pos_ == nullptr || host_pos.data() != staged_pos_host_ ||
        host_pos.size() != staged_pos_n_) {
      staged_pos_ = upload(host_pos);
      staged_pos_host_ = host_pos.data();
      staged_pos_n_ = host_pos.size();
    }
    if (replaying()) return;
    if (host_pos.size() == qkv_.n_rows &&
        qkv_.take_rope(x, n_heads, head_dim, staged_pos_, inv_freq))
      return;
    const PendingRope r{x, n_heads, head_dim, host_pos.size(), staged_pos_, inv_freq};
    if (pending_rope_.x && pending_rope_.head_dim == head_dim && pending_rope_.rows == r.rows &&
        pending_rope_.pos == r.pos && pending_rope_.inv_freq == inv_freq) {
      // The second of q and k: both in one launch.
      const PendingRope first = std::exchange(pending_rope_, PendingRope{});
      mark("rope");
      cuda::rope2(first.x, first.heads, x, n_heads, r.rows, head_dim, r.pos, inv_freq, stream_);
      return;
    }
    mark("rope");  // (launches an older pending one first)
    pending_rope_ = r;
  }
  // A rope held back to share a launch with the next one; any other op
  // (profile_mark) or the step's end launches it alone first.
  struct PendingRope {
    float* x = nullptr;
    size_t heads = 0, head_dim = 0, rows = 0;
    const int32_t* pos = nullptr;
    const float* inv_freq = nullptr;
  };
  void flush_rope() {
    if (!pending_rope_.x) return;
    const PendingRope p = std::exchange(pending_rope_, PendingRope{});
    ++launch_seq_;
    cuda::rope(p.x, p.rows, p.heads, p.head_dim, p.pos, p.inv_freq, stream_);
  }

  // A decode step's Q/K/V product held back (matmul_many) so that the
  // rope of q and k and the KV write that follow it run in its epilogue
  // (cuda::matmul_tc_qkv_rope: the same bits as the three launches). Any
  // other op first launches what was held as it would have run
  // (flush_qkv). Off with FERRY_CUDA_FUSE_QKV=0.
  struct PendingQkv {
    const uint16_t* w[3] = {};
    size_t n_out[3] = {};
    float* y[3] = {};
    size_t n_in = 0, n_rows = 0;
    const uint16_t* xb = nullptr;
    // The ropes taken (q's, then k's), by the same positions.
    int ropes = 0;
    size_t head_dim = 0;
    const int32_t* pos = nullptr;
    const float* inv_freq = nullptr;
    bool active() const { return xb != nullptr; }
    // Takes rope(x) if it is q's (first) or k's (second) over whole heads.
    bool take_rope(float* x, size_t heads, size_t hd, const int32_t* p, const float* f) {
      if (!active() || ropes >= 2 || x != y[ropes] || hd == 0 || heads * hd != n_out[ropes])
        return false;
      if (ropes == 1 && (hd != head_dim || p != pos || f != inv_freq)) return false;
      head_dim = hd, pos = p, inv_freq = f;
      ++ropes;
      return true;
    }
  };
  bool qkv_fusable(std::span<const kernels::WeightView> ws, size_t n_rows) const {
    if (!fuse_qkv_ || ws.size() != 3 || n_rows == 0 || n_rows > kFastMatvecRows) return false;
    size_t total = 0;
    for (const kernels::WeightView& w : ws) {
      if (w.type != DType::BF16 || w.n_in != ws[0].n_in) return false;
      total += w.n_out;
    }
    return cuda::matmul_tc_qkv_rope_applies(ws[0].n_in, total, n_rows);
  }
  // Launches the held product (and the ropes it took) as separate kernels.
  void flush_qkv() {
    if (!qkv_.active()) return;
    const PendingQkv p = std::exchange(qkv_, PendingQkv{});
    ++launch_seq_;
    cuda::matmul_tc_many(p.w, false, p.n_in, p.n_out, p.xb, p.n_rows, p.y, stream_);
    if (p.ropes == 2)
      cuda::rope2(p.y[0], p.n_out[0] / p.head_dim, p.y[1], p.n_out[1] / p.head_dim, p.n_rows,
                  p.head_dim, p.pos, p.inv_freq, stream_);
    else if (p.ropes == 1)
      cuda::rope(p.y[0], p.n_rows, p.n_out[0] / p.head_dim, p.head_dim, p.pos, p.inv_freq, stream_);
  }
  // The held product with both ropes and, for a dense cache, the KV write
  // `writes` of k and v in one launch; false when what is held does not
  // match (the caller then flushes and writes as usual). Affine caches
  // get the ropes fused and store with kv_store after.
  bool launch_qkv(const kv::BatchKv& kv, size_t layer, const float* k, const float* v,
                  const KvWrite* writes) {
    const kv::KvLayerSpec& ls = kv.spec().layers[layer];
    if (!qkv_.active() || qkv_.ropes != 2 || k != qkv_.y[1] || v != qkv_.y[2] ||
        kv.spec().head_dim != qkv_.head_dim ||
        kv.spec().n_kv_heads * qkv_.head_dim != qkv_.n_out[1] || qkv_.n_out[2] != qkv_.n_out[1])
      return false;
    const PendingQkv p = std::exchange(qkv_, PendingQkv{});
    cuda::QkvEpilogue ep;
    ep.pos = p.pos;
    ep.inv_freq = p.inv_freq;
    ep.head_dim = p.head_dim;
    if (ls.k.kind == ls.v.kind && ls.k.kind != kernels::KvFormat::Kind::Affine) {
      ep.kv = ls.k.kind;
      ep.writes = writes;
    }
    profile_mark("matmul");
    cuda::matmul_tc_qkv_rope(p.w, p.n_in, p.n_out, p.xb, p.n_rows, p.y, ep, stream_);
    if (ep.writes == nullptr) {
      mark("kv_write");
      cuda::kv_store(writes, p.n_rows, kv.spec().n_kv_heads, kv.spec().head_dim, k, v, stream_);
      store_seq_ = launch_seq_;
    }
    return true;
  }

  // Gate and up products with the gating in their epilogue where the tile
  // allows it (cuda::matmul_tc_swiglu: the same bits as the three ops), else
  // the ops one by one. The bf16 copy of gate that the down product reads
  // goes to its own buffer: the kernel still reads x's from xtc_.
  void gate_up_silu(const kernels::WeightView& w_gate, const kernels::WeightView& w_up,
                    const float* x, size_t n_rows, float* gate, float* up) override {
    if (replaying()) return;
    const size_t n_in = w_gate.n_in, F = w_gate.n_out;
    const bool fuse = dense_weights_ && (opts_.deterministic || n_rows <= kFastMatvecRows) &&
                      w_gate.type == DType::BF16 && w_up.type == DType::BF16 && w_up.n_in == n_in &&
                      w_up.n_out == F && cuda::matmul_tc_swiglu_applies(n_in, F, n_rows);
    if (!fuse) return Backend::gate_up_silu(w_gate, w_up, x, n_rows, gate, up);
    const uint16_t* xb = bf16_copy_of(x, n_rows * n_in);
    mark("matmul");
    if (!xb) xb = to_bf16(x, n_rows * n_in);
    auto* gate_b = static_cast<uint16_t*>(xtc_out_.get(n_rows * F * 2, stream_));
    cuda::matmul_tc_swiglu(reinterpret_cast<const uint16_t*>(w_gate.data),
                           reinterpret_cast<const uint16_t*>(w_up.data), n_in, F, xb, n_rows, gate,
                           gate_b, stream_);
    bf16_copy_ = {gate, n_rows * F, gate_b};
  }

  void silu_mul(float* gate, const float* up, size_t n) override {
    if (replaying()) return;
    mark("silu_mul");
    // (The copy is made in both modes: fast mode's cuBLAS products read it
    // too.)
    uint16_t* b = bf16_copy_for(gate, n);
    cuda::silu_mul(gate, up, n, stream_, b);
  }

  void add_inplace(float* x, const float* y, size_t n) override {
    if (replaying()) return;
    mark("add");
    cuda::add_inplace(x, y, n, stream_);
  }

  void gather_rows(const float* x, std::span<const size_t> host_rows, size_t dim,
                   float* out) override {
    std::vector<uint32_t> rows(host_rows.begin(), host_rows.end());
    const uint32_t* d_rows = upload(std::span<const uint32_t>(rows));
    if (replaying()) return;
    mark("gather_rows");
    cuda::gather_rows(x, d_rows, rows.size(), dim, out, stream_);
  }

  // A step's K/V writes and attention jobs differ between layers only in
  // where each layer's planes are. When every layer has the same layout
  // (no windows, same formats), the lists are built on the host once per
  // step, for the first layer asked, and expanded for every layer on the
  // device (expand_jobs); otherwise each layer builds its own.
  void kv_write(kv::BatchKv& kv, size_t layer, std::span<const model::TokenPlace> places,
                const float* k, const float* v) override {
    n_tokens_ = places.size();
    auto build = [&](size_t from_layer) {
      writes_.resize(places.size());
      for (size_t t = 0; t < places.size(); ++t) {
        const kv::BatchKv::WriteTarget w = kv.write_target(from_layer, places[t].row, places[t].i);
        writes_[t] = KvWrite{w.k, w.v, static_cast<uint32_t>(w.slot), static_cast<uint32_t>(t)};
      }
      return upload(std::span<const KvWrite>(writes_));
    };
    const KvWrite* d = nullptr;
    if (step_writes_ || layer_shifts(kv, places)) {
      if (!step_writes_)
        step_writes_ = expand_step(build(shift_base_), places.size(), step_writes_buf_);
      d = step_writes_ + layer * places.size();
    } else {
      d = build(layer);
    }
    if (replaying()) return;
    if (places.size() == qkv_.n_rows && launch_qkv(kv, layer, k, v, d)) return;
    mark("kv_write");
    cuda::kv_store(d, places.size(), kv.spec().n_kv_heads, kv.spec().head_dim, k, v, stream_);
    store_seq_ = launch_seq_;
  }

  void attention(const kv::BatchKv& kv, size_t layer, std::span<const model::TokenPlace> places,
                 const kernels::AttentionShape& shape, const float* q, float* out) override {
    const size_t q_dim = shape.n_heads * shape.head_dim;
    // The output's bf16 copy for the o projection, written by the kernel.
    uint16_t* const ob = bf16_buffer(places.size() * q_dim);
    auto build = [&](size_t from_layer) {
      jobs_.resize(places.size());
      for (size_t t = 0; t < places.size(); ++t) {
        kernels::KvSide ks, vs;
        const kernels::AttentionTask task =
            kv.attention_task(from_layer, places[t].row, places[t].i, &ks, &vs);
        AttentionJob& j = jobs_[t];
        j.q = q + t * q_dim;
        j.out = out + t * q_dim;
        j.out_bf16 = ob ? ob + t * q_dim : nullptr;
        j.k = ks;
        j.v = vs;
        j.seg[0] = task.seg[0];
        j.seg[1] = task.seg[1];
        // The query's column and the row's i tokens before it in this step
        // are written by the step; the keys before them were written by
        // earlier steps.
        const size_t n =
            (task.seg[0].end - task.seg[0].begin) + (task.seg[1].end - task.seg[1].begin);
        j.settled = static_cast<uint32_t>(n > places[t].i + 1 ? n - places[t].i - 1 : 0);
      }
      return upload(std::span<const AttentionJob>(jobs_));
    };
    const AttentionJob* d = nullptr;
    // Whether the list was written before the op just ahead of the kernels:
    // an expanded list made for an earlier layer.
    bool settled = false;
    // The expanded list holds this step's q and out: reuse it only for them.
    if ((step_jobs_ && step_jobs_q_ == q && step_jobs_out_ == out && step_jobs_bf16_ == ob) ||
        (!step_jobs_ && layer_shifts(kv, places))) {
      settled = step_jobs_ != nullptr;
      if (!step_jobs_) {
        step_jobs_ = expand_step(build(shift_base_), places.size(), step_jobs_buf_);
        step_jobs_q_ = q;
        step_jobs_out_ = out;
        step_jobs_bf16_ = ob;
      }
      d = step_jobs_ + layer * places.size();
    } else {
      d = build(layer);
    }
    // The split variant's workspace (steps of few jobs), sized before any
    // capture: a shape's first run is direct.
    const size_t ws = cuda::attention_workspace_floats(places.size(), shape);
    float* w = ws ? static_cast<float*>(attn_ws_.get(ws * sizeof(float), stream_)) : nullptr;
    if (replaying()) return;
    // Whether the last launch was kv_store (which writes neither q nor the
    // settled keys): then q's writer had finished before this call's
    // kernels can start (kv_store lets them start after its own wait).
    flush_qkv();
    flush_rope();
    const bool after_store = store_seq_ == launch_seq_;
    mark("attention");
    if (ob) bf16_copy_ = {out, places.size() * q_dim, ob};
    // (Every job of a layer has the layer's formats.)
    cuda::AttentionFormats formats;
    if (!jobs_.empty()) formats = {jobs_[0].k.format, jobs_[0].v.format};
    // Prompt chunks (consecutive places of one row) deep enough into their
    // rows that staging a tile once for four queries pays: on the H200 a
    // 4,096-token prompt's attention took 5.3 ms a layer shared against 7.1
    // per warp, 17 prompts of 128 tokens 270 against 205 µs
    // (gpu_attention_bench, docs/BENCHMARKS.md).
    size_t runs = 0, depth = 0;  // depth: the jobs' keys
    for (size_t t = 0; t < places.size(); ++t) runs += t > 0 && places[t].row == places[t - 1].row;
    for (const AttentionJob& j : jobs_)
      depth += (j.seg[0].end - j.seg[0].begin) + (j.seg[1].end - j.seg[1].begin);
    formats.prompt_chunks =
        runs * 4 >= places.size() * 3 && depth >= kSharedAttentionDepth * places.size();
    formats.jobs_settled = settled && early_ != Early::Off;
    formats.query_settled = after_store && early_ == Early::Fold;
    cuda::attention(d, places.size(), shape, formats, w, stream_);
  }

  // Greedy and top-n rows reduce on the device (select_logits) and copy
  // back their few largest logits, sampled rows draw their token there
  // (draw_logits); only rows that asked for it copy the whole vocabulary
  // row. One synchronisation, at the end.
  void outputs(const float* logits, size_t n_out, size_t vocab,
               std::span<const model::OutputNeed> needs, model::StepOutputs& out) override {
    end_graph();
    if (needs.empty()) return Backend::outputs(logits, n_out, vocab, needs, out);
    if (profile_) {
      profile_->shape(n_tokens_, n_out);
      profile_->before_wait();
    }
    out.vocab = vocab;
    out.full_row.resize(n_out);
    size_t n_full = 0, stride = 0;
    bool any_lse = false;
    select_jobs_.resize(n_out);
    draw_jobs_.assign(n_out, DrawJob{});
    draw_pens_.clear();
    bool any_draw = false;
    for (size_t o = 0; o < n_out; ++o) {
      const model::OutputNeed& n = needs[o];
      FERRY_CHECK(n.top_n <= model::kMaxTopN, "cuda", "top_n ", n.top_n, " over the limit of ",
                  model::kMaxTopN);
      out.full_row[o] = n.full ? static_cast<int64_t>(n_full++) : -1;
      const uint32_t top_n = n.full ? 0 : n.top_n;
      const bool lse = !n.full && n.lse;
      select_jobs_[o] = SelectJob{top_n, lse ? 1u : 0u};
      stride = std::max<size_t>(stride, top_n);
      any_lse = any_lse || lse;
      if (!n.full && n.draw) {
        draw_jobs_[o] = DrawJob{*n.draw, 1u, static_cast<uint32_t>(draw_pens_.size()),
                                static_cast<uint32_t>(n.penalties.size())};
        draw_pens_.insert(draw_pens_.end(), n.penalties.begin(), n.penalties.end());
        any_draw = true;
      }
    }
    // Resized, not cleared: kept across steps, no allocation or zeroing.
    out.logits.resize(n_full * vocab);
    for (size_t o = 0; o < n_out;) {  // runs of consecutive whole rows: one copy each
      if (out.full_row[o] < 0) {
        ++o;
        continue;
      }
      size_t e = o;
      while (e < n_out && out.full_row[e] >= 0) ++e;
      FERRY_CUDA_CHECK(cudaMemcpyAsync(out.logits.data() + out.full_row[o] * vocab,
                                       logits + o * vocab, (e - o) * vocab * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
      o = e;
    }
    out.top_stride = stride;
    out.top.resize(n_out * stride);
    out.top_count.assign(n_out, 0);
    out.lse.assign(any_lse ? n_out : 0, model::LogSumExp{});
    if (stride > 0 || any_lse) {
      const SelectJob* jobs = upload(std::span<const SelectJob>(select_jobs_));
      const size_t top_bytes = (n_out * stride * sizeof(model::TopLogit) + 255) / 256 * 256;
      const size_t small = (n_out * 4 + 255) / 256 * 256;
      uint8_t* d = static_cast<uint8_t*>(select_.get(top_bytes + 2 * small + n_out * 8, stream_));
      auto* top = reinterpret_cast<model::TopLogit*>(d);
      auto* count = reinterpret_cast<uint32_t*>(d + top_bytes);
      auto* mx = reinterpret_cast<float*>(d + top_bytes + small);
      auto* sum = reinterpret_cast<double*>(d + top_bytes + 2 * small);
      cuda::select_logits(logits, n_out, vocab, jobs, stride, top, count, mx, sum, stream_);
      lse_max_.resize(n_out);
      lse_sum_.resize(n_out);
      select_count_.resize(n_out);
      auto back = [&](void* dst, const void* src, size_t bytes) {
        if (bytes > 0)
          FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
      };
      back(out.top.data(), top, n_out * stride * sizeof(model::TopLogit));
      back(select_count_.data(), count, n_out * 4);
      if (any_lse) {
        back(lse_max_.data(), mx, n_out * 4);
        back(lse_sum_.data(), sum, n_out * 8);
      }
    }
    out.drawn.assign(any_draw ? n_out : 0, model::TopLogit{NAN, -1});
    if (any_draw) {
      const size_t out_bytes = (n_out * sizeof(model::TopLogit) + 255) / 256 * 256;
      uint8_t* d = static_cast<uint8_t*>(
          drawn_.get(out_bytes + std::max<size_t>(draw_pens_.size(), 1) * sizeof(float), stream_));
      const model::DrawPenalty* pens =
          draw_pens_.empty() ? nullptr : upload(std::span<const model::DrawPenalty>(draw_pens_));
      // Penalties rewrite the drawn rows in place: the step's logits are
      // this backend's scratch, and every other reader of them (the whole
      // rows' copies, select_logits) is enqueued before.
      cuda::draw_logits(const_cast<float*>(logits), n_out, vocab,
                        upload(std::span<const DrawJob>(draw_jobs_)), pens,
                        reinterpret_cast<float*>(d + out_bytes),
                        reinterpret_cast<model::TopLogit*>(d), stream_);
      FERRY_CUDA_CHECK(cudaMemcpyAsync(out.drawn.data(), d, n_out * sizeof(model::TopLogit),
                                       cudaMemcpyDeviceToHost, stream_));
    }
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profile_->end_step();
    for (size_t o = 0; o < n_out; ++o) {
      if (select_jobs_[o].top_n > 0) out.top_count[o] = select_count_[o];
      if (select_jobs_[o].lse) out.lse[o] = model::LogSumExp{lse_max_[o], lse_sum_[o]};
      if (any_draw && !draw_jobs_[o].active) out.drawn[o] = model::TopLogit{NAN, -1};
    }
  }

  void to_host(const float* x, size_t n, float* host_out) override {
    end_graph();
    if (n > 0)
      FERRY_CUDA_CHECK(
          cudaMemcpyAsync(host_out, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // Rows up to which ferry's bandwidth-bound kernel beats a GEMM library
  // even in fast mode (weights are read once per step either way).
  static constexpr size_t kFastMatvecRows = 8;
  static constexpr size_t kWeightPad = 16;
  static constexpr size_t kBlasWorkspace = size_t{32} << 20;  // cuBLAS's advice for Hopper

  // y = x W^T through cuBLAS: W row-major [n_out, n_in] is column-major
  // [n_in, n_out], so Y^T (column-major [n_out, rows]) = op_T(W) * X^T.
  // x_bf16: x's bf16 rounding if the caller has one (used for bf16 weights).
  void matmul_cublas(const kernels::WeightView& w, const float* x, const uint16_t* x_bf16,
                     size_t n_rows, float* y) {
    const int m = static_cast<int>(w.n_out), n = static_cast<int>(n_rows),
              k = static_cast<int>(w.n_in);
    const float one = 1.0f, zero = 0.0f;
    if (w.type == DType::F32) {
      check_blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                             reinterpret_cast<const float*>(w.data), k, x, k, &zero, y, m),
                 "cublasSgemm");
      return;
    }
    // bf16 operands, f32 accumulation and output.
    const void* a = w.data;
    cudaDataType_t a_type = CUDA_R_16BF;
    if (w.type == DType::F16) {
      a_type = CUDA_R_16F;
    } else if (w.type != DType::BF16) {
      uint16_t* deq = static_cast<uint16_t*>(dequant_.get(w.n_in * w.n_out * 2, stream_));
      cuda::dequantize_bf16(w.data, w.type, w.n_in, w.n_out, deq, stream_);
      a = deq;
    }
    const uint16_t* xb = a_type == CUDA_R_16BF ? x_bf16 : nullptr;
    if (!xb) {
      auto* c = static_cast<uint16_t*>(xconv_.get(n_rows * w.n_in * 2, stream_));
      if (a_type == CUDA_R_16F)
        cuda::f32_to_f16(x, n_rows * w.n_in, c, stream_);
      else
        cuda::f32_to_bf16(x, n_rows * w.n_in, c, stream_);
      xb = c;
    }
    check_blas(
        cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, a_type, k, xb, a_type, k,
                     &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  // Copies a small host array to device memory for the next kernel,
  // through pinned staging (reset at each step's start). Pointers it
  // returned stay valid for the whole step: a full chunk is retired, not
  // freed, and a new one twice the step's usage so far takes over; retired
  // chunks are freed at the next step's start (after its synchronisation),
  // by when the current chunk holds a whole step of this size.
  template <class T>
  const T* upload(std::span<const T> host) {
    const size_t bytes = host.size_bytes();
    size_t at = (staged_ + 255) / 256 * 256;
    if (at + bytes > pinned_size_) {
      // A graph's copies read fixed staging addresses; a shape is captured
      // only after a direct step of it sized the staging (begin_graph).
      FERRY_CHECK(mode_ == Mode::Direct, "cuda", "staging grew inside a captured step");
      const size_t grown = std::max<size_t>(2 * (used_in_step_ + at + bytes), size_t{1} << 20);
      if (pinned_) retired_.push_back({pinned_, staging_dev_});
      used_in_step_ += at;
      pinned_ = nullptr;
      staging_dev_ = nullptr;
      pinned_size_ = 0;
      FERRY_CUDA_CHECK(cudaMallocHost(&pinned_, grown));
      staging_dev_ = device_alloc(grown);
      pinned_size_ = grown;
      at = 0;
    }
    uint8_t* h = static_cast<uint8_t*>(pinned_) + at;
    uint8_t* d = static_cast<uint8_t*>(staging_dev_) + at;
    if (bytes > 0) {
      std::memcpy(h, host.data(), bytes);
      if (!replaying())  // a replayed graph copies it
        FERRY_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
    }
    staged_ = at + bytes;
    return reinterpret_cast<const T*>(d);
  }

  // Whether this step's job lists can be built once and expanded per layer
  // (see kv_write): decided at the step's first kv_write or attention, which
  // also uploads the layers' plane shifts relative to shift_base_.
  bool layer_shifts(const kv::BatchKv& kv, std::span<const model::TokenPlace> places) {
    if (shifts_state_ != 0) return shifts_state_ > 0;
    shifts_state_ = -1;
    const kv::KvSpec& spec = kv.spec();
    if (places.empty() || kv.rows() == 0 || spec.layers.empty()) return false;
    for (const auto& l : spec.layers)
      if (l.window != 0 || !(l.k == spec.layers[0].k) || !(l.v == spec.layers[0].v)) return false;
    shift_base_ = 0;
    const size_t last_row = kv.rows() - 1;
    auto sides = [&](size_t layer, size_t row, kernels::KvSide& k, kernels::KvSide& v) {
      (void)kv.attention_task(layer, row, 0, &k, &v);
    };
    kernels::KvSide k0, v0, k0l, v0l;
    sides(0, 0, k0, v0);
    sides(0, last_row, k0l, v0l);
    shifts_.assign(spec.layers.size(), PlaneShift{});
    auto same_layout = [](const kernels::KvSide& a, const kernels::KvSide& b) {
      for (int p = 0; p < 3; ++p)
        if ((a.plane[p] == nullptr) != (b.plane[p] == nullptr) ||
            a.head_stride[p] != b.head_stride[p] || a.unit[p] != b.unit[p])
          return false;
      return a.format == b.format;
    };
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      kernels::KvSide k, v, kl, vl;
      sides(l, 0, k, v);
      sides(l, last_row, kl, vl);
      if (!same_layout(k, k0) || !same_layout(v, v0)) return false;
      for (int p = 0; p < 3; ++p) {
        if (!k0.plane[p]) continue;
        const int64_t dk = k.plane[p] - k0.plane[p], dv = v.plane[p] - v0.plane[p];
        // The same shift for the last row too: the layer is laid out as layer 0.
        if (kl.plane[p] - k0l.plane[p] != dk || vl.plane[p] - v0l.plane[p] != dv) return false;
        shifts_[l].k[p] = dk;
        shifts_[l].v[p] = dv;
      }
    }
    shifts_dev_ = upload(std::span<const PlaneShift>(shifts_));
    shifts_state_ = 1;
    return true;
  }

  // Every layer's copy of a step's job list (base: layer shift_base_'s,
  // uploaded), made on the device into buf: [layers][n] jobs.
  template <class Job>
  Job* expand_step(const Job* base, size_t n, Growable& buf) {
    auto* all = static_cast<Job*>(buf.get(shifts_.size() * n * sizeof(Job), stream_));
    if (!replaying()) {
      mark("expand_jobs");
      expand_jobs(base, n, shifts_dev_, shifts_.size(), all, stream_);
    }
    return all;
  }

  // --- CUDA graphs (one per step shape) ---
  enum class Mode { Direct, Capture, Replay };
  // Where the buffers a captured graph's nodes point into are now: a graph
  // replays only while they have not moved.
  using Buffers = std::array<const void*, 13>;
  Buffers buffers() const {
    return {arena_.ptr,   staging_dev_,         pinned_,
            xtc_.ptr,     xtc_out_.ptr,         xq_.ptr,
            attn_ws_.ptr, step_writes_buf_.ptr, step_jobs_buf_.ptr,
            dequant_.ptr, xconv_.ptr,           x8_.ptr,
            x8n_.ptr};
  }
  struct Graph {
    int direct_runs = 0;
    cudaGraphExec_t exec = nullptr;
    // The buffers the graph's nodes point into, as when it was captured.
    Buffers buffers{};
  };
  static constexpr size_t kMaxGraphs = 300, kMaxShapesSeen = 4096;

  bool replaying() const { return mode_ == Mode::Replay; }
  // At each op's start (ops run kernel by kernel): drops the bf16 copy of
  // the previous op's output (only a product reads it), and, when
  // profiling, records an event.
  void mark(const char* op) {
    bf16_copy_ = {};
    fp8_copy_ = {};
    profile_mark(op);
  }
  void profile_mark(const char* op) {
    flush_qkv();
    flush_rope();
    ++launch_seq_;
    if (profile_ && mode_ == Mode::Direct) profile_->mark(op);
  }

  // Called at a step's start with its activation sizes (its shape): replay
  // the shape's graph if its buffers are where they were, capture it on the
  // shape's second direct step (the first sized every buffer), else run
  // directly. cuBLAS products (fast mode) are captured too: their workspace
  // is ours and their kernel choice depends only on the shape.
  void begin_graph(std::span<const size_t> sizes) {
    mode_ = Mode::Direct;
    graph_ = nullptr;
    if (!opts_.graphs) return;
    key_.assign(sizes.begin(), sizes.end());
    auto it = graphs_.find(key_);
    if (it == graphs_.end()) {
      if (graphs_.size() >= kMaxShapesSeen) return;
      it = graphs_.emplace(key_, Graph{}).first;
    }
    Graph& g = it->second;
    const bool same_buffers = g.buffers == buffers();
    if (g.exec && same_buffers) {
      mode_ = Mode::Replay;
      graph_ = &g;
      return;
    }
    if (g.exec) {  // a buffer moved: capture again
      FERRY_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
      g.exec = nullptr;
      --n_graphs_;
    }
    if (g.direct_runs++ == 0 || n_graphs_ >= kMaxGraphs) return;
    FERRY_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    mode_ = Mode::Capture;
    graph_ = &g;
  }

  void abandon_graph() {
    if (mode_ == Mode::Capture) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
    }
    mode_ = Mode::Direct;
    graph_ = nullptr;
  }

  // Before the step's outputs are read: end a capture (and launch what it
  // recorded) or launch the replayed graph.
  void end_graph() {
    flush_qkv();
    flush_rope();
    if (mode_ == Mode::Capture) {
      cudaGraph_t graph = nullptr;
      FERRY_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      const cudaError_t e = cudaGraphInstantiate(&graph_->exec, graph, 0);
      cudaGraphDestroy(graph);
      FERRY_CUDA_CHECK(e);
      graph_->buffers = buffers();
      ++n_graphs_;
    }
    if (mode_ != Mode::Direct) FERRY_CUDA_CHECK(cudaGraphLaunch(graph_->exec, stream_));
    mode_ = Mode::Direct;
    graph_ = nullptr;
  }

  // The mean keys a job from which prompt chunks' attention stages each
  // tile once for a block of queries (attention above). A step replayed
  // from a graph keeps the choice of the step it was captured from (same
  // bits either way): with chunks of 512 that is a prompt's second chunk
  // (768 keys a job on average), which this bound lets share.
  static constexpr size_t kSharedAttentionDepth = 512;
  // What attention may do before its dependency wait (FERRY_CUDA_ATTN_EARLY:
  // "0" nothing, "stage" stage settled keys, else also fold them after
  // kv_store; AttentionFormats).
  enum class Early { Off, Stage, Fold } early_ = Early::Fold;
  // Ops launched (each mark, each held launch flushed), and the count when
  // the last kv_store was launched: equal while it is the last launch.
  uint64_t launch_seq_ = 0, store_seq_ = ~uint64_t{0};

  CudaOptions opts_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;
  std::shared_ptr<DeviceKvAllocator> kv_alloc_;
  std::vector<void*> owned_;  // weights and vectors
  Growable arena_, dequant_, xconv_, xtc_, xtc_out_, xq_, attn_ws_, select_, drawn_;
  Growable x8_;                   // --fp8: a call's activations as E4M3 codes, scales, bf16 acc
  Growable x8n_;                  // --fp8: a norm's output as E4M3 codes and scales (fp8_copy_)
  std::unique_ptr<Fp8Gemm> fp8_;  // --fp8: cuBLASLt's FP8 products
  bool dense_weights_ = false;    // a BF16/F16 weight was loaded
  Bf16Copy bf16_copy_;
  // Staging for uploads: pinned host memory and its device twin.
  void* pinned_ = nullptr;
  void* staging_dev_ = nullptr;
  size_t pinned_size_ = 0, staged_ = 0, used_in_step_ = 0;
  struct Chunk {
    void* pinned;
    void* dev;
  };
  std::vector<Chunk> retired_;  // chunks outgrown this step
  void release_retired() {
    for (const Chunk& c : retired_) {
      cudaFreeHost(c.pinned);
      cudaFree(c.dev);
    }
    retired_.clear();
  }
  std::vector<KvWrite> writes_;
  std::vector<AttentionJob> jobs_;
  std::vector<SelectJob> select_jobs_;
  std::vector<DrawJob> draw_jobs_;
  std::vector<model::DrawPenalty> draw_pens_;
  Mode mode_ = Mode::Direct;
  // This step's per-layer job lists (layer_shifts).
  int shifts_state_ = 0;  // 0: undecided, 1: expand, -1: per layer
  size_t shift_base_ = 0;
  std::vector<PlaneShift> shifts_;
  const PlaneShift* shifts_dev_ = nullptr;
  Growable step_writes_buf_, step_jobs_buf_;
  KvWrite* step_writes_ = nullptr;
  AttentionJob* step_jobs_ = nullptr;
  const float* step_jobs_q_ = nullptr;
  const float* step_jobs_out_ = nullptr;
  const uint16_t* step_jobs_bf16_ = nullptr;
  PendingRope pending_rope_;
  PendingQkv qkv_;
  // Knobs (docs/CUDA.md). Off: Q/K/V, rope and the KV write launched apart.
  const bool fuse_qkv_ = !knob_off("FERRY_CUDA_FUSE_QKV");
  // --fp8: steps of up to this many rows take ferry's FP8 mma kernel, more
  // take cuBLASLt's (0: every step above gemv_fp8's rows to cuBLASLt).
  const size_t fp8_mma_rows_ = knob_size("FERRY_CUDA_FP8_MMA_ROWS", kFp8MmaRows);
  // --fp8: decode steps of up to this many rows (at most kFp8GemvRows)
  // take gemv_fp8 (bf16 activations), larger ones the FP8 mma products.
  // 2: gemv_fp8 re-reads every activation row in each block, so from 3 rows
  // on matmul_fp8 is faster (session 45, H100: 8 streams decode 2.4x, 4
  // streams 1.25x, 2 streams the same as at 8; docs/BENCHMARKS.md).
  const size_t fp8_gemv_rows_ =
      std::min(knob_size("FERRY_CUDA_FP8_GEMV_ROWS", kFp8GemvDefaultRows), kFp8GemvRows);
  // --fp8: norms write their output's E4M3 codes (off: quantize launches).
  const bool fp8_codes_ = !knob_off("FERRY_CUDA_FP8_CODES");
  Fp8Copy fp8_copy_;
  std::unique_ptr<StepProfile> profile_;
  size_t n_tokens_ = 0;  // this step's token rows
  Graph* graph_ = nullptr;
  std::map<std::vector<size_t>, Graph> graphs_;
  std::vector<size_t> key_;
  size_t n_graphs_ = 0;
  // This step's positions on the device (rope of q and k share them).
  const int32_t* staged_pos_ = nullptr;
  const int32_t* staged_pos_host_ = nullptr;
  size_t staged_pos_n_ = 0;
  std::vector<uint32_t> select_count_;
  std::vector<float> lse_max_;
  std::vector<double> lse_sum_;
};

}  // namespace

std::unique_ptr<model::Backend> make_backend(const CudaOptions& opts) {
  return std::make_unique<CudaBackend>(opts);
}

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace ferry::cuda
