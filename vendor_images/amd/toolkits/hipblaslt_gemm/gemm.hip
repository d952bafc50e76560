// hipblaslt_gemm: one dense GEMM through hipBLASLt, timed with HIP events, for the vendor-toolkit base specs
// (the amd vendor's counterpart of nvidia's cublaslt_gemm; same arguments, same output line).
// D[M,N] = A[M,K] x B[K,N], "TN": A row-major, B column-major (op(A) = T on a KxM column-major matrix).
//
//   hipblaslt_gemm --precision bf16|fp16|int8|fp8e4m3|fp8e5m2 --m M --n N --k K [--warmup W] [--min-seconds S]
//                  [--min-iters I] [--pattern normal|uniform|zeros] [--fast-accum 0|1] [--workspace-mib MiB]
//
// FP8: MI300X/MI325X (gfx942) use the FNUZ encodings, MI355X (gfx950) the OCP ones; the device's architecture
// picks. Prints one JSON line on stdout; exit 0, 3 = no hipBLASLt kernel for this (unsupported), 2 = bad
// arguments, 1 = a HIP or hipBLASLt failure. UNTESTED ON AMD HARDWARE: compiled and run by no test here.

#include <hip/hip_runtime.h>
#include <hipblaslt/hipblaslt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static const int EXIT_UNSUPPORTED = 3;
static const int EXIT_USAGE = 2;

