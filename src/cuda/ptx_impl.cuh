// Internal to src/cuda: inline-PTX wrappers shared by the tensor-core
// kernels (matmul_tc.cu, matmul_q8.cu) and attention.cu; sm_80 and newer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ferry::cuda::detail {

// 16 bytes global -> shared; zero-filled (nothing read) when !ok.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0));
}
// N = 4, 8 or 16 bytes global -> shared, through L1 (both addresses N-aligned).
template <int N>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(N));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::);
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                        uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// ldsm_x4 transposed: thread (g, c) of matrix i gets its elements
// (rows 2c, 2c + 1, column g), the B fragment of a row-major [k][n] tile.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                              uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d += A B for one m16n8k16 tile: a = A fragment (rows g / g+8, k pairs),
// b = B fragment (k pairs, column g); d[0..1] = (g, 2c..2c+1),
// d[2..3] = (g + 8, 2c..2c+1), g = lane / 4, c = lane % 4.
// (One instruction for both 16-bit operand types: TYPE is "bf16" or "f16".)
#define FERRY_MMA_M16N8K16(TYPE)                                              \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE         \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  FERRY_MMA_M16N8K16("bf16");
}

// mma_bf16 with f16 operands.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  FERRY_MMA_M16N8K16("f16");
}
#undef FERRY_MMA_M16N8K16

// d += A B for int8 codes (exact int32 sums), d's layout as for bf16:
// d[0..1] = (row g, columns 2c, 2c+1), d[2..3] = (g + 8, ...), g = lane / 4,
// c = lane % 4. m16n8k32: a[0] = A[g][4c..4c+3], a[1] = A[g+8][4c..],
// a[2] = A[g][16+4c..], a[3] = A[g+8][16+4c..]; b[0] = B[4c..4c+3][g],
// b[1] = B[16+4c..][g]. m16n8k16: a[0], a[1] and b[0] only.
__device__ __forceinline__ void mma_s8_k32(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_s8_k16(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// ---- Hopper (sm_90a) warpgroup mma --------------------------------------------
// Compiled only into the sm_90a image (__CUDA_ARCH_FEAT_SM90_ALL); callers
// check wgmma_available() (matmul_tc) before launching kernels that use
// them. Other images get empty bodies, never run.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FERRY_SM90A 1
#else
#define FERRY_SM90A 0
#endif

// Shared-memory matrix descriptor for a K-major operand stored as rows of
// 128 bytes (64 bf16 of k) with the 128-byte swizzle (16-byte chunk c of row
// r at chunk c ^ (r % 8)) and the 8-row groups 1024 bytes apart. `addr` is
// the shared address of the k16 step's first chunk in row 0: the tile's
// 1024-aligned base plus 32 bytes per k16 step.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return (uint64_t{1} << 62) |          // 128-byte swizzle
         (uint64_t{1024 >> 4} << 32) |  // stride: 8 rows of 128 bytes
         (uint64_t{1} << 16) |          // leading offset (unused when swizzled)
         static_cast<uint64_t>((addr & 0x3ffffu) >> 4);
}
__device__ __forceinline__ void wgmma_fence() {
#if FERRY_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FERRY_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if FERRY_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Pins accumulator registers in place (an empty asm that reads and writes
// them): keeps the compiler from moving their definitions (zeroing, copies
// at loop edges) into a wgmma group's flight, which makes ptxas serialize
// every wgmma of the kernel.
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Transaction barriers and tensor-memory-access copies (sm_90a): an mbarrier
// at a shared address, 8-byte aligned; the tensor map a kernel parameter
// (__grid_constant__), read through its generic address.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if FERRY_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes the barriers' initialisation visible to the async proxy (the copies).
__device__ __forceinline__ void mbar_init_fence() {
#if FERRY_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also expects `bytes` more of copies to land.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if FERRY_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// An arrival where `pred` holds, as a predicated instruction (no branch:
// the wgmma pipeline around it stays convergent).
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool pred) {
#if FERRY_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "}\n" ::"r"(bar),
      "r"(static_cast<uint32_t>(pred))
      : "memory");
#endif
}
// An arrival on `bar` once every cp.async this thread issued before it has
// landed (.noinc: the barrier's expected count includes these arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
#if FERRY_SM90A
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if FERRY_SM90A
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// The box at (c0 inner, c1 outer) of a 2-D tensor map into shared memory
// at dst, completing `bar`'s transaction bytes (out-of-range elements are
// zeros and count too).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1,
                                            uint32_t bar) {
#if FERRY_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// A barrier over the first n_threads threads (whole warps) of the block.
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t n_threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n_threads) : "memory");
}

// d += A B^T for one k16 step of a warpgroup: A = 64 rows (m) x 16 k at
// descriptor a, B = N rows (n) x 16 k at descriptor b, both K-major; f32
// accumulators, scale-d = 1 (so d = +0 initially gives the mma.sync chain's
// first step exactly). Warp w of the warpgroup holds rows 16w + g and
// 16w + g + 8 (g = lane / 4): d[4i + 0..1] = (16w + g, 8i + 2c + 0..1),
// d[4i + 2..3] = (16w + g + 8, ...), c = lane % 4: per n8 slice, mma.sync's
// m16n8 accumulator layout.
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], uint64_t a, uint64_t b);
// The same for E4M3 codes (k32 a step, both operands K-major in 128-byte
// swizzled rows of 128 codes; f32 accumulators in wgmma_bf16's layout):
// d = A B when `accumulate` is 0, else d += A B. Hopper's tensor cores add
// FP8 products at reduced precision inside a chain of steps, so callers
// start short chains from zero and add them up in f32 themselves.
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], uint64_t a, uint64_t b,
                                           uint32_t accumulate);

#if FERRY_SM90A
#define FERRY_WG_D8(i)                                                                      \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : FERRY_WG_D8(0), FERRY_WG_D8(8), FERRY_WG_D8(16), FERRY_WG_D8(24)
      : "l"(a), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : FERRY_WG_D8(0), FERRY_WG_D8(8), FERRY_WG_D8(16), FERRY_WG_D8(24), FERRY_WG_D8(32),
        FERRY_WG_D8(40), FERRY_WG_D8(48), FERRY_WG_D8(56)
      : "l"(a), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<256>(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127}, "
      "%128, %129, p, 1, 1, 0, 0;\n}\n"
      : FERRY_WG_D8(0), FERRY_WG_D8(8), FERRY_WG_D8(16), FERRY_WG_D8(24), FERRY_WG_D8(32),
        FERRY_WG_D8(40), FERRY_WG_D8(48), FERRY_WG_D8(56), FERRY_WG_D8(64), FERRY_WG_D8(72),
        FERRY_WG_D8(80), FERRY_WG_D8(88), FERRY_WG_D8(96), FERRY_WG_D8(104), FERRY_WG_D8(112),
        FERRY_WG_D8(120)
      : "l"(a), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t a, uint64_t b,
                                               uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1;\n}\n"
      : FERRY_WG_D8(0), FERRY_WG_D8(8)
      : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t a, uint64_t b,
                                               uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : FERRY_WG_D8(0), FERRY_WG_D8(8), FERRY_WG_D8(16), FERRY_WG_D8(24)
      : "l"(a), "l"(b), "r"(accumulate));
}
#undef FERRY_WG_D8
#else
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&)[N / 2], uint64_t, uint64_t) {}
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&)[N / 2], uint64_t, uint64_t, uint32_t) {}
#endif

}  // namespace ferry::cuda::detail
