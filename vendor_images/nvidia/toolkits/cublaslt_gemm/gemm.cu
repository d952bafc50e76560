// cublaslt_gemm: one dense GEMM through cuBLASLt, timed with CUDA events, for FlagPerf's vendor-toolkit base
// specs. D[M,N] = A[M,K] x B[K,N] in the "TN" layout cuBLASLt's int8 and fp8 kernels require (A row-major,
// B column-major; in cuBLAS's column-major terms: op(A) = T on a KxM matrix, op(B) = N on a KxN one).
//
//   cublaslt_gemm --precision bf16|fp16|int8|fp8e4m3|fp8e5m2 --m M --n N --k K [--warmup W] [--min-seconds S]
//                 [--min-iters I] [--pattern normal|uniform|zeros] [--fast-accum 0|1] [--workspace-mib MiB]
//
// Prints one JSON line on stdout: the shape, the library and device, and every timed chunk [iterations,
// seconds] with the wall-clock window of the timed region. Exit 0; 3 = cuBLASLt has no kernel for this
// (unsupported); 2 = bad arguments; 1 = a CUDA or cuBLAS failure. Messages go to stderr.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static const int EXIT_UNSUPPORTED = 3;
static const int EXIT_USAGE = 2;

#define CUDA_OK(call)                                                                          \
  do {                                                                                         \
    cudaError_t err_ = (call);                                                                 \
    if (err_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "cublaslt_gemm: %s: %s\n", #call, cudaGetErrorString(err_));            \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define LT_OK(call)                                                                            \
  do {                                                                                         \
    cublasStatus_t st_ = (call);                                                               \
    if (st_ == CUBLAS_STATUS_NOT_SUPPORTED || st_ == CUBLAS_STATUS_ARCH_MISMATCH) {            \
      fprintf(stderr, "cublaslt_gemm: unsupported: %s: status %d\n", #call, (int)st_);         \
      exit(EXIT_UNSUPPORTED);                                                                  \
    }                                                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      fprintf(stderr, "cublaslt_gemm: %s: cuBLAS status %d\n", #call, (int)st_);              \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

enum Pattern { NORMAL, UNIFORM, ZEROS };

// Counter-based random numbers: the same operands on every run and every GPU, with no curand dependency.
__device__ float uniform01(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27; x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (float)(x >> 40) * (1.0f / 16777216.0f);
}

__device__ float value(uint64_t i, uint64_t seed, int pattern) {
  if (pattern == UNIFORM) return uniform01(i, seed) * 2.0f - 1.0f;
  float u1 = fmaxf(uniform01(2 * i, seed), 1e-7f), u2 = uniform01(2 * i + 1, seed);  // Box-Muller
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

template <typename T> __device__ T convert(float v);
template <> __device__ __nv_bfloat16 convert(float v) { return __float2bfloat16(v); }
template <> __device__ __half convert(float v) { return __float2half(v); }
template <> __device__ __nv_fp8_e4m3 convert(float v) { return __nv_fp8_e4m3(v); }
template <> __device__ __nv_fp8_e5m2 convert(float v) { return __nv_fp8_e5m2(v); }

template <typename T>
__global__ void fill(T* out, uint64_t count, uint64_t seed, int pattern) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x)
    out[i] = convert<T>(value(i, seed, pattern));
}

__global__ void fill_int8(int8_t* out, uint64_t count, uint64_t seed, int pattern) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x) {
    float v = pattern == UNIFORM ? floorf(uniform01(i, seed) * 256.0f) - 128.0f  // the whole range
                                 : fminf(fmaxf(rintf(value(i, seed, NORMAL) * 16.0f), -128.0f), 127.0f);
    out[i] = (int8_t)v;
  }
}

struct Args {
  std::string precision = "bf16", pattern = "normal";
  long m = 8192, n = 8192, k = 8192;
  int warmup = 10, min_iters = 10, fast_accum = 0;
  double min_seconds = 5.0;
  long workspace_mib = 64;
};

static void usage(const char* why) {
  fprintf(stderr, "cublaslt_gemm: %s\n", why);
  exit(EXIT_USAGE);
}

static Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage("every option takes a value");
    std::string key = argv[i];
    const char* v = argv[i + 1];
    if (key == "--precision") a.precision = v;
    else if (key == "--pattern") a.pattern = v;
    else if (key == "--m") a.m = atol(v);
    else if (key == "--n") a.n = atol(v);
    else if (key == "--k") a.k = atol(v);
    else if (key == "--warmup") a.warmup = atoi(v);
    else if (key == "--min-iters") a.min_iters = atoi(v);
    else if (key == "--min-seconds") a.min_seconds = atof(v);
    else if (key == "--fast-accum") a.fast_accum = atoi(v);
    else if (key == "--workspace-mib") a.workspace_mib = atol(v);
    else usage(("unknown option " + key).c_str());
  }
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.min_iters < 1 || a.warmup < 0 || a.min_seconds <= 0)
    usage("m, n, k, min-iters and min-seconds must be positive");
  if (a.pattern != "normal" && a.pattern != "uniform" && a.pattern != "zeros") usage("unknown pattern");
  return a;
}

