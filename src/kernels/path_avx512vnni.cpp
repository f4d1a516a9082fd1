// The AVX-512 int8 matmul built with VNNI (vpdpbusd). Only the int8 kernel:
// the rest of the AVX-512 path does not need VNNI. Compiled with
// -mavx512vnni (cmake/ferry_layer.cmake) and called only when the CPU has it.
#define FERRY_VEC_AVX512
#define FERRY_INT8_VNNI
#define FERRY_PATH_NAMESPACE avx512vnni
#include "kernels/int8_impl.h"

namespace ferry::kernels {
MatmulInt8Cols avx512vnni_matmul_int8_cols() {
  return &avx512vnni::int8::matmul_cols;
}
}  // namespace ferry::kernels