#define HIP_OK(call)                                                                              \
  do {                                                                                            \
    hipError_t err_ = (call);                                                                     \
    if (err_ != hipSuccess) {                                                                     \
      fprintf(stderr, "hipblaslt_gemm: %s: %s\n", #call, hipGetErrorString(err_));               \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

#define LT_OK(call)                                                                               \
  do {                                                                                            \
    hipblasStatus_t st_ = (call);                                                                 \
    if (st_ == HIPBLAS_STATUS_NOT_SUPPORTED || st_ == HIPBLAS_STATUS_ARCH_MISMATCH) {             \
      fprintf(stderr, "hipblaslt_gemm: unsupported: %s: status %d\n", #call, (int)st_);           \
      exit(EXIT_UNSUPPORTED);                                                                     \
    }                                                                                             \
    if (st_ != HIPBLAS_STATUS_SUCCESS) {                                                          \
      fprintf(stderr, "hipblaslt_gemm: %s: hipBLAS status %d\n", #call, (int)st_);               \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

struct Options {
  std::string precision, pattern = "normal";
  long m = 0, n = 0, k = 0, workspace_mib = 64;
  int warmup = 10, min_iters = 10, fast_accum = 0;
  double min_seconds = 1.0;
};

[[noreturn]] static void usage(const char* why) {
  fprintf(stderr, "hipblaslt_gemm: %s\n", why);
  exit(EXIT_USAGE);
}

static Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage("every option takes a value");
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--precision") o.precision = value;
    else if (key == "--pattern") o.pattern = value;
    else if (key == "--m") o.m = atol(value);
    else if (key == "--n") o.n = atol(value);
    else if (key == "--k") o.k = atol(value);
    else if (key == "--warmup") o.warmup = atoi(value);
    else if (key == "--min-iters") o.min_iters = atoi(value);
    else if (key == "--min-seconds") o.min_seconds = atof(value);
    else if (key == "--fast-accum") o.fast_accum = atoi(value);
    else if (key == "--workspace-mib") o.workspace_mib = atol(value);
    else usage(("unknown option " + key).c_str());
  }
  if (o.m <= 0 || o.n <= 0 || o.k <= 0) usage("--m, --n and --k must be positive");
  if (o.pattern != "normal" && o.pattern != "uniform" && o.pattern != "zeros")
    usage("--pattern must be normal, uniform or zeros");
  return o;
}

static double epoch_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Host-side operand bytes: small values, so that sums stay finite in every format.
static std::vector<uint8_t> operand(size_t count, size_t element, hipDataType type, const std::string& pattern,
                                    unsigned seed) {
  std::vector<uint8_t> bytes(count * element, 0);
  if (pattern == "zeros") return bytes;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) {
    const float x = pattern == "normal" ? normal(rng) : uniform(rng);
    if (type == HIP_R_16BF) {
      uint32_t bits;
      memcpy(&bits, &x, 4);
      const uint16_t top = (uint16_t)(bits >> 16);
      memcpy(&bytes[i * 2], &top, 2);
    } else if (type == HIP_R_16F) {
      const _Float16 h = (_Float16)x;
      memcpy(&bytes[i * 2], &h, 2);
    } else if (type == HIP_R_8I) {
      bytes[i] = (uint8_t)(int8_t)std::max(-8.0f, std::min(8.0f, std::round(4.0f * x)));
    } else {  // fp8 of any encoding: magnitudes below 1 (exponent field low), random sign; 0x80 is NaN in FNUZ
      uint8_t b = (uint8_t)((rng() & 0x3F) | (x < 0 ? 0x80 : 0));
      bytes[i] = b == 0x80 ? 0 : b;
    }
  }
  return bytes;
}

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int device = 0;
  hipDeviceProp_t prop;
  HIP_OK(hipGetDevice(&device));
  HIP_OK(hipGetDeviceProperties(&prop, device));
  const bool fnuz = strstr(prop.gcnArchName, "gfx94") != nullptr;  // MI300 series: FNUZ fp8

  hipDataType a_type, b_type, d_type, scale_type = HIP_R_32F;
  hipblasComputeType_t compute = HIPBLAS_COMPUTE_32F;
  size_t in_size = 1, out_size = 2;
  if (o.precision == "bf16") { a_type = b_type = d_type = HIP_R_16BF; in_size = 2; }
  else if (o.precision == "fp16") { a_type = b_type = d_type = HIP_R_16F; in_size = 2; }
  else if (o.precision == "int8") {
    a_type = b_type = HIP_R_8I; d_type = HIP_R_32I; out_size = 4;
    compute = HIPBLAS_COMPUTE_32I; scale_type = HIP_R_32I;
  } else if (o.precision == "fp8e4m3" || o.precision == "fp8e5m2") {
    const hipDataType e4m3 = fnuz ? HIP_R_8F_E4M3_FNUZ : HIP_R_8F_E4M3;
    const hipDataType e5m2 = fnuz ? HIP_R_8F_E5M2_FNUZ : HIP_R_8F_E5M2;
    a_type = o.precision == "fp8e4m3" ? e4m3 : e5m2;  // e5m2 as A only, B e4m3: the backward pass's mix
    b_type = e4m3;
    d_type = HIP_R_16BF;
  } else {
    usage("precision must be bf16, fp16, int8, fp8e4m3 or fp8e5m2");
  }
  const long m = o.m, n = o.n, k = o.k;

  void *A, *B, *D, *workspace;
  size_t workspace_bytes = (size_t)o.workspace_mib << 20;
  HIP_OK(hipMalloc(&A, (size_t)m * k * in_size));
  HIP_OK(hipMalloc(&B, (size_t)k * n * in_size));
  HIP_OK(hipMalloc(&D, (size_t)m * n * out_size));
  HIP_OK(hipMalloc(&workspace, workspace_bytes));
  const std::vector<uint8_t> a_host = operand((size_t)m * k, in_size, a_type, o.pattern, 1);
  const std::vector<uint8_t> b_host = operand((size_t)k * n, in_size, b_type, o.pattern, 2);
  HIP_OK(hipMemcpy(A, a_host.data(), a_host.size(), hipMemcpyHostToDevice));
  HIP_OK(hipMemcpy(B, b_host.data(), b_host.size(), hipMemcpyHostToDevice));
  HIP_OK(hipMemset(D, 0, (size_t)m * n * out_size));
  HIP_OK(hipDeviceSynchronize());

  hipblasLtHandle_t lt;
  LT_OK(hipblasLtCreate(&lt));
  hipblasLtMatmulDesc_t op;
  LT_OK(hipblasLtMatmulDescCreate(&op, compute, scale_type));
  hipblasOperation_t transa = HIPBLAS_OP_T, transb = HIPBLAS_OP_N;
  LT_OK(hipblasLtMatmulDescSetAttribute(op, HIPBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  LT_OK(hipblasLtMatmulDescSetAttribute(op, HIPBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  hipblasLtMatrixLayout_t a_desc, b_desc, d_desc;
  LT_OK(hipblasLtMatrixLayoutCreate(&a_desc, a_type, k, m, k));
  LT_OK(hipblasLtMatrixLayoutCreate(&b_desc, b_type, k, n, k));
  LT_OK(hipblasLtMatrixLayoutCreate(&d_desc, d_type, m, n, m));
  hipblasLtMatmulPreference_t pref;
  LT_OK(hipblasLtMatmulPreferenceCreate(&pref));
  LT_OK(hipblasLtMatmulPreferenceSetAttribute(pref, HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                              sizeof(workspace_bytes)));
  hipblasLtMatmulHeuristicResult_t heuristic[8];
  int returned = 0;
  LT_OK(hipblasLtMatmulAlgoGetHeuristic(lt, op, a_desc, b_desc, d_desc, d_desc, pref, 8, heuristic, &returned));
  if (returned == 0) {
    fprintf(stderr, "hipblaslt_gemm: unsupported: no hipBLASLt algorithm for %s %ldx%ldx%ld on %s\n",
            o.precision.c_str(), m, n, k, prop.gcnArchName);
    return EXIT_UNSUPPORTED;
  }

  float alpha_f = 1.0f, beta_f = 0.0f;
  int32_t alpha_i = 1, beta_i = 0;
  const bool integer = compute == HIPBLAS_COMPUTE_32I;
  const void* alpha = integer ? (const void*)&alpha_i : (const void*)&alpha_f;
  const void* beta = integer ? (const void*)&beta_i : (const void*)&beta_f;
  hipStream_t stream;
  HIP_OK(hipStreamCreate(&stream));
  auto step = [&]() {
    LT_OK(hipblasLtMatmul(lt, op, alpha, A, a_desc, B, b_desc, beta, D, d_desc, D, d_desc, &heuristic[0].algo,
                          workspace, workspace_bytes, stream));
  };

  for (int i = 0; i < o.warmup; ++i) step();
  HIP_OK(hipStreamSynchronize(stream));
  hipEvent_t start, stop;
  HIP_OK(hipEventCreate(&start));
  HIP_OK(hipEventCreate(&stop));
  float one_ms = 0;  // about 20 chunks in the minimum duration, as the engine's own timing loop
  HIP_OK(hipEventRecord(start, stream));
  step();
  HIP_OK(hipEventRecord(stop, stream));
  HIP_OK(hipEventSynchronize(stop));
  HIP_OK(hipEventElapsedTime(&one_ms, start, stop));
  long chunk_iters = std::max(1L, (long)(o.min_seconds / 20.0 / std::max(one_ms / 1e3, 1e-9)));

  std::vector<std::pair<long, double>> chunks;
  long total_iters = 0;
  double total_s = 0;
  const double window_start = epoch_now();
  while (total_s < o.min_seconds || total_iters < o.min_iters) {
    long iters = chunk_iters;
    if (total_s >= o.min_seconds) iters = std::max(1L, std::min(iters, (long)o.min_iters - total_iters));
    HIP_OK(hipEventRecord(start, stream));
    for (long i = 0; i < iters; ++i) step();
    HIP_OK(hipEventRecord(stop, stream));
    HIP_OK(hipEventSynchronize(stop));
    float ms = 0;
    HIP_OK(hipEventElapsedTime(&ms, start, stop));
    chunks.emplace_back(iters, ms / 1e3);
    total_iters += iters;
    total_s += ms / 1e3;
  }
  const double window_end = epoch_now();

  int runtime = 0;
  HIP_OK(hipRuntimeGetVersion(&runtime));
  printf("{\"program\": \"hipblaslt_gemm\", \"precision\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, "
         "\"pattern\": \"%s\", \"fast_accum\": %d, \"layout\": \"TN\", \"device\": \"%s\", \"arch\": \"%s\", "
         "\"fp8_encoding\": \"%s\", \"hip_runtime\": %d, \"algorithms_offered\": %d, \"workspace_bytes\": %zu, "
         "\"window\": [%.6f, %.6f], \"chunks\": [",
         o.precision.c_str(), m, n, k, o.pattern.c_str(), o.fast_accum, prop.name, prop.gcnArchName,
         fnuz ? "fnuz" : "ocp", runtime, returned, workspace_bytes, window_start, window_end);
  for (size_t i = 0; i < chunks.size(); ++i)
    printf("%s[%ld, %.9f]", i ? ", " : "", chunks[i].first, chunks[i].second);
  printf("]}\n");

  hipblasLtMatmulPreferenceDestroy(pref);
  hipblasLtMatrixLayoutDestroy(a_desc);
  hipblasLtMatrixLayoutDestroy(b_desc);
  hipblasLtMatrixLayoutDestroy(d_desc);
  hipblasLtMatmulDescDestroy(op);
  hipblasLtDestroy(lt);
  HIP_OK(hipFree(A));
  HIP_OK(hipFree(B));
  HIP_OK(hipFree(D));
  HIP_OK(hipFree(workspace));
  return 0;
}