static double epoch_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  cudaDataType_t a_type, b_type, cd_type, scale_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  size_t in_size = 1, out_size = 2;
  if (args.precision == "bf16") { a_type = b_type = cd_type = CUDA_R_16BF; in_size = 2; }
  else if (args.precision == "fp16") { a_type = b_type = cd_type = CUDA_R_16F; in_size = 2; }
  else if (args.precision == "int8") {
    a_type = b_type = CUDA_R_8I; cd_type = CUDA_R_32I; out_size = 4;
    compute = CUBLAS_COMPUTE_32I; scale_type = CUDA_R_32I;
  } else if (args.precision == "fp8e4m3" || args.precision == "fp8e5m2") {
    // e5m2 x e5m2 has no cuBLASLt kernel: e5m2 is A's format, B stays e4m3 (the backward pass's mix).
    a_type = args.precision == "fp8e4m3" ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    b_type = CUDA_R_8F_E4M3; cd_type = CUDA_R_16BF;
  } else {
    usage("precision must be bf16, fp16, int8, fp8e4m3 or fp8e5m2");
  }
  const long m = args.m, n = args.n, k = args.k;
  int pattern = args.pattern == "normal" ? NORMAL : args.pattern == "uniform" ? UNIFORM : ZEROS;

  int device = 0;
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));

  void *A, *B, *D, *workspace;
  size_t workspace_bytes = (size_t)args.workspace_mib << 20;
  CUDA_OK(cudaMalloc(&A, (size_t)m * k * in_size));
  CUDA_OK(cudaMalloc(&B, (size_t)k * n * in_size));
  CUDA_OK(cudaMalloc(&D, (size_t)m * n * out_size));
  CUDA_OK(cudaMalloc(&workspace, workspace_bytes));
  if (pattern == ZEROS) {
    CUDA_OK(cudaMemset(A, 0, (size_t)m * k * in_size));
    CUDA_OK(cudaMemset(B, 0, (size_t)k * n * in_size));
  } else {
    const int blocks = 4096, threads = 256;
    void* operands[2] = {A, B};
    cudaDataType_t types[2] = {a_type, b_type};
    uint64_t counts[2] = {(uint64_t)m * k, (uint64_t)k * n};
    for (int i = 0; i < 2; ++i) {
      switch (types[i]) {
        case CUDA_R_16BF: fill<<<blocks, threads>>>((__nv_bfloat16*)operands[i], counts[i], i, pattern); break;
        case CUDA_R_16F: fill<<<blocks, threads>>>((__half*)operands[i], counts[i], i, pattern); break;
        case CUDA_R_8F_E4M3: fill<<<blocks, threads>>>((__nv_fp8_e4m3*)operands[i], counts[i], i, pattern); break;
        case CUDA_R_8F_E5M2: fill<<<blocks, threads>>>((__nv_fp8_e5m2*)operands[i], counts[i], i, pattern); break;
        default: fill_int8<<<blocks, threads>>>((int8_t*)operands[i], counts[i], i, pattern); break;
      }
      CUDA_OK(cudaGetLastError());
    }
  }
  CUDA_OK(cudaMemset(D, 0, (size_t)m * n * out_size));
  CUDA_OK(cudaDeviceSynchronize());

  cublasLtHandle_t lt;
  LT_OK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  LT_OK(cublasLtMatmulDescCreate(&op, compute, scale_type));
  cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (args.precision.rfind("fp8", 0) == 0) {
    int8_t fast = args.fast_accum ? 1 : 0;  // scale pointers left NULL: cuBLASLt takes them as 1
    LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  cublasLtMatrixLayout_t a_desc, b_desc, d_desc;
  LT_OK(cublasLtMatrixLayoutCreate(&a_desc, a_type, k, m, k));  // row-major [M, K] = column-major K x M
  LT_OK(cublasLtMatrixLayoutCreate(&b_desc, b_type, k, n, k));  // column-major [K, N]
  LT_OK(cublasLtMatrixLayoutCreate(&d_desc, cd_type, m, n, m));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                             sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic[8];
  int returned = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, a_desc, b_desc, d_desc, d_desc, pref, 8, heuristic, &returned));
  if (returned == 0) {
    fprintf(stderr, "cublaslt_gemm: unsupported: no cuBLASLt algorithm for %s %ldx%ldx%ld on %s\n",
            args.precision.c_str(), m, n, k, prop.name);
    return EXIT_UNSUPPORTED;
  }

  float alpha_f = 1.0f, beta_f = 0.0f;
  int32_t alpha_i = 1, beta_i = 0;
  const void* alpha = compute == CUBLAS_COMPUTE_32I ? (const void*)&alpha_i : (const void*)&alpha_f;
  const void* beta = compute == CUBLAS_COMPUTE_32I ? (const void*)&beta_i : (const void*)&beta_f;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  auto step = [&]() {
    LT_OK(cublasLtMatmul(lt, op, alpha, A, a_desc, B, b_desc, beta, D, d_desc, D, d_desc, &heuristic[0].algo,
                         workspace, workspace_bytes, stream));
  };

  for (int i = 0; i < args.warmup; ++i) step();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  float one_ms = 0;  // calibrate: about 20 chunks in the minimum duration, as the engine's own timing loop
  CUDA_OK(cudaEventRecord(start, stream));
  step();
  CUDA_OK(cudaEventRecord(stop, stream));
  CUDA_OK(cudaEventSynchronize(stop));
  CUDA_OK(cudaEventElapsedTime(&one_ms, start, stop));
  long chunk_iters = (long)(args.min_seconds / 20.0 / fmax(one_ms / 1e3, 1e-9));
  if (chunk_iters < 1) chunk_iters = 1;

  std::vector<std::pair<long, double>> chunks;
  long total_iters = 0;
  double total_s = 0;
  double window_start = epoch_now();
  while (total_s < args.min_seconds || total_iters < args.min_iters) {
    long iters = chunk_iters;
    if (total_s >= args.min_seconds) iters = std::max(1L, std::min(iters, (long)args.min_iters - total_iters));
    CUDA_OK(cudaEventRecord(start, stream));
    for (long i = 0; i < iters; ++i) step();
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    chunks.emplace_back(iters, ms / 1e3);
    total_iters += iters;
    total_s += ms / 1e3;
  }
  double window_end = epoch_now();

  printf("{\"program\": \"cublaslt_gemm\", \"precision\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, "
         "\"pattern\": \"%s\", \"fast_accum\": %d, \"layout\": \"TN\", \"device\": \"%s\", "
         "\"compute_capability\": \"%d.%d\", \"cuda_runtime\": %d, \"cublaslt_version\": %zu, "
         "\"algorithms_offered\": %d, \"workspace_bytes\": %zu, \"window\": [%.6f, %.6f], \"chunks\": [",
         args.precision.c_str(), m, n, k, args.pattern.c_str(), args.fast_accum, prop.name, prop.major, prop.minor,
         runtime, cublasLtGetVersion(), returned, workspace_bytes, window_start, window_end);
  for (size_t i = 0; i < chunks.size(); ++i)
    printf("%s[%ld, %.9f]", i ? ", " : "", chunks[i].first, chunks[i].second);
  printf("]}\n");

  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a_desc);
  cublasLtMatrixLayoutDestroy(b_desc);
  cublasLtMatrixLayoutDestroy(d_desc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(workspace);
  return 0;
}
